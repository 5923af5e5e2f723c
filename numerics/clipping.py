"""Dynamic per-block clipping before MX quantization (QuEST-style, ALTO's negative result).

QuEST (Panferov et al., 2025) clips each group at a multiple of its root-mean-square
before quantizing, the MSE-optimal clip for Gaussian data at 4 bits; ALTO tried it on
MXFP4 as ``m = (2.922 / 6) * std(block)`` (a scale that maps ``2.922 * std`` to E2M1's
max 6). Here the block is clipped at ``ratio * rms(block)`` and then quantized with the
recipe's MX scale rule, so the clipped amax sets the E8M0 scale. We use the RMS (equal
to the std for zero-mean blocks) so a constant block is not clipped to zero.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

from lowprec.numerics import blockscale

QUEST_RATIO = 2.922


def _block_rms(values, valid, axes):
  sq = jnp.where(valid, values * values, 0.0)
  n = jnp.maximum(jnp.sum(valid, axis=axes, keepdims=True), 1)
  return jnp.sqrt(jnp.sum(sq, axis=axes, keepdims=True) / n)


def clip_to_block_rms(x: jax.Array, *, ratio: float = QUEST_RATIO,
                      block_shape: int | Sequence[int] | None = None,
                      axis: int | Sequence[int] | None = None, pad: bool = False
                      ) -> jax.Array:
  """float32 ``clip(x, -c, c)`` with ``c = ratio * rms`` of each element's block.

  Blocks as in :func:`numerics.blockscale.quantize_mx` (padding does not count
  towards the RMS). NaN/Inf propagate (the quantizer then poisons the block).
  """
  if not ratio > 0:
    raise ValueError(f"ratio must be > 0, got {ratio}")
  x = jnp.asarray(x).astype(jnp.float32)
  c = ratio * blockscale.block_statistic(x, _block_rms, block_shape=block_shape, axis=axis,
                                         pad=pad)
  return jnp.where(jnp.isfinite(x), jnp.clip(x, -c, c), x)
