"""Macro-block scaling (MBS): a float32 scale per large block above the MX block scales.

ALTO's MBS ablation puts a second level of scaling over MXFP4: 128x128 macro tiles on
weights and 1x128 macro blocks on activations. The paper gives no formula; we use the
natural one (marked [INFER] in ``papers.md``): each macro block is divided by
``S = amax(macro block) / fmt.max`` so its largest value lands exactly on the element
format's max, quantized with the usual MX scales, then multiplied back by ``S``. The
result is not bf16-exact (S is an arbitrary float32), so recipes with macro blocks
multiply in float32. A zero or non-finite macro block keeps ``S = 1``.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from lowprec.numerics import blockscale


def macro_block_scales(x: jax.Array, fmt_max: float, *,
                       block_shape: int | Sequence[int] | None = None,
                       axis: int | Sequence[int] | None = None, pad: bool = False
                       ) -> jax.Array:
  """float32 ``S`` per element (x's shape): ``amax(macro block) / fmt_max`` (1 at 0)."""
  if not fmt_max > 0:
    raise ValueError(f"fmt_max must be > 0, got {fmt_max}")
  bits = blockscale.block_amax_bits(jnp.asarray(x).astype(jnp.float32),
                                   block_shape=block_shape, axis=axis, pad=pad,
                                   finite_only=True)
  amax = lax.bitcast_convert_type(bits, jnp.float32)
  return jnp.where(amax > 0, amax / fmt_max, 1.0).astype(jnp.float32)
