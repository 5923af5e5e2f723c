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

from lowprec.numerics import float_bits
from lowprec.numerics import formats as formats_lib
from lowprec.numerics import gradients as gradients_lib
from lowprec.numerics import random_bits as random_bits_lib

Rounding = Literal["nearest", "stochastic", "toward_zero"]
ROUNDINGS = ("nearest", "stochastic", "toward_zero")
_FLOAT_INPUTS = (jnp.float32, jnp.bfloat16, jnp.float16)

_U = np.uint32
_I = np.int32

# Moved to numerics.float_bits; the names stay here for one release (docs/api.md).
leading_zeros = float_bits.leading_zeros
compose_bits = float_bits.compose_bits
round_bits_rn = float_bits.round_bits_rn
split_bits = float_bits.split_bits
ldexp_bits = float_bits.ldexp_bits
nonzero_magnitude = float_bits.nonzero_magnitude
div_rn = float_bits.div_rn
div_rn_idiv = float_bits.div_rn_idiv
mul_narrow = float_bits.mul_narrow


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


def round_magnitude(a: jax.Array, man_bits: int, emin: int, rounding: str,
                    words: jax.Array | None = None, rand_bits: int | None = None,
                    scale_exp: jax.Array | int = 0) -> jax.Array:
  """Rounds finite magnitude bits ``a`` / 2^scale_exp to a grid; returns f32 bits.

  The grid has ``man_bits`` mantissa bits and smallest normal exponent ``emin``
  (uniform quantum ``2^(emin - man_bits)`` below it), unbounded above: overflow is
  the caller's business. Dividing by the power of two ``2^scale_exp`` is folded into
  the exponent arithmetic, so block quantizers round ``x / scale`` exactly once.
  """
  sig, eb = float_bits.split_bits(a)
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
  return float_bits.compose_bits(n, qe)


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
