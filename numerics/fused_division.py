"""Exact float32 division by a normalized significand, in ops XLA fuses.

:func:`numerics.float_bits.div_rn_idiv` forms a quotient's bits with five integer
divisions, which XLA:CPU keeps out of fusions: each one became a fusion of its own that
recomputed the steps before it, and a scalar chain of three such divisions compiled to
about 1,100 instructions per NVFP4 operand. Here the quotient comes from a float32
estimate, which any backend's division gives to within a few ulps (XLA:CPU's is IEEE;
XLA:GPU emits ``div.full.f32`` and ``rcp.approx.f32``, TPUs a refined reciprocal
estimate), corrected by the exact remainder in wrapping uint32 arithmetic: only
elementwise ops, so a division fuses into one loop. The result is IEEE float32's
round to nearest even, subnormal results and overflow included, on every backend, and
never reads a subnormal float (XLA:CPU and TPUs would read it as zero): operands are
taken apart in their bits. Tests hold each function to NumPy's float32 with the
estimate exact and perturbed by up to 16 ulps (2^-20).

For jnp programs only: the Pallas kernels keep :func:`numerics.float_bits.div_rn` (Triton
has no ``clz``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

_U = np.uint32
_I = np.int32


def _reciprocal_estimate(x: jax.Array) -> jax.Array:
  """float32 ``1/x`` from the backend's division: only an estimate is needed (within
  2^-20 relative); tests perturb it."""
  return np.float32(1.0) / x


def significand(bits: jax.Array, *, subnormal: bool) -> tuple[jax.Array, jax.Array]:
  """(uint32 significand in [2^23, 2^24), int32 exponent): ``value = sig * 2^(e - 23)``
  for the nonzero finite magnitude bits ``bits``; ``subnormal=False`` asserts (does not
  check) that they are normal, and skips the leading-zero count."""
  e32 = (bits >> 23).astype(jnp.int32)
  normal_sig = (bits & _U(0x7FFFFF)) | _U(0x800000)
  if not subnormal:
    return normal_sig, e32 - _I(127)
  sub = e32 == 0
  shift = jnp.where(sub, lax.clz(bits) - _I(8), _I(0))
  sig = jnp.where(sub, bits << shift.astype(jnp.uint32), normal_sig)
  return sig, jnp.where(sub, _I(-126) - shift, e32 - _I(127))


def quotient(sa: int, sb: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(q, r)``: ``q = floor(sa * 2^25 / sb)`` in [2^24, 2^26) and ``r = sa * 2^25 - q *
  sb`` in [0, sb), for a constant ``sa`` and uint32 ``sb``, both in [2^23, 2^24).

  The estimate ``sa 2^25 * (1/sb)`` is off by at most 70 when the reciprocal is within
  2^-20 of ``1/sb`` (64 from the reciprocal, 4 from rounding the product), so the
  remainder, formed modulo 2^32, is exact in int32 (below 71 * 2^24 < 2^31); its own
  estimated quotient by ``sb`` is off by at most one, which the last two selects
  correct.
  """
  sa = int(sa)
  sbf = sb.astype(jnp.int32).astype(jnp.float32)
  rcp = _reciprocal_estimate(sbf)
  q = (np.float32(sa * 2.0 ** 25) * rcp).astype(jnp.int32)
  r = lax.bitcast_convert_type(_U((sa << 25) & 0xFFFFFFFF)
                               - q.astype(jnp.uint32) * sb, jnp.int32)
  sbi = sb.astype(jnp.int32)
  k = jnp.floor(r.astype(jnp.float32) * rcp).astype(jnp.int32)
  q, r = q + k, r - k * sbi
  low = r < 0
  q, r = jnp.where(low, q - 1, q), jnp.where(low, r + sbi, r)
  high = r >= sbi
  q, r = jnp.where(high, q + 1, q), jnp.where(high, r - sbi, r)
  return q.astype(jnp.uint32), r


def round_bits(n: jax.Array, lead: int, e: jax.Array, inexact: jax.Array, *,
               subnormal: bool, overflow: bool) -> jax.Array:
  """float32 bits of ``(n + f) * 2^e`` rounded to nearest even, for uint32 ``n`` in
  [2^lead, 2^(lead+2)) (``24 <= lead <= 29``) and a fraction ``0 <= f < 1`` that is
  nonzero exactly where ``inexact``.

  ``subnormal``: results below 2^-126 may occur (gradual underflow, as IEEE);
  ``overflow``: results above FLT_MAX may occur (they give Inf). Leaving either out
  when it cannot happen makes the program smaller.
  """
  big = (n >> _U(lead + 1)).astype(jnp.int32)
  top = e + _I(lead) + big  # the exponent of n's leading bit
  drop = _I(lead - 23) + big
  if subnormal:
    drop = drop + jnp.maximum(_I(-126) - top, _I(0))
  d = jnp.minimum(drop, _I(31)).astype(jnp.uint32)
  m = n >> d
  guard = (n >> (d - _U(1))) & _U(1)
  sticky = ((n & ((_U(1) << (d - _U(1))) - _U(1))) != 0) | inexact
  if subnormal:  # a result below half the smallest subnormal rounds to zero
    far = drop > _I(lead + 2)
    m, guard = jnp.where(far, _U(0), m), jnp.where(far, _U(0), guard)
  m = m + (guard & (sticky.astype(jnp.uint32) | (m & _U(1))))
  # Normal: m has 24 bits, or 25 after a rounding carry, which adding the biased
  # exponent field carries into the exponent. Subnormal: m is the bit pattern (a
  # carry into 2^23 is the smallest normal's).
  bits = (m - _U(1 << 23)) + ((top + _I(127)).astype(jnp.uint32) << 23)
  if subnormal:
    bits = jnp.where(top >= _I(-126), bits, m)
  if overflow:
    bits = jnp.where(top > _I(127), _U(0x7F800000), jnp.minimum(bits, _U(0x7F800000)))
  return bits


def reciprocal_bits(bits: jax.Array, *, subnormal_in: bool, subnormal_out: bool,
                    overflow: bool) -> jax.Array:
  """float32 bits of ``1/x`` rounded to nearest even, for the magnitude bits of a finite
  ``x > 0`` (``x == 0`` gives Inf). The flags say which cases can occur (as
  :func:`significand` and :func:`round_bits`)."""
  sig, e = significand(jnp.maximum(bits, _U(1)), subnormal=subnormal_in)
  q, r = quotient(1 << 23, sig)  # 1/x = 2^(23 - e) / sig = q * 2^(-e - 25)
  out = round_bits(q, 24, -e - _I(25), r != 0, subnormal=subnormal_out,
                   overflow=overflow)
  return jnp.where(bits == 0, _U(0x7F800000), out)


def constant_over_bits(c: float, bits: jax.Array, *, subnormal_out: bool,
                       overflow: bool) -> jax.Array:
  """float32 bits of ``c / x`` rounded to nearest even, for a positive float32 constant
  ``c`` and the bits of a normal ``x > 0``."""
  m, ec = np.frexp(np.float64(np.float32(c)))  # c = m 2^ec, m in [1/2, 1)
  sa = int(m * 2 ** 24)
  sig, e = significand(bits, subnormal=False)
  q, r = quotient(sa, sig)  # c / x = (sa / sig) 2^(ec - 1 - e) = q 2^(ec - e - 26)
  return round_bits(q, 24, _I(int(ec) - 26) - e, r != 0, subnormal=subnormal_out,
                    overflow=overflow)
