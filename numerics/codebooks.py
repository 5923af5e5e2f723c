"""Lookup-table (codebook) number formats and blockwise absmax quantization to them.

A :class:`Codebook` is a sorted table of float32 levels in [-1, 1]; a code is an index
into it. Values are quantized per block: the block's absolute maximum ``absmax`` is
kept in float32 and each element ``x`` is coded as a level near ``x / absmax``; it
decodes to ``level * absmax``. Adding a codebook is adding a row to ``_TABLE``.

=====================  ====  =====================================================
codebook               bits  levels (where from)
=====================  ====  =====================================================
``dynamic8``           8     bitsandbytes' signed dynamic map (8-bit Adam's first
                             moment; QLoRA's double quantization of the scales)
``dynamic8_unsigned``  8     its unsigned variant (8-bit Adam's second moment)
``dynamic4``           4     ``dynamic_map(signed=True, max_exponent_bits=3,
                             total_bits=4)`` (torchao ``Adam4bit``'s first moment)
``linear4_unsigned``   4     ``(k + 1) / 16``, k = 0..15: linear without zero
                             (torchao ``Adam4bit``'s second moment, after Li et al.
                             2023: a zero level turns small second moments into
                             huge updates)
``nf4``                4     QLoRA's NormalFloat4, the published constants
=====================  ====  =====================================================

The dynamic map (:func:`dynamic_map`) follows bitsandbytes' ``create_dynamic_map``
(Dettmers, "8-Bit Approximations for Parallelism in Deep Learning", 2016): for
``i = 0 .. E-1`` (``E = max_exponent_bits``) it takes ``N_i`` equal sub-intervals
of [0.1, 1] and adds their midpoints scaled by ``10^(i - E + 1)``, with both signs
when signed; ``N_i = 2^(i + B - 1 - E)`` signed and ``2^(i + B - E)`` unsigned for
``B = total_bits``; then 0 and 1. So levels are ``+-10^(i-E+1) * (0.1 + 0.9 (j +
1/2) / N_i)``: a decimal exponent with fewer fraction steps for smaller magnitudes.
bitsandbytes evaluates this in float32 torch arithmetic; here it is evaluated in
float64 and rounded once to float32, so a level can differ from bitsandbytes' table
by float32 rounding of its intermediate steps (a few ulp at most).

Rounding rules (tested against NumPy references):

* ``nearest``: the decision thresholds are the float32 midpoints of consecutive
  levels (float64 midpoint rounded to float32, which is also ``(lo + hi) * 0.5`` in
  float32); ``x`` takes the code above a threshold when ``x > threshold``, so a tie
  goes to the lower code (bitsandbytes' NF4 kernel compares with ``>`` against such
  literals). Values beyond the table clamp to the end levels (the signed dynamic map
  has 1 but not -1: -1 codes to -0.99296875, as in bitsandbytes).
* ``stochastic``: between neighbouring levels ``lo <= x <= hi`` the upper code is
  taken when ``u < (x - lo) / (hi - lo)`` with ``u`` the top 24 bits of a uniform
  32-bit word over 2^24. Levels never move; the expected decoded value equals ``x``
  up to the float32 rounding of the fraction and the 24-bit quantization of ``u``
  (a bias below 2^-21 of the gap ``hi - lo``).

Block scaling: ``absmax = max |x|`` per block in float32. A block whose absmax is not
finite (NaN or Inf inside) gets a NaN absmax, so it decodes to NaN (poisoned, as in
:mod:`numerics.blockscale`). A block whose absmax is below the smallest normal float32
(2^-126) gets absmax 0 and decodes to zeros: XLA:CPU flushes subnormal operands in
float arithmetic, so dividing by such a scale would otherwise give NaN; flushing
explicitly keeps the CPU, the device and the NumPy reference equal. Elements are
normalized as ``x * fl32(1 / absmax)`` (the reciprocal multiply of bitsandbytes'
kernels, and what XLA makes of ``x / absmax`` anyway) and decode as
``level * absmax`` (one float32 multiply; results below 2^-126 flush to zero on
XLA:CPU).

Gradients: codes are integers, so quantization has no gradient; dequantization is
differentiable with respect to the float scales only.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from lowprec.numerics import rounding as rounding_lib

_MIN_NORMAL = np.float32(2.0 ** -126)

# QLoRA's NormalFloat4 levels as published (bitsandbytes' NF4 table, also in its CUDA
# kernels): the normal quantiles of create_normal_map(offset=0.9677083), normalized
# to [-1, 1], with an exact zero and one more positive level than negative.
NF4_LEVELS = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
    0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0], dtype=np.float32)


def dynamic_map(signed: bool = True, max_exponent_bits: int = 7,
                total_bits: int = 8) -> np.ndarray:
  """bitsandbytes' dynamic quantization map: sorted float32 levels in [-1, 1].

  See the module docstring for the construction. Returns ``2**total_bits`` levels
  (torchao's copy of the construction, without bitsandbytes' zero padding to 256).
  """
  for name, v in (("max_exponent_bits", max_exponent_bits), ("total_bits", total_bits)):
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
      raise ValueError(f"{name} must be a positive int, got {v!r}")
  non_sign_bits = total_bits - 1
  if max_exponent_bits > non_sign_bits:
    raise ValueError(f"max_exponent_bits={max_exponent_bits} exceeds the "
                     f"{non_sign_bits} non-sign bits of total_bits={total_bits}")
  data: list[float] = []

  def add(i: int, n_fractions: int) -> None:
    boundaries = np.linspace(0.1, 1.0, n_fractions + 1)
    means = (boundaries[:-1] + boundaries[1:]) / 2.0
    scale = 10.0 ** (-(max_exponent_bits - 1) + i)
    data.extend((scale * means).tolist())
    if signed:
      data.extend((-scale * means).tolist())

  for i in range(max_exponent_bits):
    add(i, 2 ** (i + non_sign_bits - max_exponent_bits + (0 if signed else 1)))
  additional = 2 ** (non_sign_bits - max_exponent_bits) - 1
  if additional > 0:  # all exponent bits zero and no indicator bit (bitsandbytes)
    add(max_exponent_bits - 1, additional)
  data += [0.0, 1.0]
  if len(data) != 2 ** total_bits:
    raise ValueError(f"dynamic map with signed={signed}, max_exponent_bits="
                     f"{max_exponent_bits}, total_bits={total_bits} has {len(data)} "
                     f"levels, not {2 ** total_bits}")
  return np.sort(np.asarray(data, np.float64)).astype(np.float32)


def linear_unsigned_map(bits: int) -> np.ndarray:
  """``(k + 1) / 2^bits`` for ``k = 0 .. 2^bits - 1``: linear levels without zero."""
  n = 2 ** bits
  return (np.arange(1, n + 1, dtype=np.float64) / n).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Codebook:
  """A lookup-table format: ``2**bits`` sorted float32 levels in [-1, 1].

  Attributes:
    name: table name.
    bits: code width (4 or 8); 4-bit codes are stored two per byte.
    levels: the levels, ascending, as a tuple of floats (exact float32 values).
    source: where the levels come from.
  """

  name: str
  bits: int
  levels: tuple[float, ...]
  source: str

  def __post_init__(self):
    lv = np.asarray(self.levels, np.float32)
    if lv.shape != (2 ** self.bits,):
      raise ValueError(f"codebook {self.name!r} needs {2 ** self.bits} levels, got "
                       f"{lv.shape}")
    if not (np.all(np.diff(lv) > 0) and lv[0] >= -1 and lv[-1] <= 1):
      raise ValueError(f"codebook {self.name!r}: levels must increase strictly "
                       f"within [-1, 1]")

  @property
  def signed(self) -> bool:
    """True when the table has negative levels."""
    return self.levels[0] < 0

  @functools.cached_property
  def levels_array(self) -> np.ndarray:
    """float32[2**bits] levels."""
    return np.asarray(self.levels, np.float32)

  @functools.cached_property
  def thresholds(self) -> np.ndarray:
    """float32[2**bits - 1] decision thresholds: midpoints of consecutive levels."""
    lv = self.levels_array.astype(np.float64)
    return ((lv[:-1] + lv[1:]) / 2.0).astype(np.float32)

  def __repr__(self) -> str:
    return f"Codebook({self.name})"


def _row(name: str, bits: int, levels: np.ndarray, source: str) -> Codebook:
  return Codebook(name, bits, tuple(float(v) for v in levels), source)


_TABLE: dict[str, Codebook] = {
    c.name: c for c in (
        _row("dynamic8", 8, dynamic_map(True, 7, 8),
             "bitsandbytes create_dynamic_map(signed=True)"),
        _row("dynamic8_unsigned", 8, dynamic_map(False, 7, 8),
             "bitsandbytes create_dynamic_map(signed=False)"),
        _row("dynamic4", 4, dynamic_map(True, 3, 4),
             "torchao Adam4bit: create_dynamic_map(True, 3, 4)"),
        _row("linear4_unsigned", 4, linear_unsigned_map(4),
             "torchao Adam4bit: linspace(0, 1, 17)[1:]"),
        _row("nf4", 4, NF4_LEVELS, "QLoRA NormalFloat4 (published constants)"),
    )
}


def names() -> tuple[str, ...]:
  """The names of all known codebooks, in table order."""
  return tuple(_TABLE)


def get(book: str | Codebook) -> Codebook:
  """Looks up a codebook by name (a :class:`Codebook` is returned unchanged)."""
  if isinstance(book, Codebook):
    return book
  if not isinstance(book, str):
    raise TypeError(f"codebook must be a name or a Codebook, got {type(book).__name__}")
  try:
    return _TABLE[book]
  except KeyError:
    raise ValueError(f"unknown codebook {book!r}; known: {', '.join(names())}") from None


@functools.partial(jax.jit, static_argnames=("book", "rounding"))
def encode(n: jax.Array, book: str | Codebook, *,
           rounding: rounding_lib.Rounding = rounding_lib.Nearest(),
           words: jax.Array | None = None) -> jax.Array:
  """uint8 codes of normalized float32 values ``n`` (any shape; see module rules).

  Args:
    n: float32 values, normally in [-1, 1] (outside clamps to the end levels).
    book: the codebook.
    rounding: ``Nearest()`` or ``Stochastic()`` (its ``bits`` and ``rng`` unused: the
      caller brings the words).
    words: uint32 uniform random words of ``n``'s shape, for ``Stochastic()``.
  """
  b = get(book)
  n = rounding_lib.check_float_input(n, "codebooks.encode").astype(jnp.float32)
  rounding_lib.check_rounding(rounding, "codebooks.encode",
                              kinds=(rounding_lib.Nearest, rounding_lib.Stochastic))
  if not rounding.needs_key:
    if words is not None:
      raise ValueError("words are only used with Stochastic rounding")
    return jnp.searchsorted(jnp.asarray(b.thresholds), n, side="left").astype(jnp.uint8)
  if words is None or words.dtype != jnp.uint32 or words.shape != n.shape:
    raise ValueError(f"stochastic rounding needs uint32 words of shape {n.shape}")
  lv = jnp.asarray(b.levels_array)
  k = jnp.clip(jnp.searchsorted(lv, n, side="right") - 1, 0, lv.shape[0] - 2)
  lo, hi = lv[k], lv[k + 1]
  frac = jnp.clip((n - lo) / (hi - lo), 0.0, 1.0)
  u = (words >> np.uint32(8)).astype(jnp.float32) * np.float32(2.0 ** -24)
  return (k + (u < frac).astype(k.dtype)).astype(jnp.uint8)


@functools.partial(jax.jit, static_argnames=("book",))
def decode(codes: jax.Array, book: str | Codebook) -> jax.Array:
  """float32 levels of uint8 ``codes`` (exact table lookup)."""
  return jnp.take(jnp.asarray(get(book).levels_array), jnp.asarray(codes).astype(jnp.int32))


def block_absmax(x_NxB: jax.Array, min_absmax: float = float(_MIN_NORMAL)) -> jax.Array:
  """float32[N] per-row absmax: NaN if not finite, 0 below ``min_absmax`` (2^-126)."""
  a = jnp.max(jnp.abs(x_NxB), axis=-1)
  a = jnp.where(jnp.isfinite(a), a, np.float32(np.nan))
  return jnp.where(a < np.float32(min_absmax), np.float32(0.0), a)


def normalize(x_NxB: jax.Array, absmax_N: jax.Array) -> jax.Array:
  """``x * fl32(1 / absmax)`` per row; 0 for rows with absmax 0 or NaN.

  Written as a reciprocal multiply (bitsandbytes' kernels do the same) because XLA
  rewrites ``x / broadcast(absmax)`` into exactly this, so spelling it keeps eager,
  jit, every backend and the NumPy reference equal.
  """
  ok = absmax_N > 0
  inv = np.float32(1.0) / jnp.where(ok, absmax_N, np.float32(1.0))
  return jnp.where(ok[:, None], x_NxB * inv[:, None], np.float32(0.0))


@functools.partial(jax.jit, static_argnames=("book", "rounding"))
def quantize_blocks(x_NxB: jax.Array, book: str | Codebook, *,
                    rounding: rounding_lib.Rounding = rounding_lib.Nearest(),
                    words: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Blockwise absmax quantization of float32 rows: (uint8 codes [N, B], absmax [N])."""
  x = rounding_lib.check_float_input(x_NxB, "codebooks.quantize_blocks").astype(
      jnp.float32)
  if x.ndim != 2:
    raise ValueError(f"expected a [blocks, block_size] array, got shape {x.shape}")
  absmax = block_absmax(x)
  return encode(normalize(x, absmax), book, rounding=rounding, words=words), absmax


@functools.partial(jax.jit, static_argnames=("book",))
def dequantize_blocks(codes_NxB: jax.Array, absmax_N: jax.Array,
                      book: str | Codebook) -> jax.Array:
  """float32 [N, B]: ``level[code] * absmax`` per row."""
  return decode(codes_NxB, book) * jnp.asarray(absmax_N, jnp.float32)[:, None]
