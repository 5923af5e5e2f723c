"""Block-scaled quantization: OCP MX (E8M0 scales) and NVFP4 (E4M3 scales + fp32).

Layouts: 1D blocks of ``block_size`` consecutive elements along ``axis``, or tiles
``block_shape=(b0, b1, ...)`` over ``axis`` (a tuple) or, by default, the last
``len(block_shape)`` axes; ``block_shape=(32, 32)`` gives the 2D weight tiles of ALTO.
An axis whose length the block does not divide raises, unless ``pad=True`` (zeros are
appended, which leaves every block's amax unchanged, and ``dequantize`` slices them off).

MX scale rules (``scale_rule``), for a block with ``amax = max|x|`` and an element
format whose largest binade is ``emax`` and largest value ``max``:

* ``floor`` (OCP MX v1.0 §6.3, the default): ``e = floor(log2 amax) - emax``.
  ``amax / 2^e`` lies in ``[2^emax, 2^(emax+1))`` and can exceed ``max`` (E4M3: 448
  < 512, E2M1: 6 < 8); those elements saturate to ``max`` (e.g. MXFP8 957 -> 896).
* ``ceil``: ``e = ceil(log2 amax) - emax``; never saturates, loses a binade of range.
* ``rceil``: the smallest ``e`` with ``amax <= max * 2^e`` (the cuBLAS/TE UE8M0 rule,
  never saturates), computed exactly; hardware that forms ``amax * (1/max)`` in f32
  can differ when that product is within an ulp of a power of two.
* ``even``: round ``amax`` to the element's mantissa width (add half of the discarded
  bits), then ``floor`` (torchao's EVEN).
* ``alto``: round ``amax`` to one mantissa bit, then ``floor`` (ALTO's
  ``_calculate_scales``; equal to ``even`` for E2M1).

``e`` is clamped to the E8M0 range [-127, 127] (code ``e + 127``). Elements are
``x / 2^e`` rounded once (RNE by default, or stochastic) with saturation to ``+-max``.

Special blocks (tested):

* all-zero block: scale code 0 (2^-127), zero elements (as microxcaling and torchao,
  which take log2 of amax plus the smallest normal);
* a block holding NaN or +-Inf: scale code 0xFF (NaN) and zero element codes, so the
  whole block dequantizes to NaN (OCP: a NaN scale makes every element NaN);
* a block of float32 subnormals only: ``floor(log2 amax)`` is taken from the bits, so
  the scale clamps at 2^-127 and the elements keep what precision the format has.

NVFP4 (:func:`quantize_nvfp4`) follows Transformer Engine's chain (as transcribed by
torchao's NVFP4 training reference): tensor ``S_enc = min(448*6 / amax, FLT_MAX)`` (1
when amax is 0), block scale ``S_dec = e4m3(min(block_amax * (S_enc * (1/6)), 448))``,
elements ``e2m1(x * min(1 / (S_dec * (1/S_enc)), FLT_MAX))`` with RNE and saturation,
decode ``x = e2m1 * S_dec * (1/S_enc)``. Our choices where TE is silent: the tensor
amax ignores NaN/Inf, and a block holding them gets the NaN scale (E4M3 0x7F).

All amax and exponent arithmetic is done on the bit patterns: XLA:CPU flushes float32
subnormals to zero in float arithmetic, which would silently change scales. NVFP4's
three divisions use :func:`numerics.rounding.div_rn` (IEEE round-to-nearest from
integer ops: GPU Triton kernels divide approximately, TPUs by a reciprocal estimate),
and its two products with a possibly subnormal operand (``block_amax * S_enc/6`` and
``x * enc``) rescale that operand in the bits first, so NVFP4 gives the spec's float32
bits on every backend (tested against NumPy), including for float32 subnormal inputs.
What remains backend-dependent: a tensor whose amax is below ``2688 * 2^-126``
(3.2e-35) has a subnormal ``1/S_enc``, and dequantized values below 2^-126 are
subnormal; CPU and TPU arithmetic flush both to zero.
"""

from __future__ import annotations

import functools

import dataclasses
from typing import Literal, Sequence

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from numerics import encoding
from numerics import formats as formats_lib
from numerics import random_bits as random_bits_lib
from numerics import rounding as rounding_lib

ScaleRule = Literal["floor", "ceil", "rceil", "even", "alto"]
SCALE_RULES = ("floor", "ceil", "rceil", "even", "alto")
MX_ELEMENT_FORMATS = ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "int8")
MX_BLOCK = 32  # OCP MX v1.0: elements per shared E8M0 scale
NVFP4_BLOCK = 16
_U = np.uint32
_I = np.int32
_FLT_MAX = np.float32(np.finfo(np.float32).max)


@dataclasses.dataclass(frozen=True)
class QuantizedArray:
  """A block-scaled tensor (a pytree; the layout fields are static metadata).

  Attributes:
    codes: uint8 element codes, shape ``padded_shape`` (see :mod:`numerics.encoding`).
    scales: uint8 scale codes (E8M0 for MX, E4M3 for NVFP4); the shape of ``codes``
      with every blocked axis divided by its block extent.
    tensor_scale: float32 scalar decode multiplier (1 for MX; NVFP4's ``1/S_enc``).
    fmt: element format name.
    scale_fmt: ``e8m0`` or ``e4m3``.
    axes: the blocked axes (non-negative).
    block_shape: block extent along each of ``axes``.
    shape: the original (unpadded) shape.
    scale_rule: the MX scale rule used (``nvfp4`` for NVFP4).
  """

  codes: jax.Array
  scales: jax.Array
  tensor_scale: jax.Array
  fmt: str
  scale_fmt: str
  axes: tuple[int, ...]
  block_shape: tuple[int, ...]
  shape: tuple[int, ...]
  scale_rule: str

  @property
  def padded_shape(self) -> tuple[int, ...]:
    return tuple(self.codes.shape)

  def element_values(self) -> jax.Array:
    """float32 element values (before scaling), shape ``padded_shape``."""
    return encoding.decode(self.codes, self.fmt)

  def scale_values(self) -> jax.Array:
    """float32 block scales, shape of ``scales`` (NaN for poisoned blocks)."""
    return encoding.decode(self.scales, self.scale_fmt)


jax.tree_util.register_dataclass(
    QuantizedArray, data_fields=["codes", "scales", "tensor_scale"],
    meta_fields=["fmt", "scale_fmt", "axes", "block_shape", "shape", "scale_rule"])


def _layout(ndim: int, block_size: int | None, axis, block_shape) -> tuple[
    tuple[int, ...], tuple[int, ...]]:
  if block_shape is None:
    if block_size is None:
      raise ValueError("give block_size or block_shape")
    if isinstance(axis, (tuple, list)):
      raise ValueError("a 1D block (block_size) takes a single axis; use block_shape "
                       "for tiles over several axes")
    axes, blocks = (axis,), (block_size,)
  else:
    blocks = tuple(block_shape)
    if isinstance(axis, (tuple, list)):
      axes = tuple(axis)
    else:
      axes = tuple(range(-len(blocks), 0))
    if len(axes) != len(blocks):
      raise ValueError(f"block_shape {blocks} needs {len(blocks)} axes, got {axes}")
  norm = []
  for a in axes:
    if not isinstance(a, (int, np.integer)) or not -ndim <= a < ndim:
      raise ValueError(f"axis {a} out of range for a {ndim}-d array")
    norm.append(int(a) % ndim)
  if len(set(norm)) != len(norm):
    raise ValueError(f"repeated axis in {axes}")
  for b in blocks:
    if not isinstance(b, (int, np.integer)) or b < 1:
      raise ValueError(f"block extents must be positive ints, got {blocks}")
  order = np.argsort(norm)
  return tuple(norm[i] for i in order), tuple(int(blocks[i]) for i in order)


def pad_to_multiple(x: jax.Array, axes: Sequence[int], multiples: Sequence[int]
                    ) -> jax.Array:
  """``x`` zero-padded at the end of each of ``axes`` to a multiple of the matching
  entry of ``multiples`` (unchanged where it already is one); same dtype.

  Zeros never raise a block's amax, so padding leaves every block scale unchanged."""
  x = jnp.asarray(x)
  widths = [(0, 0)] * x.ndim
  for a, m in zip(axes, multiples):
    widths[a % x.ndim] = (0, (-x.shape[a]) % m)
  return jnp.pad(x, widths) if any(w != (0, 0) for w in widths) else x


def _pad(x: jax.Array, axes, blocks, pad: bool) -> jax.Array:
  if not pad:
    for a, b in zip(axes, blocks):
      if x.shape[a] % b:
        raise ValueError(
            f"axis {a} of shape {x.shape} has length {x.shape[a]}, not divisible by "
            f"the block extent {b}; pass pad=True to zero-pad it")
  return pad_to_multiple(x, axes, blocks)


def _blocked_shape(shape, axes, blocks):
  """Shape with each blocked axis split as (n, b), and the positions of the b's."""
  out, bpos = [], []
  for i, d in enumerate(shape):
    if i in axes:
      b = blocks[axes.index(i)]
      out += [d // b, b]
      bpos.append(len(out) - 1)
    else:
      out.append(d)
  return tuple(out), tuple(bpos)


def _block_amax_bits(a: jax.Array, axes, blocks) -> jax.Array:
  """Per-block max of magnitude bits ``a`` (uint32), broadcastable to ``a``'s blocks.

  Reduced as int32 (magnitude bits are below 2^31, so the order is the same): Mosaic
  TPU kernels, which run this code, have no unsigned reductions.
  """
  bshape, bpos = _blocked_shape(a.shape, axes, blocks)
  m = jnp.max(lax.bitcast_convert_type(a, jnp.int32).reshape(bshape), axis=bpos,
              keepdims=True)
  return lax.bitcast_convert_type(m, jnp.uint32), bshape, bpos


def _floor_log2(bits: jax.Array) -> jax.Array:
  """floor(log2 v) for positive finite float32 bits (subnormals via clz)."""
  e32 = (bits >> 23).astype(jnp.int32)
  sub = _I(31) - lax.clz(bits).astype(jnp.int32) - _I(149)
  return jnp.where(e32 > 0, e32 - 127, sub)


def _normalized_sig(bits: jax.Array) -> jax.Array:
  """24-bit significand with its leading one at bit 23 (subnormals shifted up)."""
  e32 = bits >> 23
  sub = bits << jnp.clip(lax.clz(bits).astype(jnp.int32) - 8, 0, 31).astype(jnp.uint32)
  return jnp.where(e32 > 0, (bits & _U(0x7FFFFF)) | _U(0x800000), sub)


def _round_amax_mantissa(bits: jax.Array, keep: int) -> jax.Array:
  """amax bits with the mantissa rounded (half up) to ``keep`` bits."""
  return bits + _U(1 << (22 - keep))


def mx_scale_exponent(amax_bits: jax.Array, fmt: formats_lib.Format,
                      scale_rule: str) -> jax.Array:
  """OCP E8M0 scale code (int32 in [0, 254]) for block amax bits (finite, >= 0)."""
  m = fmt.man_bits if fmt.kind == "float" else 7
  if scale_rule == "floor":
    e = _floor_log2(amax_bits) - fmt.emax
  elif scale_rule == "ceil":
    sig = _normalized_sig(amax_bits)
    e = _floor_log2(amax_bits) - fmt.emax + (sig != _U(0x800000)).astype(jnp.int32)
  elif scale_rule == "rceil":
    e0 = _floor_log2(amax_bits) - fmt.emax
    max_sig = _U((np.float32(fmt.max).view(np.uint32) & 0x7FFFFF) | 0x800000)
    e = e0 + (_normalized_sig(amax_bits) > max_sig).astype(jnp.int32)
  elif scale_rule == "even":
    e = _floor_log2(_round_amax_mantissa(amax_bits, m)) - fmt.emax
  elif scale_rule == "alto":
    e = _floor_log2(_round_amax_mantissa(amax_bits, 1)) - fmt.emax
  else:
    raise ValueError(f"unknown scale_rule {scale_rule!r}; known: {', '.join(SCALE_RULES)}")
  # OCP's code counts from the spec's emax_elem (MXINT8 carries an implicit 2^-6).
  code = e + (fmt.emax - fmt.mx_emax) + 127
  code = jnp.where(amax_bits == 0, 0, code)
  return jnp.clip(code, 0, 254)


def _check_x(x: jax.Array) -> jax.Array:
  x = jnp.asarray(x)
  if x.dtype not in (jnp.float32, jnp.bfloat16, jnp.float16):
    raise TypeError(f"expected a float32, bfloat16 or float16 array, got {x.dtype}")
  if x.ndim == 0:
    raise ValueError("block quantization needs an array with at least one axis")
  return x.astype(jnp.float32)


def _words(key, shape, rounding, rng):
  if rounding == "stochastic":
    if key is None:
      raise ValueError("rounding='stochastic' needs a PRNG key")
    return random_bits_lib.random_words(key, shape, method=rng)
  if rounding not in rounding_lib.ROUNDINGS:
    raise ValueError(f"unknown rounding {rounding!r}; known: "
                     f"{', '.join(rounding_lib.ROUNDINGS)}")
  return None


def _round_elements(a, sign, fmt, scale_exp, rounding, words, rand_bits):
  """Element values of magnitude bits ``a`` / 2^scale_exp, saturated, as f32 bits."""
  mag = rounding_lib.round_magnitude(a, fmt.man_bits, fmt.emin, rounding, words,
                                     rand_bits, scale_exp=scale_exp)
  max_bits = _U(np.float32(fmt.max).view(np.uint32))
  return jnp.minimum(mag, max_bits) | (sign << 31)


def _mx_elements(xp, f, axes, blocks, scale_rule, rounding, words, rand_bits):
  """(element f32 bits with sign, scale codes (blocked shape), s_int, poisoned)."""
  b = lax.bitcast_convert_type(xp, jnp.uint32)
  sign = b >> 31
  a = b & _U(0x7FFFFFFF)
  amax, bshape, bpos = _block_amax_bits(a, axes, blocks)
  poisoned = amax >= _U(0x7F800000)
  code = mx_scale_exponent(jnp.where(poisoned, _U(0), amax), f, scale_rule)
  # Internal grid exponent: the element grid of ``f`` times 2^s_int.
  s_int = code - 127 - (f.emax - f.mx_emax)
  s_full = jnp.broadcast_to(s_int, bshape).reshape(xp.shape)
  poison_full = jnp.broadcast_to(poisoned, bshape).reshape(xp.shape)
  a_fin = jnp.where(poison_full, _U(0), a)
  elem = _round_elements(a_fin, sign, f, s_full, rounding, words, rand_bits)
  scale_codes = jnp.where(poisoned, 255, code).astype(jnp.uint8)
  return elem, jnp.squeeze(scale_codes, axis=bpos), s_full, poison_full


def block_statistic(x: jax.Array, stat, *, block_size: int | None = None,
                    axis: int | Sequence[int] = -1,
                    block_shape: Sequence[int] | None = None, pad: bool = False
                    ) -> jax.Array:
  """A per-block statistic of float32 ``x``, broadcast back to ``x``'s shape.

  Blocks are laid out as in :func:`quantize_mx`. ``stat(values, valid, axes)`` gets
  the blocked float32 values, a same-shape bool mask that is False on padding, and the
  in-block axes; it must reduce over ``axes`` with ``keepdims=True``.
  """
  x = _check_x(x)
  axes, blocks = _layout(x.ndim, block_size, axis, block_shape)
  xp = _pad(x, axes, blocks, pad)
  valid = _pad(jnp.ones(x.shape, bool), axes, blocks, pad)
  bshape, bpos = _blocked_shape(xp.shape, axes, blocks)
  out = stat(xp.reshape(bshape), valid.reshape(bshape), bpos)
  out = jnp.broadcast_to(out, bshape).reshape(xp.shape)
  return out[tuple(slice(0, d) for d in x.shape)]


def block_amax_bits(x: jax.Array, *, block_size: int | None = None,
                    axis: int | Sequence[int] = -1,
                    block_shape: Sequence[int] | None = None, pad: bool = False,
                    finite_only: bool = False) -> jax.Array:
  """uint32 magnitude bits of each element's block amax, broadcast to ``x``'s shape.

  The amax every MX scale rule starts from, on the float32 bit patterns (so float32
  subnormals are not flushed): ``>= 0x7F800000`` for a block holding NaN or Inf, unless
  ``finite_only`` leaves NaN and Inf out of the max. Blocks are laid out as in
  :func:`quantize_mx`; padding (``pad=True``) is zeros, which never raise the amax.
  ``lax.bitcast_convert_type(bits, jnp.float32)`` is the amax as a float.
  """
  x = _check_x(x)
  axes, blocks = _layout(x.ndim, block_size, axis, block_shape)
  a = lax.bitcast_convert_type(_pad(x, axes, blocks, pad), jnp.uint32) & _U(0x7FFFFFFF)
  if finite_only:
    a = jnp.where(a >= _U(0x7F800000), _U(0), a)
  amax, bshape, _ = _block_amax_bits(a, axes, blocks)
  out = jnp.broadcast_to(amax, bshape).reshape(a.shape)
  return out[tuple(slice(0, d) for d in x.shape)]


def mx_grid_exponents(x: jax.Array, fmt: str | formats_lib.Format = "e4m3", *,
                      block_size: int | None = 32, axis: int | Sequence[int] = -1,
                      block_shape: Sequence[int] | None = None,
                      scale_rule: ScaleRule = "floor", pad: bool = False) -> jax.Array:
  """int32 ``s`` per element (x's shape): MX rounds ``x / 2^s`` onto ``fmt``'s grid.

  The block scale of each element's block in the element format's own units (the
  E8M0 code minus its bias, less MXINT8's implicit 2^-6), for tools that need the
  quantization bin of a value (e.g. differential gradient estimation). NaN/Inf blocks
  get the all-zero-block exponent.
  """
  f = formats_lib.get(fmt)
  x = _check_x(x)
  axes, blocks = _layout(x.ndim, block_size, axis, block_shape)
  xp = _pad(x, axes, blocks, pad)
  a = lax.bitcast_convert_type(xp, jnp.uint32) & _U(0x7FFFFFFF)
  amax, bshape, _ = _block_amax_bits(a, axes, blocks)
  amax = jnp.where(amax >= _U(0x7F800000), _U(0), amax)
  s_int = mx_scale_exponent(amax, f, scale_rule) - 127 - (f.emax - f.mx_emax)
  out = jnp.broadcast_to(s_int, bshape).reshape(xp.shape)
  return out[tuple(slice(0, d) for d in x.shape)]


def mx_quantize_core(xp: jax.Array, f: formats_lib.Format, axes: tuple[int, ...],
                     blocks: tuple[int, ...], scale_rule: str, rounding: str,
                     words: jax.Array | None, rand_bits: int | None
                     ) -> tuple[jax.Array, jax.Array]:
  """(element codes, E8M0 scale codes) of float32 ``xp`` (block-divisible shape).

  The whole MX algorithm in plain jnp integer ops; :func:`quantize_mx` and the Pallas
  kernel in :mod:`numerics.kernels.mx_quantizers` both run exactly this code (their
  tests hold both against the independent NumPy reference, not only each other).
  """
  elem, scale_codes, _, poison = _mx_elements(xp, f, axes, blocks, scale_rule,
                                              rounding, words, rand_bits)
  codes = encoding.encode(lax.bitcast_convert_type(elem, jnp.float32), f)
  return jnp.where(poison, jnp.uint8(0), codes), scale_codes


def _mx_prologue(x, fmt, block_size, axis, block_shape, pad, key, rounding, rng,
                 rand_bits):
  """Validated (format, float32 x, axes, blocks, padded x, random words) for MX."""
  f = formats_lib.get(fmt)
  if f.name not in MX_ELEMENT_FORMATS:
    raise ValueError(f"MX element format must be one of {MX_ELEMENT_FORMATS}, got "
                     f"{f.name!r}")
  x = _check_x(x)
  axes, blocks = _layout(x.ndim, block_size, axis, block_shape)
  xp = _pad(x, axes, blocks, pad)
  words = _words(key, xp.shape, rounding, rng)
  rounding_lib.check_rand_bits(rand_bits)
  return f, x, axes, blocks, xp, words


_MX_STATIC = ("fmt", "block_size", "axis", "block_shape", "scale_rule", "rounding",
              "rand_bits", "pad", "rng")


@functools.partial(jax.jit, static_argnames=_MX_STATIC)
def quantize_dequantize_mx(x: jax.Array, fmt: str | formats_lib.Format = "e4m3", *,
                           block_size: int = MX_BLOCK, axis: int | Sequence[int] = -1,
                           block_shape: Sequence[int] | None = None,
                           scale_rule: ScaleRule = "floor", rounding: str = "nearest",
                           key: jax.Array | None = None, rand_bits: int | None = None,
                           pad: bool = False, rng: random_bits_lib.Method = "hash"
                           ) -> jax.Array:
  """``dequantize(quantize_mx(x, ...))`` without forming codes (fake quantization).

  The fused path for training: the rounded elements are scaled back by integer
  exponent arithmetic, skipping the uint8 encode/decode. Equal bit for bit to the
  two-step form (tested). Arguments as :func:`quantize_mx`; returns float32.
  """
  f, x, axes, blocks, xp, words = _mx_prologue(x, fmt, block_size, axis, block_shape,
                                               pad, key, rounding, rng, rand_bits)
  out = mx_quantize_dequantize_core(xp, f, axes, blocks, scale_rule, rounding, words,
                                    rand_bits)
  return out[tuple(slice(0, d) for d in x.shape)]


def mx_quantize_dequantize_core(xp: jax.Array, f: formats_lib.Format,
                                axes: tuple[int, ...], blocks: tuple[int, ...],
                                scale_rule: str, rounding: str, words: jax.Array | None,
                                rand_bits: int | None) -> jax.Array:
  """float32 ``dequantize(quantize_mx(xp))`` of a block-divisible float32 ``xp``.

  Integer ops only (the elements are scaled back by exponent arithmetic); run by
  :func:`quantize_dequantize_mx` and by the fused Pallas kernel in
  :mod:`numerics.kernels.mx_quantizers`.
  """
  elem, _, s_full, poison = _mx_elements(xp, f, axes, blocks, scale_rule, rounding,
                                         words, rand_bits)
  mag = rounding_lib.ldexp_bits(elem & _U(0x7FFFFFFF), s_full)
  sign = elem & _U(0x80000000)
  if not f.kind == "float":  # INT8 has no negative zero
    sign = jnp.where(mag == 0, _U(0), sign)
  out = lax.bitcast_convert_type(mag | sign, jnp.float32)
  return jnp.where(poison, np.float32(np.nan), out)


@functools.partial(jax.jit, static_argnames=_MX_STATIC)
def quantize_mx(x: jax.Array, fmt: str | formats_lib.Format = "e4m3", *,
                block_size: int = MX_BLOCK, axis: int | Sequence[int] = -1,
                block_shape: Sequence[int] | None = None,
                scale_rule: ScaleRule = "floor", rounding: str = "nearest",
                key: jax.Array | None = None, rand_bits: int | None = None,
                pad: bool = False, rng: random_bits_lib.Method = "hash"
                ) -> QuantizedArray:
  """OCP MX block quantization with E8M0 scales.

  Args:
    x: float32/bfloat16/float16 array.
    fmt: element format: e4m3, e5m2 (MXFP8), e2m3, e3m2 (MXFP6), e2m1 (MXFP4), int8.
    block_size: 1D block length along ``axis`` (OCP MX: 32).
    axis: blocked axis, or a tuple of axes for ``block_shape``.
    block_shape: tile extents for 2D (or nD) blocks, e.g. ``(32, 32)``.
    scale_rule: floor (OCP), ceil, rceil, even, alto (see the module docstring).
    rounding: element rounding, ``nearest`` (RNE) or ``stochastic`` (needs ``key``;
      the scale stays deterministic) or ``toward_zero``.
    key, rand_bits, rng: stochastic rounding's key, random bits per element and
      generator, as in :func:`numerics.cast`; words are indexed by the row-major
      position in the padded array.
    pad: zero-pad blocked axes to a multiple of the block instead of raising.

  Returns:
    A :class:`QuantizedArray`; ``dequantize`` gives ``element * 2^(code - 127)``.
  """
  f, x, axes, blocks, xp, words = _mx_prologue(x, fmt, block_size, axis, block_shape,
                                               pad, key, rounding, rng, rand_bits)
  shape = tuple(x.shape)
  codes, scale_codes = mx_quantize_core(xp, f, axes, blocks, scale_rule, rounding,
                                       words, rand_bits)
  return QuantizedArray(codes=codes, scales=scale_codes,
                        tensor_scale=jnp.float32(1.0), fmt=f.name, scale_fmt="e8m0",
                        axes=axes, block_shape=blocks, shape=shape,
                        scale_rule=scale_rule)


@functools.partial(jax.jit, static_argnames=(
    "axis", "block_shape", "rounding", "rand_bits", "pad", "rng"))
def quantize_nvfp4(x: jax.Array, *, axis: int | Sequence[int] = -1,
                   block_shape: Sequence[int] | None = None,
                   rounding: str = "nearest", key: jax.Array | None = None,
                   rand_bits: int | None = None, pad: bool = False,
                   rng: random_bits_lib.Method = "hash") -> QuantizedArray:
  """NVFP4: E2M1 elements in 16-element blocks, E4M3 block scales, fp32 tensor scale.

  Args:
    x: float32/bfloat16/float16 array.
    axis: blocked axis for 1x16 blocks (or a tuple with ``block_shape``).
    block_shape: e.g. ``(16, 16)`` for 2D weight tiles.
    rounding, key, rand_bits, rng, pad: as in :func:`quantize_mx`.

  Returns:
    A :class:`QuantizedArray` with ``tensor_scale = 1/S_enc`` (see module docstring).
  """
  x = _check_x(x)
  axes, blocks = _layout(x.ndim, NVFP4_BLOCK, axis, block_shape)
  shape = tuple(x.shape)
  xp = _pad(x, axes, blocks, pad)
  words = _words(key, xp.shape, rounding, rng)
  rounding_lib.check_rand_bits(rand_bits)
  s_enc, inv_s_enc = nvfp4_tensor_scale(xp)
  codes, scale_codes, _ = nvfp4_quantize_core(xp, s_enc, axes, blocks, rounding, words,
                                              rand_bits)
  return QuantizedArray(codes=codes, scales=scale_codes, tensor_scale=inv_s_enc,
                        fmt="e2m1", scale_fmt="e4m3", axes=axes, block_shape=blocks,
                        shape=shape, scale_rule="nvfp4")


def nvfp4_tensor_scale(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """float32 scalars ``(S_enc, 1/S_enc)`` of float32 ``x`` (amax over finite values).

  The only whole-tensor step of NVFP4: the Pallas kernels take both as inputs.
  """
  a = lax.bitcast_convert_type(x, jnp.uint32) & _U(0x7FFFFFFF)
  finite = a < _U(0x7F800000)
  t_amax_bits = jnp.max(jnp.where(finite, a, _U(0)).astype(jnp.int32))
  t_amax = lax.bitcast_convert_type(t_amax_bits, jnp.float32)
  s_enc = jnp.minimum(rounding_lib.div_rn(np.float32(448.0 * 6.0), t_amax), _FLT_MAX)
  s_enc = jnp.where((t_amax_bits == 0) | (s_enc == 0), np.float32(1.0), s_enc)
  return s_enc, rounding_lib.div_rn(np.float32(1.0), s_enc)


def _mul_subnormal_lhs(a: jax.Array, b: jax.Array) -> jax.Array:
  """float32 ``a * b`` (``b`` positive, finite) also where ``a`` is an f32 subnormal.

  XLA:CPU (and TPU) treat subnormal float inputs as zero, which would zero NVFP4
  elements and block scales of tiny blocks that the spec's float32 arithmetic (GPU,
  NumPy) keeps. A subnormal ``a`` is scaled up by 2^24 in the bits first, and the
  product back down: exact whenever ``a * b`` is normal (smaller products round to
  zero in E2M1 and E4M3 either way).
  """
  bits = lax.bitcast_convert_type(a, jnp.uint32)
  mag = bits & _U(0x7FFFFFFF)
  sub = (mag < _U(0x00800000)) & (mag != 0)
  up = lax.bitcast_convert_type(rounding_lib.ldexp_bits(mag, 24) | (bits & _U(0x80000000)),
                                jnp.float32)
  prod = jnp.where(sub, up, a) * b
  return jnp.where(sub, prod * np.float32(2.0 ** -24), prod)


def nvfp4_quantize_core(xp: jax.Array, s_enc: jax.Array, axes: tuple[int, ...],
                        blocks: tuple[int, ...], rounding: str, words: jax.Array | None,
                        rand_bits: int | None
                        ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(E2M1 codes, E4M3 scale codes, float32 element x block-scale values) of ``xp``.

  ``xp`` is float32 with block-divisible axes and ``s_enc`` its tensor scale
  (:func:`nvfp4_tensor_scale`); the values (NaN in poisoned blocks) times ``1/S_enc``
  are the dequantized tensor. Run by :func:`quantize_nvfp4` and the Pallas kernels in
  :mod:`numerics.kernels.nvfp4_quantizers`.
  """
  f = formats_lib.get("e2m1")
  e4m3 = formats_lib.get("e4m3")
  a = lax.bitcast_convert_type(xp, jnp.uint32) & _U(0x7FFFFFFF)
  amax, bshape, bpos = _block_amax_bits(a, axes, blocks)
  poisoned = amax >= _U(0x7F800000)
  block_amax = lax.bitcast_convert_type(jnp.where(poisoned, _U(0), amax), jnp.float32)
  s_dec = jnp.minimum(_mul_subnormal_lhs(block_amax, s_enc * np.float32(1.0 / 6.0)),
                      np.float32(448.0))
  s_dec = rounding_lib.round_f32(s_dec, e4m3, rounding="nearest", saturate=True)
  inv_s_enc = rounding_lib.div_rn(np.float32(1.0), s_enc)
  enc = jnp.minimum(rounding_lib.div_rn(np.float32(1.0), s_dec * inv_s_enc), _FLT_MAX)
  enc_full = jnp.broadcast_to(enc, bshape).reshape(xp.shape)
  poison_full = jnp.broadcast_to(poisoned, bshape).reshape(xp.shape)
  scaled = _mul_subnormal_lhs(jnp.where(poison_full, np.float32(0.0), xp), enc_full)
  sb = lax.bitcast_convert_type(scaled, jnp.uint32)
  elem = _round_elements(sb & _U(0x7FFFFFFF), sb >> 31, f, 0, rounding, words,
                         rand_bits)
  elem_f = lax.bitcast_convert_type(elem, jnp.float32)
  codes = encoding.encode(elem_f, f)
  codes = jnp.where(poison_full, jnp.uint8(0), codes)
  scale_codes = jnp.where(poisoned, jnp.uint8(e4m3.nan_code), encoding.encode(s_dec, e4m3))
  scale_codes = jnp.squeeze(scale_codes, axis=bpos)
  # element * E4M3 scale is exact in float32 (at most 2 + 4 significant bits, >= 2^-10).
  values = elem_f * jnp.broadcast_to(s_dec, bshape).reshape(xp.shape)
  values = jnp.where(poison_full, np.float32(np.nan), values)
  return codes, scale_codes, values


def _expand_scales(q: QuantizedArray, values: jax.Array) -> jax.Array:
  """Broadcasts per-block ``values`` (scales' shape) to the codes' shape."""
  bshape, bpos = _blocked_shape(q.padded_shape, q.axes, q.block_shape)
  v = jnp.expand_dims(values, bpos)
  return jnp.broadcast_to(v, bshape).reshape(q.padded_shape)


@jax.jit
def dequantize(q: QuantizedArray) -> jax.Array:
  """float32 array of the original shape: element * block scale (* tensor scale).

  MX decoding is exact (the product is built bit by bit, so block scales down to
  2^-127 work on XLA:CPU too). NVFP4's element * E4M3 scale is exact as well; the final
  multiply by the fp32 tensor scale is one float32 rounding.
  """
  if not isinstance(q, QuantizedArray):
    raise TypeError(f"dequantize expects a QuantizedArray, got {type(q).__name__}")
  f = formats_lib.get(q.fmt)
  if q.scale_fmt == "e8m0":
    s_code = _expand_scales(q, q.scales.astype(jnp.int32))
    s_int = s_code - 127 - (f.emax - f.mx_emax)
    out = encoding.decode_scaled(q.codes, f, s_int)
    out = jnp.where(s_code == 255, np.float32(np.nan), out)
  else:
    # Element (n_e 2^qe_e) times E4M3 scale (n_s 2^qe_s): integer product, exact.
    _, n_e_t, qe_e_t, _ = encoding.decode_parts_table(f.name)
    sgn_s_t, n_s_t, qe_s_t, nan_s_t = encoding.decode_parts_table(q.scale_fmt)
    ce = q.codes.astype(jnp.int32)
    cs = _expand_scales(q, q.scales.astype(jnp.int32))
    n = jnp.take(jnp.asarray(n_e_t), ce) * jnp.take(jnp.asarray(n_s_t), cs)
    qe = jnp.take(jnp.asarray(qe_e_t), ce) + jnp.take(jnp.asarray(qe_s_t), cs)
    bits = rounding_lib.compose_bits(n, qe) | ((q.codes.astype(jnp.uint32) >> 3) << 31)
    prod = lax.bitcast_convert_type(bits, jnp.float32)
    out = prod * q.tensor_scale
    out = jnp.where(jnp.take(jnp.asarray(nan_s_t), cs), np.float32(np.nan), out)
  return out[tuple(slice(0, d) for d in q.shape)]
