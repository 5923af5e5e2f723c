"""NVFP4's torchao convention: ``NVFP4Tensor.to_nvfp4`` with a per-tensor scale.

``per_tensor_scale = amax / (448*6)``, ``s = clamp((block_amax / 6) /
per_tensor_scale, 2^-6, 448)`` rounded to E4M3, elements
``e2m1(clamp(x * ((1 / per_tensor_scale) / s), -6, 6))``, decode
``x = e2m1 * (per_tensor_scale * s)``. The block scale is floored at E4M3's smallest
*normal* value (torchao's ``E4M3_EPS``), reciprocals are formed separately, and the
decode multiplies by a rounded product of the two scales. Where torchao's formula
divides by zero (an all-zero tensor) we use ``per_tensor_scale = 1``.

It agrees with the ``te`` convention (:mod:`numerics.nvfp4_te`) wherever a block's TE
scale is a normal E4M3 value and the reciprocal chains round alike; they differ on
blocks whose amax is below about ``2^-6 * 6 / 448`` of the tensor amax (TE: a subnormal
or zero scale, coarse or flushed elements; torchao: scale 2^-6, finer elements) and by
one rounding elsewhere (a 1-ulp difference in the element's scaled value that can cross
an E2M1 rounding boundary, and the decode). On N(0, 1) data with rare large outliers
they disagree on a few percent of the elements (``tests/numerics/test_blockscale.py``
measures it). Runs on the jnp path only (no Pallas kernel).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.numerics import block_layout
from lowprec.numerics import encoding
from lowprec.numerics import float_bits
from lowprec.numerics import formats as formats_lib
from lowprec.numerics import nvfp4_te
from lowprec.numerics import rounding as rounding_lib
from lowprec.numerics.block_layout import AmaxAxisName

_U = np.uint32
E4M3_EPS = np.float32(2.0 ** -6)  # torchao's E4M3_EPS: float8_e4m3fn's smallest normal


def nvfp4_torchao_tensor_scale(x: jax.Array, *, amax_axis_name: AmaxAxisName = None
                               ) -> jax.Array:
  """torchao's ``per_tensor_scale = amax / (448 * 6)`` (float32 scalar; 1 when amax = 0).

  ``amax`` is over finite values (torchao's ``torch.max`` would propagate NaN), and over
  the mesh axes ``amax_axis_name`` inside ``shard_map``.
  """
  t_amax_bits, _ = nvfp4_te.finite_tensor_amax(x)
  t_amax_bits = block_layout.reduce_amax_bits(t_amax_bits, amax_axis_name)
  t_amax = lax.bitcast_convert_type(t_amax_bits, jnp.float32)
  pts = float_bits.div_rn_idiv(t_amax, np.float32(448.0 * 6.0))
  # XLA:CPU compares a subnormal quotient equal to zero (see nonzero_magnitude).
  pts_zero = ~float_bits.nonzero_magnitude(lax.bitcast_convert_type(pts, jnp.uint32))
  return jnp.where((t_amax_bits == 0) | pts_zero, np.float32(1.0), pts)


def torchao_block_scales(block_amax, per_tensor_scale):
  """(unclamped scaled block scale, E4M3 scale s, element multiplier) per block."""
  block_scale = float_bits.div_rn(block_amax, np.float32(6.0))
  scaled_scale = float_bits.div_rn(block_scale, per_tensor_scale)
  s = jnp.clip(scaled_scale, E4M3_EPS, np.float32(448.0))
  s = rounding_lib.round_f32(s, formats_lib.get("e4m3"), rounding=rounding_lib.Nearest(),
                             saturate=True)
  inv_pts = float_bits.div_rn_idiv(np.float32(1.0), per_tensor_scale)  # scalar
  # 1 / per_tensor_scale overflows for a tensor amax below 2688 / FLT_MAX; torchao's
  # Inf / s stays Inf (div_rn takes finite operands).
  reciprocal = jnp.where(jnp.isinf(inv_pts), inv_pts, float_bits.div_rn(inv_pts, s))
  return scaled_scale, s, reciprocal


def nvfp4_torchao_quantize_core(xp: jax.Array, per_tensor_scale: jax.Array,
                                axes: tuple[int, ...], blocks: tuple[int, ...],
                                rounding: rounding_lib.Rounding,
                                words: jax.Array | None
                                ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(E2M1 codes, E4M3 scale codes, float32 dequantized values) of ``xp``, torchao's way.

  torchao's ``nvfp4_quantize`` with a per-tensor scale: ``s = e4m3(clamp((block_amax /
  6) / per_tensor_scale, 2^-6, 448))``, elements ``e2m1(clamp(x * ((1 /
  per_tensor_scale) / s), -6, 6))``, dequantized ``e2m1 * (per_tensor_scale * s)``
  (every operation one float32 rounding; divisions by :func:`numerics.float_bits.div_rn`).
  Runs on the jnp path only (no Pallas kernel).
  """
  e4m3 = formats_lib.get("e4m3")
  block_amax, poisoned, bshape, bpos = nvfp4_te.finite_block_amax(xp, axes, blocks)
  _, s, reciprocal = torchao_block_scales(block_amax, per_tensor_scale)
  rec_full = jnp.broadcast_to(reciprocal, bshape).reshape(xp.shape)
  poison_full = jnp.broadcast_to(poisoned, bshape).reshape(xp.shape)
  # Saturation to +-6 is torchao's clamp before the E2M1 cast.
  codes, elem_f = nvfp4_te.round_scaled_e2m1(xp, rec_full, poison_full, rounding,
                                             words)
  # A reciprocal that overflowed to Inf (a zero block of a tensor with amax below about
  # 5e-34) makes torchao's 0 * Inf a NaN, which the E2M1 cast stores as code 0; ours
  # would saturate the NaN to -6.
  zero_times_inf = jnp.isinf(rec_full) & ~float_bits.nonzero_magnitude(
      lax.bitcast_convert_type(xp, jnp.uint32) & _U(0x7FFFFFFF))
  codes = jnp.where(zero_times_inf, jnp.uint8(0), codes)
  elem_f = jnp.where(zero_times_inf, np.float32(0.0), elem_f)
  scale_codes = jnp.where(poisoned, jnp.uint8(e4m3.nan_code), encoding.encode(s, e4m3))
  scale_codes = jnp.squeeze(scale_codes, axis=bpos)
  values = nvfp4_te.tensor_scaled(per_tensor_scale, lambda mul: mul(
      elem_f, jnp.broadcast_to(mul(s, per_tensor_scale), bshape).reshape(xp.shape)))
  values = jnp.where(poison_full, np.float32(np.nan), values)
  return codes, scale_codes, values
