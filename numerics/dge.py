"""Differential gradient estimation (DGE): a smooth surrogate derivative of a quantizer.

ALTO §3.5 (after TetraJet): instead of the straight-through estimator, the weight
gradient is multiplied by the derivative of a surrogate that is steep at the centre of
each quantization bin and flat at its edges. For a bin ``[lo, hi]`` of the element grid
with width ``delta = hi - lo`` and midpoint ``m``, and ``v`` the weight in the grid's
units (``w / 2^s`` with ``s`` its MX block exponent)::

    f(v)  = (delta/2)^(1 - 1/k) * sgn(v - m) * |v - m|^(1/k) + m
    f'(v) = (1/k) * (delta/2)^(1 - 1/k) * |v - m|^(1/k - 1),  clamped to [0, clamp]

``f'`` is dimensionless, so it applies unchanged to ``w`` itself: ``dW <- dW * f'(W)``.
At a bin edge ``f' = 1/k``; at the centre it diverges and the clamp (3 in ALTO) holds
it. Values past the format's max (saturated) use the last bin, so ``f'`` < 1/k there.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lowprec.numerics import blockscale
from lowprec.numerics import encoding
from lowprec.numerics import float_bits
from lowprec.numerics import formats as formats_lib
from lowprec.numerics import quantizer


def _magnitude_grid(fmt: formats_lib.Format) -> np.ndarray:
  vals = encoding.decode_table(fmt.name).astype(np.float64)
  vals = vals[np.isfinite(vals) & (vals >= 0) & (vals <= fmt.max)]
  return np.unique(vals).astype(np.float32)


def surrogate_derivative(w: jax.Array, spec: quantizer.QuantSpec, k: int = 5,
                         clamp: float = 3.0) -> jax.Array:
  """``f'(w)`` (float32, w's shape) for the MX quantizer ``spec`` (see module doc).

  Args:
    w: float weights.
    spec: an MX block quantizer over a float element format (its layout and scale
      rule define each element's bin; rounding is irrelevant).
    k: the surrogate's root order (ALTO: 5); >= 1 (k = 1 gives f' = 1, the STE).
    clamp: upper bound of f' (> 0).
  """
  if spec.is_cast or spec.fmt == "nvfp4":
    raise ValueError(f"DGE needs an MX block quantizer, got {spec}")
  f = formats_lib.get(spec.fmt)
  if f.kind != "float":
    raise ValueError(f"DGE needs a float element format, got {f.name!r}")
  if not isinstance(k, (int, np.integer)) or k < 1:
    raise ValueError(f"k must be a positive int, got {k!r}")
  if not clamp > 0:
    raise ValueError(f"clamp must be > 0, got {clamp}")
  w = jnp.asarray(w).astype(jnp.float32)
  s = blockscale.mx_grid_exponents(w, f, block_shape=spec.block_shape, axis=spec.axis,
                                   scale_rule=spec.scale_rule, pad=spec.pad)
  # |w| / 2^s by exponent arithmetic (float division would flush tiny values on CPU).
  bits = jax.lax.bitcast_convert_type(w, jnp.uint32) & np.uint32(0x7FFFFFFF)
  v = jax.lax.bitcast_convert_type(float_bits.ldexp_bits(bits, -s), jnp.float32)
  grid = jnp.asarray(_magnitude_grid(f))
  idx = jnp.clip(jnp.searchsorted(grid, v, side="right") - 1, 0, grid.size - 2)
  lo, hi = grid[idx], grid[idx + 1]
  half = 0.5 * (hi - lo)
  dist = jnp.abs(v - 0.5 * (lo + hi))
  with jax.numpy_dtype_promotion("standard"):
    deriv = (1.0 / k) * half ** (1.0 - 1.0 / k) * dist ** (1.0 / k - 1.0)
  deriv = jnp.where(dist == 0, np.float32(clamp), deriv)
  return jnp.clip(deriv, 0.0, clamp).astype(jnp.float32)
