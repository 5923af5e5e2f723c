"""Probe-batch log-prob parity tolerances per (learner recipe, sampler recipe) pair.

Data for :func:`numerics.rl.weight_sync.check_logprob_parity`: how far the sampler's
log-probs of a fixed probe batch may be from the learner's right after a correct sync.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple


class Tolerance(NamedTuple):
  """Largest accepted probe-batch ``k3`` KL and ``max |learner - sampler logp|``."""

  k3: float
  max_abs_delta_logp: float


# (learner recipe, sampler recipe) -> Tolerance. Measured on the tiny DecoderLM of
# tests/numerics/rl/test_weight_sync.py (vocab 16, d_model 48, 4 heads, d_ff 96, 1 layer,
# random init; projections in the recipe, attention products in bf16 and the head kept
# in bf16 except under fp32; embeddings and norms served in fp32; the MXFP8 sampler
# serves served_mx_weight kernels): the worst k3 and max|dlogp| over 16 init seeds x 4
# probe batches of 8 x 12 tokens (last 8 scored) were
#   fp32 <-> bf16:             k3 8.1e-6, max|dlogp| 0.0138 (median k3 5.6e-6)
#   fp32 or bf16 <-> mxfp8:    k3 8.4e-4, max|dlogp| 0.149  (median k3 5.5e-4)
#   same recipe on both sides: exactly 0 (the served export of an fp32 master under
#                              the learner's own recipe gives identical logits)
# (the same within 25% with flax's own init), and the tolerances below are about 6x (k3)
# and 3.5x (max|dlogp|) the worst, rounded. The same-recipe tolerance only absorbs
# reordering noise (a bf16 sampler one SGD step stale already gives k3 ~3e-3). Numbers
# for a trained or larger model differ: re-measure before relying on them.
_EXACT = Tolerance(k3=1e-10, max_abs_delta_logp=1e-5)
_BF16_FP32 = Tolerance(k3=5e-5, max_abs_delta_logp=0.05)
_MXFP8_CROSS = Tolerance(k3=5e-3, max_abs_delta_logp=0.5)
PARITY_TOLERANCES: Mapping[tuple[str, str], Tolerance] = {
    ("fp32", "fp32"): _EXACT,
    ("bf16", "bf16"): _EXACT,
    ("mxfp8", "mxfp8"): _EXACT,
    ("fp32", "bf16"): _BF16_FP32,
    ("bf16", "fp32"): _BF16_FP32,
    ("fp32", "mxfp8"): _MXFP8_CROSS,
    ("mxfp8", "fp32"): _MXFP8_CROSS,
    ("bf16", "mxfp8"): _MXFP8_CROSS,
    ("mxfp8", "bf16"): _MXFP8_CROSS,
}
