"""Exact float32 arithmetic on bit patterns, by uint32 integer ops.

XLA:CPU and TPUs treat subnormal float32 operands and results as zero, Triton lowers
float32 division to an approximation and cannot count leading zeros of unsigned words,
and Triton kernels cannot bitcast a literal. The functions here compute on the float32
bit pattern instead, so they give IEEE float32's bits (subnormals included) on every
backend and inside the Pallas kernels: leading-zero counts, building ``n * 2^qe``
exactly or rounded to nearest even, splitting a magnitude into significand and
exponent, scaling by a power of two, narrow products and divisions rounded to nearest
even. :mod:`numerics.rounding` rounds to a format on top of them; the MX and NVFP4
scale computations use them directly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

_U = np.uint32
_I = np.int32


def leading_zeros(n: jax.Array) -> jax.Array:
  """int32 count of leading zero bits of uint32 ``n < 2^24`` (32 for ``n == 0``).

  ``lax.clz`` without the instruction: ``n`` converts to float32 exactly, and the
  float's exponent field is ``127 + floor(log2 n)``. Triton cannot legalize
  ``math.ctlz`` on unsigned words, so the Pallas kernels (which run this module's
  code) count this way; the result equals ``lax.clz`` on every ``n < 2^24`` (tested
  exhaustively). Larger ``n`` may round up to the next power of two and give one too
  few.
  """
  f = lax.bitcast_convert_type(n.astype(jnp.int32).astype(jnp.float32), jnp.int32)
  return jnp.where(n == 0, _I(32), _I(31 + 127) - (f >> 23))


def compose_bits(n: jax.Array, qe: jax.Array) -> jax.Array:
  """float32 bit pattern of ``n * 2^qe`` for uint32 ``n < 2^24``, built bit by bit.

  Exact whenever the value is representable in float32 (``qe >= -149`` once trailing
  zeros are removed from ``n``); it never touches float arithmetic, so XLA:CPU's
  flush-to-zero of subnormals cannot alter it.
  """
  p = _I(31) - leading_zeros(n)  # position of n's leading one
  ev = qe + p
  normal = ((ev + 127).astype(jnp.uint32) << 23) | (
      (n << jnp.clip(23 - p, 0, 31).astype(jnp.uint32)) & _U(0x7FFFFF))
  subnormal = n << jnp.clip(qe + 149, 0, 31).astype(jnp.uint32)
  return jnp.where(n == 0, _U(0), jnp.where(ev >= -126, normal, subnormal))


def _leading_zeros_u32(n: jax.Array) -> jax.Array:
  """int32 leading zero bits of any uint32 ``n`` (:func:`leading_zeros` is exact below
  2^24; above, ``n >> 8`` is, and has 8 more)."""
  return jnp.where(n >= _U(1 << 24), leading_zeros(n >> 8) - _I(8), leading_zeros(n))


def round_bits_rn(n: jax.Array, qe: jax.Array) -> jax.Array:
  """float32 bit pattern of ``n * 2^qe`` (uint32 ``n``, int32 ``qe``) rounded to
  nearest even, by integer ops.

  Gradual underflow as IEEE float32 has it (subnormal results, never a flush to zero),
  and overflow to Inf. :func:`compose_bits` for any ``n``: that one needs ``n * 2^qe``
  exact in float32.
  """
  p = _I(31) - _leading_zeros_u32(n)  # position of n's leading one (-1 for n == 0)
  # Bits of n below the kept ones: 24 significant bits for a normal result, the bits
  # below 2^-149 for a subnormal one.
  drop = jnp.maximum(p - _I(23), _I(-149) - qe)
  d = jnp.clip(drop, 1, 32).astype(jnp.uint32)
  kept = jnp.where(d >= _U(32), _U(0), n >> jnp.clip(drop, 1, 31).astype(jnp.uint32))
  guard = (n >> (d - _U(1))) & _U(1)
  sticky = ((n & ((_U(1) << (d - _U(1))) - _U(1))) != 0).astype(jnp.uint32)
  rounded = kept + (guard & (sticky | (kept & _U(1))))
  m = jnp.where(drop > 0, jnp.where(drop > 32, _U(0), rounded), n)  # m <= 2^24
  qm = qe + jnp.maximum(drop, 0)
  overflow = (m != 0) & (qm + _I(31) - leading_zeros(m) > 127)
  return jnp.where(overflow, _U(0x7F800000), compose_bits(m, qm))


def mul_narrow(a: jax.Array, b: jax.Array) -> jax.Array:
  """float32 ``a * b`` rounded to nearest even, subnormal operands and results included,
  for a finite ``a`` with at most 8 significant bits (an E4M3 or E2M1 value, or a
  product of the two) and a finite ``b``.

  Equal bit for bit to IEEE float32 multiplication (NumPy, GPUs): the 8 x 24-bit
  integer product of the significands is exact in uint32 and rounded once by
  :func:`round_bits_rn`. XLA:CPU and TPUs treat subnormal operands (and results) as
  zero; NVFP4's tensor scale ``1/S_enc`` is subnormal for tensors with amax below
  ``2688 * 2^-126``, which would zero their scales and dequantized values. NaN and Inf
  operands give IEEE's NaN and signed Inf.
  """
  a = jnp.asarray(a, jnp.float32)
  b = jnp.asarray(b, jnp.float32)
  ab = lax.bitcast_convert_type(a, jnp.uint32)
  bb = lax.bitcast_convert_type(b, jnp.uint32)
  ma, mb = ab & _U(0x7FFFFFFF), bb & _U(0x7FFFFFFF)
  sa, ea = split_bits(ma)
  sb, eb = split_bits(mb)
  sign = (ab ^ bb) & _U(0x80000000)
  n = (sa >> _U(16)) * sb  # exact: below 2^8 * 2^24
  zero = n == 0  # a factor is zero (not ma == 0: see nonzero_magnitude)
  bits = jnp.where(zero, _U(0), round_bits_rn(n, ea + eb - _I(30)))
  finite = (ma < _U(0x7F800000)) & (mb < _U(0x7F800000))
  nan = (ma > _U(0x7F800000)) | (mb > _U(0x7F800000)) | zero  # Inf * 0 is NaN too
  special = jnp.where(nan, _U(0x7FC00000), _U(0x7F800000) | sign)
  return lax.bitcast_convert_type(jnp.where(finite, bits | sign, special), jnp.float32)


def split_bits(a: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(significand, exponent) of finite magnitude bits ``a``: value = sig * 2^(eb-23).

  ``sig`` is normalized to 24 bits with its leading one at bit 23, float32 subnormals
  included (their exponent then goes below -126), so ``eb = floor(log2 value)``.
  """
  e32 = a >> 23
  frac = a & _U(0x7FFFFF)
  lead = jnp.clip(leading_zeros(frac) - 8, 0, 31)  # subnormal shift-up
  sig = jnp.where(e32 > 0, frac | _U(0x800000), frac << lead.astype(jnp.uint32))
  eb = jnp.where(e32 > 0, e32.astype(jnp.int32) - _I(127), _I(-126) - lead)
  return sig, eb


def nonzero_magnitude(a: jax.Array) -> jax.Array:
  """bool: magnitude bits ``a`` (a float32's bits with the sign cleared) are not zero.

  ``a != 0`` itself is unsafe on XLA:CPU when ``a`` comes from a float loaded in the
  same fusion: LLVM folds ``(bits & 0x7FFFFFFF) == 0`` into ``x == 0.0``, which the
  CPU's denormals-are-zero mode answers True for a subnormal ``x`` (seen in NVFP4's
  torchao core). The normalized significand's leading bit is set exactly when the
  value is nonzero, and no float compare can stand for it.
  """
  sig, _ = split_bits(a)
  return (sig & _U(0x800000)) != 0


def ldexp_bits(a: jax.Array, k: jax.Array | int) -> jax.Array:
  """float32 bits of ``value(a) * 2^k`` for magnitude bits ``a``, by integer ops.

  Exact whenever the result is representable (it is for every dequantized MX value);
  results below the float32 subnormal range truncate. Zero stays zero.
  """
  sig, eb = split_bits(a)
  e_new = eb + k
  normal = ((e_new + 127).astype(jnp.uint32) << 23) | (sig & _U(0x7FFFFF))
  sub = sig >> jnp.clip(-126 - e_new, 0, 31).astype(jnp.uint32)
  return jnp.where(a == 0, _U(0), jnp.where(e_new >= -126, normal, sub))


def _magnitude_parts(v) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """(magnitude bits, (significand, exponent)) of float32 ``v``; a Python or NumPy
  constant is split in NumPy (Triton kernels cannot bitcast a literal)."""
  if isinstance(v, (int, float, np.number, np.ndarray)):
    bits = np.asarray(v, np.float32).view(np.uint32) & _U(0x7FFFFFFF)
    m, e = np.frexp(np.asarray(bits, np.uint32).view(np.float32).astype(np.float64))
    ok = bits != 0
    sig = np.where(ok, np.ldexp(m, 24), 0).astype(np.uint32)
    return bits, (sig, np.where(ok, e - 1, -127).astype(np.int32))
  bits = lax.bitcast_convert_type(jnp.asarray(v, jnp.float32), jnp.uint32) & _U(0x7FFFFFFF)
  return bits, split_bits(bits)


def div_rn(a: jax.Array, b: jax.Array) -> jax.Array:
  """float32 ``a / b`` for ``a, b >= 0`` finite, rounded to nearest even, by integer ops.

  The same bits on every backend: Triton lowers float32 division to the approximate
  ``div.full.f32``, TPUs divide through a reciprocal estimate, and XLA:CPU treats
  subnormal operands as zero. A restoring long division of the 24-bit significands
  (26 quotient bits, then guard and sticky) gives the IEEE result, subnormal results
  included; ``b == 0`` gives Inf (and ``0 / 0`` gives Inf too: callers clamp it).
  About 140 integer ops per element: meant for per-block and per-tensor scales, and
  what the Pallas kernels run; scalar divisions in jnp programs use
  :func:`div_rn_idiv` (same bits, fewer ops to compile).
  """
  abits, (sa, ea) = _magnitude_parts(a)
  bbits, (sb, eb) = _magnitude_parts(b)
  sb = jnp.where(sb == _U(0), _U(1), sb)  # b == 0 is patched below
  r, q = sa, jnp.zeros(jnp.broadcast_shapes(sa.shape, sb.shape), jnp.uint32)
  for _ in range(26):  # q = floor(sa 2^25 / sb) in [2^24, 2^26)
    ge = r >= sb
    q = (q << 1) | ge.astype(jnp.uint32)
    r = jnp.where(ge, r - sb, r) << 1
  return _div_round(abits, bbits, ea, eb, q, r)


def div_rn_idiv(a: jax.Array, b: jax.Array) -> jax.Array:
  """:func:`div_rn` (float32 ``a / b``, ``a, b >= 0`` finite, IEEE round to nearest
  even, subnormal operands and results included) with the quotient's 26 bits from five
  uint32 divisions (1, 8, 8, 8 and 1 bits) instead of a 26-step loop: the same bits
  (tested against :func:`div_rn` and NumPy), about 60 ops instead of 140 to compile.
  For scalars in jnp programs (XLA divides unsigned integers exactly on every
  backend): XLA:CPU keeps integer divisions out of loop fusions, so on per-block
  arrays :func:`div_rn`'s loop, which fuses, runs faster. The Pallas kernels keep
  :func:`div_rn`. Not differentiable (integer ops).
  """
  abits, (sa, ea) = _magnitude_parts(a)
  bbits, (sb, eb) = _magnitude_parts(b)
  sb = jnp.where(sb == _U(0), _U(1), sb)  # b == 0 is patched below
  # sa, sb < 2^24 and r < sb, so every r << 8 fits in 32 bits.
  q = lax.div(jnp.asarray(sa, jnp.uint32), sb)  # 0 or 1: sa / sb in (1/2, 2)
  r = sa - q * sb
  for k in (8, 8, 8, 1):
    t = r << _U(k)
    c = lax.div(t, sb)
    r = t - c * sb
    q = (q << _U(k)) | c
  return _div_round(abits, bbits, ea, eb, q, r)


def _div_round(abits, bbits, ea, eb, q, r) -> jax.Array:
  """The float32 quotient from ``q = floor(sa 2^25 / sb)`` and a remainder ``r`` that
  is zero exactly when the division is exact (both :func:`div_rn` variants)."""
  big = q >= _U(1 << 25)
  big_i = big.astype(jnp.int32)
  e = ea - eb - _I(1) + big_i  # floor(log2(a / b))
  # Bits of q below the 24 kept ones: 2 (or 1), plus 126 - e more for subnormals.
  drop = _I(1) + big_i + jnp.maximum(_I(-126) - e, 0)
  drop_c = jnp.minimum(drop, 27).astype(jnp.uint32)
  m = jnp.where(drop >= 27, _U(0), q >> drop_c)
  guard = jnp.where(drop >= 27, _U(0), (q >> (drop_c - _U(1))) & _U(1))
  low = q & ((_U(1) << (drop_c - _U(1))) - _U(1))  # drop >= 1: below the guard bit
  sticky = (jnp.where(drop >= 27, q, low) != 0) | (r != 0)
  m = m + (guard & (sticky.astype(jnp.uint32) | (m & _U(1))))
  normal = e >= -126
  # m is 24 bits (25 after a rounding carry) for normals, the fraction for subnormals.
  carry = normal & (m >= _U(1 << 24))
  m = jnp.where(carry, m >> 1, m)
  e = e + carry.astype(jnp.int32)
  bits = jnp.where(normal, ((e + 127).astype(jnp.uint32) << 23) | (m & _U(0x7FFFFF)), m)
  bits = jnp.where(normal & (e > 127), _U(0x7F800000), bits)
  bits = jnp.where(abits == 0, _U(0), bits)
  bits = jnp.where(bbits == 0, _U(0x7F800000), bits)
  return lax.bitcast_convert_type(bits, jnp.float32)
