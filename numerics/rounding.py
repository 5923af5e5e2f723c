"""Rounding to a format: nearest-even, stochastic, toward zero; error feedback.

Everything here works on the float32 bit pattern with uint32 integer arithmetic, so it
is exact, runs on any XLA backend (including FP6, which XLA on the CPU cannot cast to)
and is shared by the jnp reference and the Pallas kernels.

For ``|x|`` with significand ``sig`` (24 bits with the implicit one) and exponent
``e = floor(log2|x|)``, the target grid at ``x`` has quantum
``2^(max(e, emin) - man_bits)``; the ``shift = 23 - man_bits + max(0, emin - e)`` low
bits of ``sig`` are discarded. The kept integer ``N = sig >> shift`` is incremented
("rounded away", in magnitude) when

* :class:`Nearest`: the discarded bits exceed half, or equal half and ``N`` is odd
  (RNE);
* :class:`TowardZero`: never;
* :class:`Stochastic`: adding ``r`` uniform random bits to the top ``r`` discarded bits
  carries out, with ``r = min(bits, shift)`` (``bits=None``: all discarded bits, at
  most the 32 of one random word). So ``P(away)`` is exactly the discarded
  fraction of an ulp, floored to a multiple of ``2^-r``: unbiased when ``r >= shift``,
  biased toward zero by less than ``2^-r`` ulp otherwise.

The result ``N * quantum`` is rebuilt bit by bit, then overflow, Inf and NaN follow
the format's policy (see :mod:`numerics.formats`).

A rounding is a value (:data:`Rounding`: ``Nearest()``, ``TowardZero()``,
``Stochastic(bits=None, rng="hash")``; frozen, hashable, so static under ``jit``) that
validates itself and draws its own random words; :func:`parse` reads a name (a flag, a
sweep declaration) once. Modes that carry state between calls live with their users:
error feedback in :mod:`numerics.export`, Kahan summation in
:mod:`numerics.optim.master_weights`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.numerics import float_bits
from lowprec.numerics import formats as formats_lib
from lowprec.numerics import gradients as gradients_lib
from lowprec.numerics import random_bits as random_bits_lib

_FLOAT_INPUTS = (jnp.float32, jnp.bfloat16, jnp.float16)

_U = np.uint32
_I = np.int32


class _Deterministic:
  """Shared behaviour of the roundings that draw no random words."""
  needs_key: ClassVar[bool] = False

  def check_key(self, key, api: str = "") -> None:
    """Raises ValueError for a ``key``: this rounding would ignore it."""
    if key is not None:
      raise ValueError(f"{api + ': ' if api else ''}a PRNG key is used by Stochastic "
                       f"rounding only; {self!r} would ignore it")

  def words(self, key, shape, *, shard_of=None) -> None:
    """No random words (see :meth:`Stochastic.words`)."""
    del key, shape, shard_of
    return None

  def lazy_words(self, key, xp) -> None:
    """No random words (see :meth:`Stochastic.lazy_words`)."""
    del key, xp
    return None


@dataclasses.dataclass(frozen=True)
class Nearest(_Deterministic):
  """Round half to even (IEEE's default; bit-exact with ml_dtypes)."""
  name: ClassVar[str] = "nearest"

  def away(self, kept, rem, shift, shift_c, words):
    """bool: whether the kept integer ``kept`` goes up by one, given the discarded
    bits ``rem`` (``shift`` of them; ``shift_c`` clamped to 25) and the random
    ``words`` (:func:`round_magnitude`)."""
    del shift, words
    half = _U(1) << (shift_c - _U(1))
    return (rem > half) | ((rem == half) & ((kept & _U(1)) == _U(1)))


@dataclasses.dataclass(frozen=True)
class TowardZero(_Deterministic):
  """Truncate the magnitude (never rounds away; overflow stops at the format's max)."""
  name: ClassVar[str] = "toward_zero"

  def away(self, kept, rem, shift, shift_c, words):
    """Never away from zero (see :meth:`Nearest.away`)."""
    del rem, shift, shift_c, words
    return jnp.zeros(kept.shape, jnp.bool_)


@dataclasses.dataclass(frozen=True)
class Stochastic:
  """Bit-level stochastic rounding, unbiased with enough random bits (module docstring).

  Attributes:
    bits: random bits per element, an int in [1, 32]; None: every discarded bit, up to
      the 32 of one word. With ``r`` bits, P(round away) is the discarded fraction of an
      ulp floored to a multiple of ``2^-r``.
    rng: the random-word generator, ``"hash"`` (counter hash) or ``"threefry"``
      (:mod:`numerics.random_bits`).
  """
  bits: int | None = None
  rng: random_bits_lib.Method = "hash"
  name: ClassVar[str] = "stochastic"
  needs_key: ClassVar[bool] = True

  def __post_init__(self):
    bits = self.bits
    if bits is not None and (isinstance(bits, bool) or not (
        isinstance(bits, (int, np.integer)) and 1 <= bits <= 32)):
      raise ValueError(f"Stochastic bits must be an int in [1, 32] or None, got {bits!r}")
    if bits is not None:
      object.__setattr__(self, "bits", int(bits))
    if self.rng not in random_bits_lib.METHODS:
      raise ValueError(f"unknown rng {self.rng!r}; known: "
                       f"{', '.join(random_bits_lib.METHODS)}")

  def check_key(self, key, api: str = "") -> None:
    """Raises ValueError when ``key`` is None: the words are drawn from it."""
    if key is None:
      raise ValueError(f"{api + ': ' if api else ''}Stochastic rounding needs a PRNG "
                       f"key")

  def words(self, key: jax.Array, shape: tuple[int, ...], *, shard_of=None
            ) -> jax.Array:
    """uint32 random words of ``shape`` from ``key`` (this rounding's generator; a
    shard's own words inside ``shard_map`` when ``shard_of`` varies there)."""
    return random_bits_lib.random_words(key, shape, method=self.rng, shard_of=shard_of)

  def lazy_words(self, key: jax.Array, xp: jax.Array):
    """:meth:`words` for ``xp`` as a function: called where they are used (e.g. in
    ``lax.cond``'s branches) they fuse into the rounding instead of being
    materialized."""
    return lambda: self.words(key, xp.shape, shard_of=xp)

  def away(self, kept, rem, shift, shift_c, words):
    """Away when the top ``min(bits, shift)`` discarded bits plus as many random bits
    carry out (module docstring; see :meth:`Nearest.away`)."""
    del kept, shift_c
    if words is None:
      raise ValueError("stochastic rounding needs random words")
    r = 32 if self.bits is None else self.bits
    r_eff = jnp.minimum(shift, _I(r))
    drop = shift - r_eff  # discarded bits below the r_eff used ones
    top = jnp.where(drop >= 32, _U(0),
                    rem >> jnp.minimum(drop, 31).astype(jnp.uint32))
    r_u = r_eff.astype(jnp.uint32)
    u = words >> (_U(32) - r_u)
    mask = _U(0xFFFFFFFF) >> (_U(32) - r_u)
    return u > (mask - top)  # the carry of top + u out of r_eff bits


Rounding = Nearest | TowardZero | Stochastic
ROUNDINGS = (Nearest.name, Stochastic.name, TowardZero.name)


def parse(name: str, *, bits: int | None = None, rng: str = "hash",
          kinds: tuple[type, ...] = (Nearest, Stochastic, TowardZero)):
  """The rounding named ``name`` (one of ``ROUNDINGS``); ``bits`` and ``rng`` are
  :class:`Stochastic`'s. For reading flags, sweep declarations and recipe names; the
  library below takes the value. ``kinds``: the classes (each with a ``name``) a
  caller reads, e.g. an export's, which adds its own error feedback."""
  names = tuple(k.name for k in kinds)
  if name not in names:
    raise ValueError(f"unknown rounding {name!r}; known: {', '.join(names)}")
  kind = kinds[names.index(name)]
  if kind is Stochastic:
    return Stochastic(bits=bits, rng=rng)
  if bits is not None or rng != "hash":
    raise ValueError(f"random bits and rng are Stochastic rounding's; {name!r} would "
                     f"ignore them")
  return kind()


def check_rounding(rounding, api: str = "",
                   parser: str = "lowprec.numerics.rounding.parse",
                   kinds: tuple[type, ...] = (Nearest, TowardZero, Stochastic)):
  """``rounding`` if it is an instance of one of ``kinds`` (default: any
  :data:`Rounding`); else ValueError for another rounding, TypeError for anything else
  (naming the function ``parser`` for a name), each naming ``api``."""
  if isinstance(rounding, kinds):
    return rounding
  names = [f"{k.__name__}()" for k in kinds]
  names = ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]
  message = f"{api + ': ' if api else ''}rounding must be {names}, got {rounding!r}"
  if isinstance(rounding, (Nearest, TowardZero, Stochastic)):
    raise ValueError(message)
  hint = f"; parse names with {parser}({rounding!r})" if isinstance(rounding, str) else ""
  raise TypeError(message + hint)


def check_rounding_and_key(rounding, key, api: str = "") -> Rounding:
  """:func:`check_rounding`, and ``key`` fits it (a key for :class:`Stochastic`, none
  otherwise; else ValueError): the rounding check of every public quantizer."""
  check_rounding(rounding, api).check_key(key, api)
  return rounding


def check_kernel_rounding(rounding, key, api: str) -> Rounding:
  """:func:`check_rounding_and_key` for a Pallas kernel's entry point, which draws the
  ``"hash"`` generator's words in the kernel: ValueError for another generator."""
  check_rounding_and_key(rounding, key, api)
  if isinstance(rounding, Stochastic) and rounding.rng != "hash":
    raise ValueError(f"{api}: the kernels draw the 'hash' generator's words, got "
                     f"{rounding!r}; the jnp quantizers take other generators")
  return rounding


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
              words: jax.Array | None = None, saturate: bool = True) -> jax.Array:
  """Rounds float32 ``x`` to ``fmt``'s grid; returns float32 values exact in ``fmt``.

  This is the reference rounding every quantizer in the library uses. ``words`` are
  uint32 uniform random words of ``x``'s shape, required for :class:`Stochastic`.
  """
  if fmt.kind == "scale":
    return _round_e8m0(x, fmt, rounding=rounding, words=words, saturate=saturate)
  return _round_grid(x, fmt, rounding=rounding, words=words, saturate=saturate)


def round_magnitude(a: jax.Array, man_bits: int, emin: int, rounding: Rounding,
                    words: jax.Array | None = None,
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
  away = rounding.away(kept, rem, shift, shift_c, words)
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
  if saturate or isinstance(rounding, TowardZero) or not (fmt.has_inf or fmt.has_nan):
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


def _round_grid(x, fmt, *, rounding, words, saturate):
  xb = lax.bitcast_convert_type(x, jnp.uint32)
  a = xb & _U(0x7FFFFFFF)
  finite_a = jnp.where(a >= _U(0x7F800000), _U(0), a)
  mag = round_magnitude(finite_a, fmt.man_bits, fmt.emin, rounding, words)
  return lax.bitcast_convert_type(
      _apply_specials(xb, mag, fmt, rounding=rounding, saturate=saturate), jnp.float32)


def _round_e8m0(x, fmt, *, rounding, words, saturate):
  # E8M0 has no subnormals: below 2^-126 (an f32 subnormal) round 2|x| on the grid
  # [2^-126, 2^-125] and halve; below 2^-127 there is no smaller value and no zero,
  # so it clamps up to 2^-127 (as ml_dtypes does).
  xb = lax.bitcast_convert_type(x, jnp.uint32)
  a = xb & _U(0x7FFFFFFF)
  tiny = a < _U(0x00800000)
  # Bit shifts double and halve exactly (floats would flush subnormals on XLA:CPU).
  doubled = jnp.maximum(a, _U(0x00400000)) << 1
  src = jnp.where(tiny, doubled, jnp.where(a >= _U(0x7F800000), _U(0), a))
  mag = round_magnitude(src, 0, -126, rounding, words)
  mag = jnp.where(tiny, mag >> 1, mag)
  out = _apply_specials(xb & _U(0x7FFFFFFF), mag, fmt, rounding=rounding,
                        saturate=saturate)
  # No zero and no sign: zero and negative inputs are NaN (as ml_dtypes).
  bad = (a == 0) | ((xb >> 31) == _U(1))
  out = jnp.where(bad, _U(0x7FC00000), out)
  return lax.bitcast_convert_type(out, jnp.float32)


@functools.partial(jax.jit, static_argnames=("fmt", "rounding", "saturate"))
def _cast(x, key, *, fmt, rounding, saturate):
  f = formats_lib.get(fmt)

  def run(x, key):
    words = rounding.words(key, x.shape, shard_of=x)
    y = round_f32(x.astype(jnp.float32), f, rounding=rounding, words=words,
                  saturate=saturate)
    return y.astype(x.dtype)

  return gradients_lib.straight_through(run, x, key)


def cast(x: jax.Array, fmt: str | formats_lib.Format, *,
         rounding: Rounding = Nearest(), key: jax.Array | None = None,
         saturate: bool = True) -> jax.Array:
  """Rounds ``x`` to the values of format ``fmt``.

  Args:
    x: float32, bfloat16 or float16 array, any shape.
    fmt: a format name (``numerics.formats.names()``) or Format.
    rounding: ``Nearest()`` (round half to even; bit-exact with ml_dtypes),
      ``Stochastic(bits=..., rng=...)`` (bit-level, unbiased with enough bits; needs
      ``key``) or ``TowardZero()``.
    key: JAX PRNG key for ``Stochastic`` (and only then); the result is a pure
      function of it.
    saturate: clamp finite overflow to +-max (and Inf to +-max where the format has no
      Inf). ``False`` follows the format's own rule: NaN for e4m3/e8m0, Inf for
      e5m2/bf16/fp16; FP6/FP4/INT8 always saturate.

  Returns:
    An array of ``x``'s shape and dtype whose values are exactly representable in
    ``fmt``. Gradient: straight-through (the cotangent passes unchanged, as for
    ``x.astype``), also where the value saturated.

  Raises:
    TypeError: ``rounding`` is not a :data:`Rounding` (a name: :func:`parse` it).
    ValueError: an unknown format, ``Stochastic`` without a key, or a key that a
      deterministic rounding would ignore.
  """
  f = formats_lib.get(fmt)
  check_rounding_and_key(rounding, key, "cast")
  x = jnp.asarray(x)
  _check_input(x, f)
  return _cast(x, key, fmt=f.name, rounding=rounding, saturate=bool(saturate))


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
  rounding = Stochastic(bits=rand_bits)  # validates rand_bits
  words = jnp.asarray(words)
  if words.dtype != jnp.uint32 or words.shape != x.shape:
    raise TypeError(f"words must be uint32 of shape {x.shape}, got "
                    f"{words.dtype}{list(words.shape)}")
  y = round_f32(x.astype(jnp.float32), f, rounding=rounding, words=words,
                saturate=saturate)
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
  q = round_f32(target, f, rounding=Nearest(), saturate=saturate)
  return q, target - q
