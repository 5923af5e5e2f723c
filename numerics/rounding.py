"""Rounding to a format: nearest-even, stochastic, toward zero; error feedback.

Everything here works on the float32 bit pattern with uint32 integer arithmetic, so it
is exact, runs on any XLA backend (including FP6, which XLA on the CPU cannot cast to)
and is shared by the jnp reference and the Pallas kernels.

For ``|x|`` with significand ``sig`` (24 bits with the implicit one) and exponent
``e = floor(log2|x|)``, the target grid at ``x`` has quantum
``2^(max(e, emin) - man_bits)``; the ``shift = 23 - man_bits + max(0, emin - e)`` low
bits of ``sig`` are discarded. The kept integer ``N = sig >> shift`` is incremented
("rounded away", in magnitude) when

* ``nearest``: the discarded bits exceed half, or equal half and ``N`` is odd (RNE);
* ``toward_zero``: never;
* ``stochastic``: adding ``r`` uniform random bits to the top ``r`` discarded bits
  carries out, with ``r = min(rand_bits, shift)`` (``rand_bits=None``: all discarded
  bits, at most the 32 of one random word). So ``P(away)`` is exactly the discarded
  fraction of an ulp, floored to a multiple of ``2^-r``: unbiased when ``r >= shift``,
  biased toward zero by less than ``2^-r`` ulp otherwise.

The result ``N * quantum`` is rebuilt bit by bit, then overflow, Inf and NaN follow
the format's policy (see :mod:`numerics.formats`).
"""

from __future__ import annotations

import functools

from typing import Literal

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.numerics import formats as formats_lib
from lowprec.numerics import gradients as gradients_lib
from lowprec.numerics import random_bits as random_bits_lib

Rounding = Literal["nearest", "stochastic", "toward_zero"]
ROUNDINGS = ("nearest", "stochastic", "toward_zero")
_FLOAT_INPUTS = (jnp.float32, jnp.bfloat16, jnp.float16)

_U = np.uint32
_I = np.int32


def check_rounding_args(rounding: str, key=None, rand_bits: int | None = None,
                        rng: str | None = None) -> None:
  """The rounding-argument check of every public quantizer.

  Raises ValueError for an unknown ``rounding`` or ``rng``, a ``rand_bits`` outside
  [1, 32], ``rounding='stochastic'`` without a ``key``, and a ``key``, ``rand_bits`` or
  non-default ``rng`` given to a deterministic rounding (which would ignore them).
  ``rng=None`` is for callers that take no ``rng`` argument (the default, ``"hash"``).
  """
  if rounding not in ROUNDINGS:
    raise ValueError(f"unknown rounding {rounding!r}; known: {', '.join(ROUNDINGS)}")
  check_rand_bits(rand_bits)
  if rng is not None and rng not in random_bits_lib.METHODS:
    raise ValueError(f"unknown rng {rng!r}; known: {', '.join(random_bits_lib.METHODS)}")
  if rounding == "stochastic":
    if key is None:
      raise ValueError("rounding='stochastic' needs a PRNG key")
  elif key is not None or rand_bits is not None or rng not in (None, "hash"):
    raise ValueError(f"key, rand_bits and rng are used by rounding='stochastic' only; "
                     f"rounding={rounding!r} would ignore them")


def check_float_input(x, fn: str) -> jax.Array:
  """``jnp.asarray(x)`` if it is float32, bfloat16 or float16; else TypeError naming
  the public function ``fn`` and x's dtype and shape.

  Every public quantizer validates its input with this: a complex array would lose its
  imaginary part in the float32 arithmetic, and integer or bool arrays have no grid to
  round onto (their "quantized" values would come back truncated to their own dtype).
  """
  x = jnp.asarray(x)
  if x.dtype not in [jnp.dtype(d) for d in _FLOAT_INPUTS]:
    hint = ("quantize its real and imaginary parts separately"
            if jnp.issubdtype(x.dtype, jnp.complexfloating)
            else "convert it to float32 first")
    raise TypeError(f"{fn} expects a float32, bfloat16 or float16 array, got "
                    f"{x.dtype}{list(x.shape)}; {hint}")
  return x


def _check_input(x: jax.Array, fmt: formats_lib.Format, fn: str = "cast") -> None:
  check_float_input(x, fn)
  if not formats_lib.representable_in(fmt, x.dtype):
    raise TypeError(
        f"{fmt.name} values are not all representable in {x.dtype}, so the result "
        f"could not be returned in x's dtype; cast x to float32 first")


def round_f32(x: jax.Array, fmt: formats_lib.Format, *, rounding: Rounding,
              words: jax.Array | None = None, rand_bits: int | None = None,
              saturate: bool = True) -> jax.Array:
  """Rounds float32 ``x`` to ``fmt``'s grid; returns float32 values exact in ``fmt``.

  This is the reference rounding every quantizer in the library uses. ``words`` are
  uint32 uniform random words of ``x``'s shape, required for ``stochastic``.
  """
  if fmt.kind == "scale":
    return _round_e8m0(x, fmt, rounding=rounding, words=words, rand_bits=rand_bits,
                       saturate=saturate)
  return _round_grid(x, fmt, rounding=rounding, words=words, rand_bits=rand_bits,
                     saturate=saturate)


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


def round_magnitude(a: jax.Array, man_bits: int, emin: int, rounding: str,
                    words: jax.Array | None = None, rand_bits: int | None = None,
                    scale_exp: jax.Array | int = 0) -> jax.Array:
  """Rounds finite magnitude bits ``a`` / 2^scale_exp to a grid; returns f32 bits.

  The grid has ``man_bits`` mantissa bits and smallest normal exponent ``emin``
  (uniform quantum ``2^(emin - man_bits)`` below it), unbounded above: overflow is
  the caller's business. Dividing by the power of two ``2^scale_exp`` is folded into
  the exponent arithmetic, so block quantizers round ``x / scale`` exactly once.
  """
  sig, eb = split_bits(a)
  eb = eb - scale_exp  # exponent of x / 2^scale_exp
  shift = _I(23 - man_bits) + jnp.maximum(_I(emin) - eb, 0)
  shift_c = jnp.minimum(shift, 25).astype(jnp.uint32)  # sig < 2^24: 25 discards all
  kept = sig >> shift_c
  rem = sig & ((_U(1) << shift_c) - _U(1))
  if rounding == "nearest":
    half = _U(1) << (shift_c - _U(1))
    away = (rem > half) | ((rem == half) & ((kept & _U(1)) == _U(1)))
  elif rounding == "toward_zero":
    away = jnp.zeros(a.shape, jnp.bool_)
  elif rounding == "stochastic":
    if words is None:
      raise ValueError("stochastic rounding needs random words")
    r = 32 if rand_bits is None else int(rand_bits)
    r_eff = jnp.minimum(shift, _I(r))
    drop = shift - r_eff  # discarded bits below the r_eff used ones
    top = jnp.where(drop >= 32, _U(0),
                    rem >> jnp.minimum(drop, 31).astype(jnp.uint32))
    r_u = r_eff.astype(jnp.uint32)
    u = words >> (_U(32) - r_u)
    mask = _U(0xFFFFFFFF) >> (_U(32) - r_u)
    away = u > (mask - top)  # the carry of top + u out of r_eff bits
  else:
    raise ValueError(f"unknown rounding {rounding!r}")
  n = kept + away.astype(jnp.uint32)
  qe = jnp.maximum(eb, _I(emin)) - _I(man_bits)  # exponent of the grid quantum
  return compose_bits(n, qe)


def _apply_specials(x_bits, mag_bits, fmt, *, rounding, saturate):
  sign = x_bits & _U(0x80000000)
  a = x_bits & _U(0x7FFFFFFF)
  is_nan = a > _U(0x7F800000)
  is_inf = a == _U(0x7F800000)
  max_bits = _U(np.float32(fmt.max).view(np.uint32))
  overflow = mag_bits > max_bits  # magnitudes order like their bit patterns
  inf_b, nan_b = _U(0x7F800000), _U(0x7FC00000)
  # Finite overflow: toward_zero never overflows past max (IEEE), saturate clamps.
  if saturate or rounding == "toward_zero" or not (fmt.has_inf or fmt.has_nan):
    over = max_bits
  else:
    over = inf_b if fmt.has_inf else nan_b
  mag = jnp.where(overflow, over, mag_bits)
  if fmt.has_inf:
    inf_res = inf_b
  elif saturate or not fmt.has_nan:
    inf_res = max_bits
  else:
    inf_res = nan_b
  mag = jnp.where(is_inf, inf_res, mag)
  out = jnp.where(is_nan, nan_b, mag | sign)
  return out


def _round_grid(x, fmt, *, rounding, words, rand_bits, saturate):
  xb = lax.bitcast_convert_type(x, jnp.uint32)
  a = xb & _U(0x7FFFFFFF)
  finite_a = jnp.where(a >= _U(0x7F800000), _U(0), a)
  mag = round_magnitude(finite_a, fmt.man_bits, fmt.emin, rounding, words, rand_bits)
  return lax.bitcast_convert_type(
      _apply_specials(xb, mag, fmt, rounding=rounding, saturate=saturate), jnp.float32)


def _round_e8m0(x, fmt, *, rounding, words, rand_bits, saturate):
  # E8M0 has no subnormals: below 2^-126 (an f32 subnormal) round 2|x| on the grid
  # [2^-126, 2^-125] and halve; below 2^-127 there is no smaller value and no zero,
  # so it clamps up to 2^-127 (as ml_dtypes does).
  xb = lax.bitcast_convert_type(x, jnp.uint32)
  a = xb & _U(0x7FFFFFFF)
  tiny = a < _U(0x00800000)
  # Bit shifts double and halve exactly (floats would flush subnormals on XLA:CPU).
  doubled = jnp.maximum(a, _U(0x00400000)) << 1
  src = jnp.where(tiny, doubled, jnp.where(a >= _U(0x7F800000), _U(0), a))
  mag = round_magnitude(src, 0, -126, rounding, words, rand_bits)
  mag = jnp.where(tiny, mag >> 1, mag)
  out = _apply_specials(xb & _U(0x7FFFFFFF), mag, fmt, rounding=rounding,
                        saturate=saturate)
  # No zero and no sign: zero and negative inputs are NaN (as ml_dtypes).
  bad = (a == 0) | ((xb >> 31) == _U(1))
  out = jnp.where(bad, _U(0x7FC00000), out)
  return lax.bitcast_convert_type(out, jnp.float32)


@functools.partial(jax.jit, static_argnames=("fmt", "rounding", "saturate", "rand_bits",
                                             "rng"))
def _cast(x, key, *, fmt, rounding, saturate, rand_bits, rng):
  f = formats_lib.get(fmt)

  def run(x, key):
    words = None
    if rounding == "stochastic":
      words = random_bits_lib.random_words(key, x.shape, method=rng, shard_of=x)
    y = round_f32(x.astype(jnp.float32), f, rounding=rounding, words=words,
                  rand_bits=rand_bits, saturate=saturate)
    return y.astype(x.dtype)

  return gradients_lib.straight_through(run, x, key)


def cast(x: jax.Array, fmt: str | formats_lib.Format, *,
         rounding: Rounding = "nearest", key: jax.Array | None = None,
         saturate: bool = True, rand_bits: int | None = None,
         rng: random_bits_lib.Method = "hash") -> jax.Array:
  """Rounds ``x`` to the values of format ``fmt``.

  Args:
    x: float32, bfloat16 or float16 array, any shape.
    fmt: a format name (``numerics.formats.names()``) or Format.
    rounding: ``nearest`` (round half to even; bit-exact with ml_dtypes),
      ``stochastic`` (bit-level, unbiased; needs ``key``) or ``toward_zero``.
    key: JAX PRNG key for ``stochastic`` (and only then); the result is a pure
      function of it.
    saturate: clamp finite overflow to +-max (and Inf to +-max where the format has no
      Inf). ``False`` follows the format's own rule: NaN for e4m3/e8m0, Inf for
      e5m2/bf16/fp16; FP6/FP4/INT8 always saturate.
    rand_bits: random bits per element for ``stochastic`` (``None``: every discarded
      bit, up to 32). With ``r`` bits, P(round away) is the discarded fraction floored
      to a multiple of ``2^-r``.
    rng: random-word generator, ``hash`` (fast counter hash) or ``threefry``
      (``jax.random.bits``); see :mod:`numerics.random_bits`.

  Returns:
    An array of ``x``'s shape and dtype whose values are exactly representable in
    ``fmt``. Gradient: straight-through (the cotangent passes unchanged, as for
    ``x.astype``), also where the value saturated.

  Raises:
    ValueError: an unknown format or rounding, ``stochastic`` without a key, or a
      ``key``/``rand_bits``/``rng`` that a deterministic rounding would ignore.
  """
  f = formats_lib.get(fmt)
  check_rounding_args(rounding, key, rand_bits, rng)
  x = jnp.asarray(x)
  _check_input(x, f)
  return _cast(x, key, fmt=f.name, rounding=rounding, saturate=bool(saturate),
               rand_bits=rand_bits, rng=rng)


def check_rand_bits(rand_bits: int | None) -> None:
  """Raises ValueError unless ``rand_bits`` is None or an int in [1, 32]."""
  if rand_bits is not None and (isinstance(rand_bits, bool) or not (
      isinstance(rand_bits, (int, np.integer)) and 1 <= rand_bits <= 32)):
    raise ValueError(f"rand_bits must be an int in [1, 32] or None, got {rand_bits!r}")


@functools.partial(jax.jit, static_argnames=('fmt', 'saturate', 'rand_bits'))
def cast_with_words(x: jax.Array, fmt: str | formats_lib.Format, words: jax.Array, *,
                    saturate: bool = True, rand_bits: int | None = None) -> jax.Array:
  """Stochastic ``cast`` with caller-supplied uint32 random ``words`` (x's shape).

  For kernels, exhaustive tests and hardware-matching experiments that bring their
  own random bits.
  """
  f = formats_lib.get(fmt)
  x = jnp.asarray(x)
  _check_input(x, f, "cast_with_words")
  check_rand_bits(rand_bits)
  words = jnp.asarray(words)
  if words.dtype != jnp.uint32 or words.shape != x.shape:
    raise TypeError(f"words must be uint32 of shape {x.shape}, got "
                    f"{words.dtype}{list(words.shape)}")
  y = round_f32(x.astype(jnp.float32), f, rounding="stochastic", words=words,
                rand_bits=rand_bits, saturate=saturate)
  return y.astype(x.dtype)


def error_feedback(x: jax.Array, residual: jax.Array, fmt: str | formats_lib.Format, *,
                   saturate: bool = True) -> tuple[jax.Array, jax.Array]:
  """Error-feedback (sigma-delta) rounding: ``q = RNE(x + r)``, ``r' = (x + r) - q``.

  Args:
    x: float32 array (e.g. master weights or an update).
    residual: float32 array of x's shape carried between calls (start from zeros).
    fmt: target format.

  Returns:
    ``(rounded, new_residual)``, both float32. ``rounded`` is exact in ``fmt``; under
    RNE without overflow ``|new_residual| <= ulp(rounded) / 2``, so the running sum of
    ``rounded`` tracks the running sum of ``x`` and no small update is lost for good.
  """
  f = formats_lib.get(fmt)
  x = jnp.asarray(x)
  residual = jnp.asarray(residual)
  if x.dtype != jnp.float32 or residual.dtype != jnp.float32:
    raise TypeError(f"error_feedback expects float32 x and residual, got "
                    f"{x.dtype} and {residual.dtype}")
  if x.shape != residual.shape:
    raise ValueError(f"residual shape {residual.shape} != x shape {x.shape}")
  target = x + residual
  q = round_f32(target, f, rounding="nearest", saturate=saturate)
  return q, target - q
