"""Probe-batch log-prob parity tolerances per (learner recipe, sampler recipe) pair.

Data for :func:`experiments.mxfp8_rl.weight_sync.check_logprob_parity`: how far the sampler's
log-probs of a fixed probe batch may be from the learner's right after a correct sync.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple


class Tolerance(NamedTuple):
  """Largest accepted probe-batch ``k3`` KL and ``max |learner - sampler logp|``."""

  k3: float
  max_abs_delta_logp: float


# (learner recipe, sampler recipe) -> Tolerance.
#   same recipe on both sides: exact. The served export of an fp32 master under the
#     learner's own recipe gives identical logits; the gate only absorbs reordering
#     noise. A bf16 sampler one SGD step stale already gives k3 ~3e-3.
#   fp32 <-> bf16: measured on the tiny DecoderLM of tests/numerics/rl/test_weight_sync.py
#     (vocab 16, d_model 48, 1 layer, random init; 16 init seeds x 4 probe batches): worst
#     k3 8.1e-6 and max|dlogp| 0.0138; the tolerance is about 6x and 3.5x that, rounded.
#     Not calibrated on a trained model: re-measure before relying on it.
#   MXFP8 <-> fp32 or bf16: calibrated on trained models. The mxfp8_rl sweeps
#     (experiments/mxfp8_rl/report*, 3-digit addition, 2 layers x d_model 64, trained)
#     recorded the probe statistics at every sync of their clean runs. The cross-recipe
#     pairs reached k3 0.237 and max|dlogp| 6.31, against 8.4e-4 and 0.149 on the random
#     test-sized model these entries used before. The gates are the faults sweep's rule
#     (2 x the largest clean value, rounded up to one significant digit) over both
#     sweeps' clean syncs.
#     At these gates the cross-recipe parity check caught none of the 28 planted faults
#     on the bf16-learner / mxfp8-sampler pair. The bitwise check caught all of them at
#     the sync they were planted. So the cross-recipe parity check flags gross failures
#     only.
_EXACT = Tolerance(k3=1e-10, max_abs_delta_logp=1e-5)
_BF16_FP32 = Tolerance(k3=5e-5, max_abs_delta_logp=0.05)
_MXFP8_CROSS = Tolerance(k3=0.5, max_abs_delta_logp=20.0)
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
