"""NVFP4's qwix convention: qwix 0.1.8's ``nvfp4`` qtype, which has no tensor scale.

qwix (``qarray.compute_scale_zero_point`` and ``quantize_with_scale_zero_point``, float32
input, absmax calibration over 1x16 tiles) computes, per block, as XLA:CPU runs it:

* ``s = amax / 6``, which XLA:CPU computes as ``amax * (1/6)`` (two float32 roundings),
  ``s = 1`` where ``s < 2^-63`` (zero blocks included);
* ``s = e4m3(clip(s, -448, 448))``, round to nearest even, E4M3 subnormals included: a
  block with ``amax`` below ``6 * 2^-10`` gets scale 0 (no tensor scale lifts it);
* elements ``e2m1(clip(x / s, -6, 6))``, where XLA:CPU computes ``x / s`` (a divisor
  broadcast over the block) as ``x * (1/s)`` (two float32 roundings), then rounds to
  nearest even onto E2M1;
* dequantized ``e2m1 * s``.

XLA:CPU turns a division by a constant or by a broadcast divisor into a multiplication
by the float32 reciprocal (measured: ``x / 448.0`` equals ``x * float32(1/448)`` on
every input, and IEEE ``x / 448`` on 44% of them); we reproduce that. A backend whose
XLA divides instead (not measured: no GPU in this test environment) would give qwix
other bits where a quotient is within an ulp of a rounding boundary.

Where qwix's arithmetic leaves the finite numbers, we reproduce what XLA:CPU gives it
(tested against qwix): a zero scale makes ``x / 0`` an Inf (nonzero ``x``: saturates
to ``+-6``, code 7 or 15) or a NaN (``x`` zero, or a float32 subnormal, which XLA:CPU
reads as zero: E2M1 has no NaN and the cast stores code 8, ``-0``); so such a block
dequantizes to signed zeros. A block holding Inf gets scale 448 (its Infs saturate to
``+-6``, the rest quantize against 448). A block holding NaN gets the NaN scale (E4M3
0x7F) and element codes 8, and dequantizes to NaN: what qwix gives when its amax
(``jnp.max``) propagates the NaN, which XLA:CPU's vectorized max does in small arrays
and not in large ones (there qwix quantizes the block against the other elements and
stores the NaN as code 8, ``-0``).

The reciprocals are :func:`numerics.float_bits.div_rn_idiv` (IEEE) and the products have
normal operands (subnormal ones, and subnormal products, give E2M1 zeros either way),
so the bits are the same on every backend. Runs on the jnp path only (no Pallas kernel).
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
from lowprec.numerics import rounding as rounding_lib

_U = np.uint32
_TINY_BITS = _U(np.float32(2.0 ** -63).view(np.uint32))  # qwix: sqrt(finfo.tiny)
_FLT_MAX = np.float32(np.finfo(np.float32).max)
_NAN_E2M1 = np.uint8(8)  # XLA's float32 -> float4_e2m1fn cast of a NaN: -0


def qwix_block_scales(block_amax_bits: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(float32 E4M3 block scale, bool NaN block) of qwix's nvfp4 for block amax
  magnitude bits (any float32 magnitude: Inf and NaN included)."""
  nan_blk = block_amax_bits > _U(0x7F800000)
  inf_blk = block_amax_bits == _U(0x7F800000)
  amax = lax.bitcast_convert_type(jnp.where(nan_blk | inf_blk, _U(0), block_amax_bits),
                                  jnp.float32)
  s = amax * (np.float32(1.0) / np.float32(6.0))  # XLA:CPU's amax / 6
  s = jnp.where(lax.bitcast_convert_type(s, jnp.uint32) < _TINY_BITS, np.float32(1.0), s)
  s = jnp.where(inf_blk, np.float32(448.0), jnp.minimum(s, np.float32(448.0)))
  s = rounding_lib.round_f32(s, formats_lib.get("e4m3"), rounding=rounding_lib.Nearest(),
                             saturate=True)
  return s, nan_blk


def nvfp4_qwix_quantize_core(xp: jax.Array, axes: tuple[int, ...],
                             blocks: tuple[int, ...], rounding: rounding_lib.Rounding,
                             words: jax.Array | None
                             ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(E2M1 codes, E4M3 scale codes, float32 dequantized values) of ``xp`` (block-divisible
  float32), qwix 0.1.8's nvfp4 (module docstring). A ``rounding`` other than
  ``Nearest()`` is ours (qwix rounds floats to nearest only); ``words`` are its random
  words (:meth:`numerics.rounding.Stochastic.words`) or None."""
  f = formats_lib.get("e2m1")
  b = lax.bitcast_convert_type(xp, jnp.uint32)
  a = b & _U(0x7FFFFFFF)
  amax, bshape, bpos = block_layout.max_bits_per_block(a, axes, blocks)
  s, nan_blk = qwix_block_scales(amax)
  s_full = jnp.broadcast_to(s, bshape).reshape(xp.shape)
  nan_full = jnp.broadcast_to(nan_blk, bshape).reshape(xp.shape)
  zero_scale = s_full == 0  # s is 0 or at least 2^-9: no subnormal compare
  # Infs (only in blocks of scale 448) become FLT_MAX, whose quotient saturates to 6.
  a_fin = jnp.where(a >= _U(0x7F800000), _U(np.float32(_FLT_MAX).view(np.uint32)), a)
  x_zero = a < _U(0x00800000)  # zero or subnormal: XLA:CPU reads both as zero
  rcp = float_bits.div_rn_idiv(np.float32(1.0),
                               jnp.where((s == 0) | nan_blk, np.float32(1.0), s))
  rcp_full = jnp.broadcast_to(rcp, bshape).reshape(xp.shape)
  q = lax.bitcast_convert_type(a_fin, jnp.float32) * rcp_full  # XLA:CPU's x / s
  qb = jnp.where(x_zero, _U(0), lax.bitcast_convert_type(q, jnp.uint32))
  elem = block_layout.round_elements(qb, b >> 31, f, 0, rounding, words)
  elem_f = lax.bitcast_convert_type(elem, jnp.float32)
  codes = encoding.encode(elem_f, f)
  # x / 0: Inf for x != 0 (saturates to +-6), NaN for x == 0 or subnormal (code 8).
  six = jnp.where(b >> 31 == 1, np.uint8(15), np.uint8(7))
  codes = jnp.where(zero_scale, jnp.where(x_zero, _NAN_E2M1, six), codes)
  codes = jnp.where(nan_full, _NAN_E2M1, codes)
  values = encoding.decode(codes, f) * s_full  # exact: at most 2 x 4 significant bits
  values = jnp.where(nan_full, np.float32(np.nan), values)
  e4m3 = formats_lib.get("e4m3")
  scale_codes = jnp.where(nan_blk, jnp.uint8(e4m3.nan_code), encoding.encode(s, e4m3))
  return codes, jnp.squeeze(scale_codes, axis=bpos), values
