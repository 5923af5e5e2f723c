"""MX elements in float arithmetic: the jnp fast path of ``quantize_mx`` and
``quantize_dequantize_mx``, bit for bit the integer reference.

The reference (:func:`numerics.rounding.round_magnitude`, run by
:func:`numerics.mx.mx_quantize_core` and the Pallas kernels) rounds each
element by splitting its float32 bits into significand and exponent and rebuilding
the result bit by bit: about 200 integer operations per element, most of them the
leading-zero count and shifts that only subnormal inputs need. An MX block scale is
a power of two, which float arithmetic applies exactly, so the element pass here is
about 25 operations:

1. ``m = |x| / 2^s`` by subtracting ``s`` from the exponent field
   (:func:`scaled_magnitude`); a float32 subnormal ``x`` is first converted from its
   bits as an integer (its value in units of 2^-149), so no float operation ever sees
   a subnormal operand (XLA:CPU and TPUs read those as zero). ``m`` is exact wherever
   it is a normal float32; below 2^-126 it is set to zero, which changes no result:
   every MX grid's quantum is at least 2^-16, so such an ``m`` rounds to zero to
   nearest and toward zero, and its fraction of a quantum is below 2^-110, which no
   32-bit stochastic word can carry.
2. ``m`` rounded onto the element grid (:func:`round_to_grid`), whose quantum at ``m``
   is ``2^qe`` with ``qe = max(floor(log2 m), emin) - man_bits``:

   * nearest (ties to even): ``(m + C) - C`` with ``C = 1.5 * 2^(qe + 23)``, whose ulp
     is ``2^qe``; ``m + C`` stays in ``C``'s binade (``m < 2^(man_bits + 1 + qe)``),
     so the float add rounds ``m`` to a multiple of the quantum, ties to even
     (``C / 2^qe`` is even), and the subtraction is exact;
   * toward zero: ``floor(m / 2^qe) * 2^qe``;
   * stochastic: as :func:`numerics.nvfp4_fast._e2m1_sr_magnitude` (NVFP4's fast path)
     on this grid: with ``t = m / 2^qe`` (exact), the reference rounds away exactly
     when the fraction's top ``r`` bits plus the word's top ``r`` bits carry out of
     ``r`` bits, which is the carry of the fraction's top 32 bits plus the word with
     its low ``32 - r`` bits cleared.

   then saturated at the format's max (a float ``min``).
3. The dequantized value ``r * 2^s`` by adding ``s`` to the exponent field
   (:func:`scale_back`, gradual underflow by a shift as
   :func:`numerics.float_bits.ldexp_bits`), or the element code from ``r``'s bit fields
   (:func:`element_codes`).

Every element format of MX is covered (E4M3, E5M2, E2M3, E3M2, E2M1 and INT8, whose
grid is the same formula with quantum 1), with every scale rule (the scales are the
reference's, computed once per block by :mod:`numerics.mx_scales`) and every rounding.
No float operation here has a subnormal operand or result, so the bits are the same on
every XLA backend. Tests (``tests/numerics/test_mx_fast_path.py``) hold it bit for
bit to the reference core and to the NumPy reference.

Gradients: none here (bit operations); :func:`numerics.quantize_dequantize_mx` wraps
this pass in a straight-through gradient and :func:`numerics.quantize_mx` raises when
differentiated. The Pallas kernels keep the integer cores.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.numerics import block_layout
from lowprec.numerics import formats as formats_lib
from lowprec.numerics import mx_scales
from lowprec.numerics import rounding as rounding_lib

_I = np.int32
_ONE_EXP = _I(1 << 23)  # one unit of the float32 exponent field


def _f32(bits: jax.Array) -> jax.Array:
  return lax.bitcast_convert_type(bits, jnp.float32)


def _i32(v: jax.Array) -> jax.Array:
  return lax.bitcast_convert_type(v, jnp.int32)


def scaled_magnitude(a: jax.Array, s: jax.Array) -> jax.Array:
  """float32 ``value(a) / 2^s`` for finite magnitude bits ``a`` (int32, sign clear) and
  int32 exponents ``s`` (broadcast against ``a``).

  Exact where the quotient is a normal float32; zero where it is below 2^-126 (see the
  module docstring for why that is all any MX rounding needs). Integer operations only
  (and one int-to-float conversion of a subnormal's bits, exact below 2^24).
  """
  sub = a < _I(0x00800000)  # subnormal or zero: a is its value in units of 2^-149
  base = jnp.where(sub, _i32(a.astype(jnp.float32)), a)
  off = jnp.where(sub, s + _I(149), s)
  keep = (base >> 23) - off >= 1
  # Where ``keep`` is False the product below may wrap; it is not selected.
  return _f32(jnp.where(keep, base - off * _ONE_EXP, _I(0)))


def _quantum_exponent(m: jax.Array, f: formats_lib.Format) -> jax.Array:
  """Biased float32 exponent of the grid quantum at ``m >= 0`` (int32)."""
  return jnp.maximum(_i32(m) >> 23, _I(f.emin + 127)) - _I(f.man_bits)


def check_format(f: formats_lib.Format) -> None:
  """Raises unless the float-arithmetic path covers ``f`` (every MX element format)."""
  if f.kind not in ("float", "int") or f.bits > 8:
    raise ValueError(f"the MX fast path rounds MX element formats, got {f.name}")
  # The quantum and its reciprocal must be normal float32 powers of two, and
  # m + C must stay in C's binade (module docstring).
  assert f.emin + 127 - f.man_bits >= 1 and f.man_bits + 1 < 22, f.name


def round_to_grid(m: jax.Array, f: formats_lib.Format, rounding: rounding_lib.Rounding,
                  words: jax.Array | None = None) -> jax.Array:
  """float32 ``m >= 0`` (normal or zero, below ``2^(emax + 2)``) rounded onto ``f``'s
  grid and saturated at ``f.max``; equal bit for bit to
  :func:`numerics.rounding.round_magnitude` followed by saturation.

  ``words``: uint32 random words of ``m``'s shape for :class:`Stochastic` rounding.
  """
  check_format(f)
  eq = _quantum_exponent(m, f)
  if isinstance(rounding, rounding_lib.Nearest):
    c = _f32(((eq + _I(23)) << 23) | _I(0x400000))
    r = (m + c) - c
  else:
    q = _f32(eq << 23)
    t = m * _f32((_I(254) - eq) << 23)  # m / q, exact
    k = jnp.floor(t)
    if isinstance(rounding, rounding_lib.TowardZero):
      r = k * q
    elif isinstance(rounding, rounding_lib.Stochastic):
      if words is None:
        raise ValueError("stochastic rounding needs random words")
      # The fraction's top 32 bits (exact: t - k has at most 24 significant bits).
      frac = ((t - k) * np.float32(2.0 ** 32)).astype(jnp.uint32)
      bits = rounding.bits
      if bits is not None and bits < 32:
        words = words & np.uint32((0xFFFFFFFF << (32 - bits)) & 0xFFFFFFFF)
      away = words > ~frac  # frac + words >= 2^32
      r = (k + away.astype(jnp.float32)) * q
    else:
      raise ValueError(f"unknown rounding {rounding!r}")
  return jnp.minimum(r, np.float32(f.max))


def scale_back(r: jax.Array, s: jax.Array) -> jax.Array:
  """int32 float32 bits of ``r * 2^s`` for an element value ``r >= 0`` (zero or a
  normal float32) and int32 ``s``: :func:`numerics.float_bits.ldexp_bits`'s result
  (results below the normal range shift into subnormals, truncating; zero stays zero).
  """
  rb = _i32(r)
  e = (rb >> 23) + s  # biased exponent of the result
  normal = rb + s * _ONE_EXP
  sub = ((rb & _I(0x7FFFFF)) | _I(0x800000)) >> jnp.clip(_I(1) - e, 0, 31)
  # r is never a float32 subnormal, so a float compare of r with zero (which LLVM may
  # substitute for this integer one) answers the same.
  return jnp.where(rb == 0, _I(0), jnp.where(e >= 1, normal, sub))


def element_codes(r: jax.Array, negative: jax.Array, f: formats_lib.Format
                  ) -> jax.Array:
  """uint8 codes of element values ``r >= 0`` (exact in ``f``, as from
  :func:`round_to_grid`) with sign ``negative`` (bool): :func:`numerics.encoding.encode`
  of ``-r`` or ``r``."""
  if f.kind == "int":
    k = r.astype(jnp.int32)
    return jnp.where(negative, (_I(256) - k) & _I(0xFF), k).astype(jnp.uint8)
  m = f.man_bits
  normal = (_i32(r) >> (23 - m)) - _I((127 - f.bias) << m)
  sub = (r * np.float32(2.0 ** (m - f.emin))).astype(jnp.int32)  # exact, < 2^m
  mag = jnp.where(r >= np.float32(2.0 ** f.emin), normal, sub)
  return (mag | jnp.where(negative, _I(1 << (f.bits - 1)), _I(0))).astype(jnp.uint8)


_POISON = _I(1 << 20)  # a block exponent no element survives: marks NaN/Inf blocks


def _materialize_int(*block_values: jax.Array) -> tuple[jax.Array, ...]:
  """The same int32 per-block arrays, computed once (not fused, per element, into the
  element pass that broadcasts them): a max-reduction with the int32 minimum over a new
  axis of two, which XLA never fuses into its consumer (as
  :func:`numerics.nvfp4_fast._materialize` for floats)."""
  lo = np.int32(np.iinfo(np.int32).min)
  stacked = [jnp.stack([v, jnp.full_like(v, lo)], axis=-1) for v in block_values]
  return tuple(lax.reduce(tuple(stacked), tuple(lo for _ in stacked),
                          lambda x, y: tuple(jnp.maximum(a, b) for a, b in zip(x, y)),
                          (block_values[0].ndim,)))


def quantize(xp: jax.Array, f: formats_lib.Format, axes: tuple[int, ...],
             blocks: tuple[int, ...], scale_rule: str, rounding: rounding_lib.Rounding,
             words: jax.Array | Callable[[], jax.Array] | None,
             *, dequantize: bool) -> jax.Array | tuple[jax.Array, jax.Array]:
  """MX quantization of float32 ``xp`` (block-divisible shape) in two passes: the
  block amaxes, then the elements in float arithmetic.

  Returns ``(element codes, E8M0 scale codes)`` as
  :func:`numerics.mx.mx_quantize_core`, or with ``dequantize`` the float32
  array of :func:`numerics.mx.mx_quantize_dequantize_core`; equal to them bit
  for bit (tested). ``words``: uint32 of ``xp``'s shape for stochastic rounding, or a
  function returning them (called where they are used, so that XLA fuses them).
  Scales, their rules and clamping, and NaN/Inf blocks are the reference's
  (:func:`numerics.mx_scales.mx_scale_exponent`), computed once per block.
  """
  check_format(f)
  bshape, bpos = block_layout.blocked_shape(xp.shape, axes, blocks)
  b = _i32(xp).reshape(bshape)
  a = b & _I(0x7FFFFFFF)
  amax = a
  for p in reversed(bpos):  # tiles: the contiguous in-block axis first
    amax = jnp.max(amax, axis=p, keepdims=True)
  poisoned = amax >= _I(0x7F800000)
  code = mx_scales.mx_scale_exponent(
      lax.bitcast_convert_type(jnp.where(poisoned, _I(0), amax), jnp.uint32), f,
      scale_rule)
  s = jnp.where(poisoned, _POISON, code - _I(127 + f.emax - f.mx_emax))
  s, = _materialize_int(s)
  words = words() if callable(words) else words
  m = scaled_magnitude(a, s)  # zero in poisoned blocks
  r = round_to_grid(m, f, rounding, None if words is None else words.reshape(bshape))
  poison = s == _POISON
  if dequantize:
    mag = scale_back(r, s)
    sign = b & _I(-2 ** 31)
    if f.kind != "float":  # INT8 has no negative zero
      sign = jnp.where(mag == 0, _I(0), sign)
    out = jnp.where(poison, np.float32(np.nan), _f32(mag | sign))
    return out.reshape(xp.shape)
  codes = jnp.where(poison, jnp.uint8(0), element_codes(r, b < 0, f))
  scale_codes = jnp.where(poisoned, _I(255), code).astype(jnp.uint8)
  return codes.reshape(xp.shape), jnp.squeeze(scale_codes, axis=bpos)
