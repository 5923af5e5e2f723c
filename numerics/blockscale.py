"""Block-scaled quantization: OCP MX (E8M0 scales) and NVFP4 (E4M3 scales + fp32).

Layouts: ``block_shape`` is the one name for block geometry. An int ``b`` (or ``(b,)``)
is a 1D block of ``b`` consecutive elements along the int ``axis`` (default ``-1``); a
tuple ``(b0, b1, ...)`` tiles the axes in the tuple ``axis`` (default: the last
``len(block_shape)`` axes), e.g. ``block_shape=(32, 32)`` for ALTO's 2D weight tiles.
Conflicting arguments raise (an int ``axis`` with a 2D ``block_shape``, a tuple ``axis``
of another length, a non-positive extent, NVFP4 blocks other than 16). An axis whose
length the block does not divide raises, unless ``pad=True`` (zeros are appended, which
leaves every block's amax unchanged, and ``dequantize`` slices them off).

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

NVFP4 (:func:`quantize_nvfp4`) has two conventions (``convention=``), each bit-exact
against a NumPy transcription of its library's formula (``tests/numerics/mx_reference.py``):

* ``"te"`` (default): Transformer Engine's chain, as transcribed by torchao's NVFP4
  training reference. Tensor ``S_enc = min(448*6 / amax, FLT_MAX)`` (1 when amax is 0),
  block scale ``S_dec = e4m3(min(block_amax * (S_enc * (1/6)), 448))``, elements
  ``e2m1(x * min(1 / (S_dec * (1/S_enc)), FLT_MAX))``, decode
  ``x = (e2m1 * S_dec) * (1/S_enc)``. The block scale has no lower clamp: a block whose
  scale rounds below E4M3's smallest subnormal (2^-9) stores scale 0 and decodes to 0.
* ``"torchao"``: torchao's ``NVFP4Tensor.to_nvfp4`` with ``per_tensor_scale =
  amax / (448*6)``: ``s = clamp((block_amax / 6) / per_tensor_scale, 2^-6, 448)``
  rounded to E4M3, elements ``e2m1(clamp(x * ((1 / per_tensor_scale) / s), -6, 6))``,
  decode ``x = e2m1 * (per_tensor_scale * s)``. The block scale is floored at E4M3's
  smallest *normal* value (torchao's ``E4M3_EPS``), reciprocals are formed separately,
  and the decode multiplies by a rounded product of the two scales.

The two agree wherever a block's TE scale is a normal E4M3 value and the reciprocal
chains round alike; they differ on blocks whose amax is below about ``2^-6 * 6 / 448``
of the tensor amax (TE: a subnormal or zero scale, coarse or flushed elements; torchao:
scale 2^-6, finer elements) and by one rounding elsewhere (a 1-ulp difference in the
element's scaled value that can cross an E2M1 rounding boundary, and the decode). On
N(0, 1) data with rare large outliers they disagree on a few percent of the elements
(``tests/numerics/test_blockscale.py`` measures it). Where torchao's formula divides by
zero (an all-zero tensor) we use ``per_tensor_scale = 1``.

Our choices where the libraries are silent: the tensor amax ignores NaN/Inf, and a
block holding them gets the NaN scale (E4M3 0x7F).

Gradients (:mod:`numerics.gradients`): :func:`quantize_dequantize_mx` is
straight-through; :func:`quantize_mx` and :func:`quantize_nvfp4` return integer codes
and raise when differentiated. A :class:`QuantizedArray` checks its fields when built
(code and scale shapes against ``shape``, ``axes`` and ``block_shape``); one with
leading batch dimensions (e.g. from ``jax.vmap(quantize_mx)``) dequantizes per example.

All amax and exponent arithmetic is done on the bit patterns: XLA:CPU flushes float32
subnormals to zero in float arithmetic, which would silently change scales. NVFP4's
divisions use :func:`numerics.rounding.div_rn` (IEEE round-to-nearest from integer ops:
GPU Triton kernels divide approximately, TPUs by a reciprocal estimate), and its
products with a possibly subnormal operand (``block_amax * S_enc/6`` and ``x * enc``)
rescale that operand in the bits first. A tensor whose amax is below ``2688 * 2^-126``
(3.2e-35) has a subnormal ``1/S_enc`` (TE) or ``per_tensor_scale`` (torchao), and its
dequantized values are subnormal: the products with those (``S_dec * (1/S_enc)``, the
decode's ``* (1/S_enc)``, torchao's ``per_tensor_scale * s`` and ``element * scale``)
are formed exactly in integers and rounded once (:func:`numerics.rounding.mul_narrow`:
every such left operand has at most 8 significant bits), and zero tests read the bits.
So NVFP4 gives the spec's float32 bits on every backend (tested against NumPy), for
tensors of float32 subnormals too, although CPU and TPU arithmetic flush subnormals.

Inside ``jax.shard_map`` the tensor amax is the shard's unless ``amax_axis_name`` names
the mesh axes to reduce it over (``lax.pmax``, Transformer Engine's amax reduction
group); stochastic rounding's words are the shard's own (:mod:`numerics.random_bits`).

Speed: the ``te`` convention runs :func:`nvfp4_te_fast` (any rounding), two passes over
``x``: the block amaxes (with the tensor amax taken from them), then the elements.
Its per-block values (``S_dec``, ``enc``) are materialized once per block
(:func:`_materialize`), so ``div_rn``'s ~140 integer ops are paid per block and per
tensor, never per element: a few percent of the pass, which leaves no reason to
branch to XLA:CPU's native division on that backend (correctly rounded for normal
quotients, but it flushes subnormal ones, e.g. ``1/S_enc`` above). The
``torchao`` convention and the Pallas kernels run the reference cores
(:func:`nvfp4_torchao_quantize_core`, :func:`nvfp4_quantize_core`); the tests hold the
fast path bit-equal to :func:`nvfp4_quantize_core` and both to the NumPy reference.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Literal, Sequence

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.numerics import encoding
from lowprec.numerics import formats as formats_lib
from lowprec.numerics import gradients as gradients_lib
from lowprec.numerics import random_bits as random_bits_lib
from lowprec.numerics import rounding as rounding_lib

ScaleRule = Literal["floor", "ceil", "rceil", "even", "alto"]
SCALE_RULES = ("floor", "ceil", "rceil", "even", "alto")
MX_ELEMENT_FORMATS = ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "int8")
MX_BLOCK = 32  # OCP MX v1.0: elements per shared E8M0 scale
NVFP4_BLOCK = 16
_U = np.uint32
_I = np.int32
_FLT_MAX = np.float32(np.finfo(np.float32).max)


NVFP4_CONVENTIONS = ("te", "torchao")
_NVFP4_SCALE_RULES = {"te": "nvfp4", "torchao": "nvfp4_torchao"}


@dataclasses.dataclass(frozen=True)
class QuantizedArray:
  """A block-scaled tensor (a pytree; the layout fields are static metadata).

  Attributes:
    codes: uint8 element codes, shape ``batch + padded_shape`` (see
      :mod:`numerics.encoding`); ``batch`` is empty unless the array was built under
      ``jax.vmap``.
    scales: uint8 scale codes (E8M0 for MX, E4M3 for NVFP4): ``batch`` + the padded
      shape with every blocked axis divided by its block extent.
    tensor_scale: float32 decode multiplier, shape ``()`` or ``batch`` (1 for MX;
      NVFP4: ``1/S_enc``, or torchao's ``per_tensor_scale``).
    fmt: element format name.
    scale_fmt: ``e8m0`` or ``e4m3``.
    axes: the blocked axes (non-negative, increasing, of the unbatched array).
    block_shape: block extent along each of ``axes``.
    shape: the original (unpadded, unbatched) shape.
    scale_rule: the MX scale rule used (``nvfp4`` or ``nvfp4_torchao`` for NVFP4).

  Raises:
    ValueError, TypeError: on construction, when the fields do not describe one
      consistent tensor (codes or scales of another shape or dtype, axes out of range).
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

  def __post_init__(self):
    _check_layout_fields(self)
    leaves = (self.codes, self.scales, self.tensor_scale)
    # Pytree transformations rebuild the class with placeholder leaves (None, object()).
    if all(hasattr(v, "shape") and hasattr(v, "dtype") for v in leaves):
      _check_array_fields(self)

  @property
  def padded_shape(self) -> tuple[int, ...]:
    """The unbatched shape of ``codes`` (``shape`` padded to whole blocks)."""
    return _padded(self.shape, self.axes, self.block_shape)

  @property
  def batch_shape(self) -> tuple[int, ...]:
    """Leading batch dimensions (``()`` unless built under ``jax.vmap``)."""
    return tuple(self.codes.shape[:len(self.codes.shape) - len(self.shape)])

  def element_values(self) -> jax.Array:
    """float32 element values (before scaling), shape of ``codes``."""
    return encoding.decode(self.codes, self.fmt)

  def scale_values(self) -> jax.Array:
    """float32 block scales, shape of ``scales`` (NaN for poisoned blocks)."""
    return encoding.decode(self.scales, self.scale_fmt)


jax.tree_util.register_dataclass(
    QuantizedArray, data_fields=["codes", "scales", "tensor_scale"],
    meta_fields=["fmt", "scale_fmt", "axes", "block_shape", "shape", "scale_rule"])


def _padded(shape, axes, blocks) -> tuple[int, ...]:
  out = list(shape)
  for a, b in zip(axes, blocks):
    out[a] = -(-out[a] // b) * b
  return tuple(out)


def _check_layout_fields(q: QuantizedArray) -> None:
  if q.scale_fmt not in ("e8m0", "e4m3"):
    raise ValueError(f"QuantizedArray scale_fmt must be 'e8m0' or 'e4m3', got "
                     f"{q.scale_fmt!r}")
  formats_lib.get(q.fmt)
  if q.scale_fmt == "e4m3" and (q.fmt != "e2m1" or q.scale_rule not in
                                _NVFP4_SCALE_RULES.values()):
    raise ValueError(f"an E4M3-scaled QuantizedArray is NVFP4 (fmt 'e2m1', scale_rule "
                     f"in {tuple(_NVFP4_SCALE_RULES.values())}), got fmt {q.fmt!r}, "
                     f"scale_rule {q.scale_rule!r}")
  if q.scale_fmt == "e8m0" and (q.fmt not in MX_ELEMENT_FORMATS
                                or q.scale_rule not in SCALE_RULES):
    raise ValueError(f"an E8M0-scaled QuantizedArray is MX (fmt in {MX_ELEMENT_FORMATS}, "
                     f"scale_rule in {SCALE_RULES}), got fmt {q.fmt!r}, scale_rule "
                     f"{q.scale_rule!r}")
  shape, axes, blocks = q.shape, q.axes, q.block_shape
  if not (isinstance(shape, tuple) and all(isinstance(d, int) and d >= 0 for d in shape)):
    raise ValueError(f"QuantizedArray shape must be a tuple of ints >= 0, got {shape!r}")
  if not (isinstance(axes, tuple) and isinstance(blocks, tuple) and axes
          and len(axes) == len(blocks)):
    raise ValueError(f"QuantizedArray axes {axes!r} and block_shape {blocks!r} must be "
                     f"non-empty tuples of one length")
  if list(axes) != sorted(set(axes)) or not all(
      isinstance(a, int) and 0 <= a < len(shape) for a in axes):
    raise ValueError(f"QuantizedArray axes {axes} must be increasing, distinct and in "
                     f"range for shape {shape}")
  if not all(isinstance(b, int) and b >= 1 for b in blocks):
    raise ValueError(f"QuantizedArray block_shape {blocks} must be positive ints")


def _check_array_fields(q: QuantizedArray) -> None:
  padded = q.padded_shape
  nb = len(q.codes.shape) - len(q.shape)
  if nb < 0 or tuple(q.codes.shape[nb:]) != padded:
    raise ValueError(f"QuantizedArray codes have shape {tuple(q.codes.shape)}; shape "
                     f"{q.shape} blocked by {q.block_shape} along {q.axes} needs "
                     f"{padded} (after any leading batch dimensions)")
  batch = tuple(q.codes.shape[:nb])
  want_scales = batch + tuple(d // q.block_shape[q.axes.index(i)] if i in q.axes else d
                              for i, d in enumerate(padded))
  if tuple(q.scales.shape) != want_scales:
    raise ValueError(f"QuantizedArray scales have shape {tuple(q.scales.shape)}, "
                     f"expected {want_scales} (one per block of {q.block_shape} along "
                     f"{q.axes})")
  if tuple(q.tensor_scale.shape) not in ((), batch):
    raise ValueError(f"QuantizedArray tensor_scale has shape "
                     f"{tuple(q.tensor_scale.shape)}, expected () or {batch}")
  for name, v, dtype in (("codes", q.codes, jnp.uint8), ("scales", q.scales, jnp.uint8),
                         ("tensor_scale", q.tensor_scale, jnp.float32)):
    if v.dtype != dtype:
      raise TypeError(f"QuantizedArray {name} must be {jnp.dtype(dtype).name}, got "
                      f"{v.dtype}")


def canonical_block(block_shape: int | Sequence[int] | None,
                    axis: int | Sequence[int] | None, default: int
                    ) -> tuple[tuple[int, ...], int | tuple[int, ...]]:
  """``(block_shape, axis)`` in canonical form, before the array's rank is known.

  ``block_shape``: None (``(default,)``), an int ``b`` (``(b,)``) or a sequence of
  positive ints. ``axis``: None gives ``-1`` for a 1D block and the last
  ``len(block_shape)`` axes for tiles; an int goes with a 1D block only; a sequence
  must have one axis per block extent. Returned: a tuple of extents, and an int axis for
  1D blocks or a tuple of axes for tiles.

  Raises:
    ValueError: non-positive or non-int extents, an int axis with a multi-axis block,
      or a tuple of axes of another length.
  """
  if block_shape is None:
    blocks = (default,)
  elif isinstance(block_shape, (int, np.integer)) and not isinstance(block_shape, bool):
    blocks = (int(block_shape),)
  elif isinstance(block_shape, (tuple, list)):
    blocks = tuple(block_shape)
  else:
    raise ValueError(f"block_shape must be an int or a tuple of ints, got {block_shape!r}")
  if not blocks or not all(isinstance(b, (int, np.integer)) and not isinstance(b, bool)
                           and b >= 1 for b in blocks):
    raise ValueError(f"block_shape extents must be positive ints, got {block_shape!r}")
  blocks = tuple(int(b) for b in blocks)
  if axis is None:
    return blocks, (-1 if len(blocks) == 1 else tuple(range(-len(blocks), 0)))
  if isinstance(axis, (tuple, list)):
    axes = tuple(axis)
    if len(axes) != len(blocks):
      raise ValueError(f"block_shape {blocks} needs {len(blocks)} axes, got axis={axes}")
    if not all(isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in axes):
      raise ValueError(f"axes must be ints, got {axes}")
    axes = tuple(int(a) for a in axes)
    return blocks, (axes[0] if len(axes) == 1 else axes)
  if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
    raise ValueError(f"axis must be an int or a tuple of ints, got {axis!r}")
  if len(blocks) != 1:
    raise ValueError(f"block_shape {blocks} tiles {len(blocks)} axes: give axis as a "
                     f"tuple of {len(blocks)} axes (or leave it out for the last "
                     f"{len(blocks)}), not axis={axis}")
  return blocks, int(axis)


def _layout(ndim: int, block_shape, axis, default: int = MX_BLOCK) -> tuple[
    tuple[int, ...], tuple[int, ...]]:
  """(non-negative increasing axes, matching extents) for an ``ndim``-d array."""
  blocks, ax = canonical_block(block_shape, axis, default)
  axes = ax if isinstance(ax, tuple) else (ax,)
  norm = []
  for a in axes:
    if not -ndim <= a < ndim:
      raise ValueError(f"axis {a} out of range for a {ndim}-d array")
    norm.append(a % ndim)
  if len(set(norm)) != len(norm):
    raise ValueError(f"repeated axis in {axes}")
  order = np.argsort(norm)
  return tuple(norm[i] for i in order), tuple(blocks[i] for i in order)


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
  """floor(log2 v) for positive finite float32 bits (subnormals by leading zeros)."""
  e32 = (bits >> 23).astype(jnp.int32)
  sub = _I(31) - rounding_lib.leading_zeros(bits & _U(0x7FFFFF)) - _I(149)
  return jnp.where(e32 > 0, e32 - 127, sub)


def _normalized_sig(bits: jax.Array) -> jax.Array:
  """24-bit significand with its leading one at bit 23 (subnormals shifted up)."""
  e32 = bits >> 23
  sub = bits << jnp.clip(rounding_lib.leading_zeros(bits & _U(0x7FFFFF)) - 8, 0,
                         31).astype(jnp.uint32)
  return jnp.where(e32 > 0, (bits & _U(0x7FFFFF)) | _U(0x800000), sub)


def _round_amax_mantissa(bits: jax.Array, keep: int) -> jax.Array:
  """amax bits with the mantissa rounded (half up) to ``keep`` bits."""
  return bits + _U(1 << (22 - keep))


def mx_scale_exponent(amax_bits: jax.Array, fmt: formats_lib.Format,
                      scale_rule: str) -> jax.Array:
  """OCP E8M0 scale code (int32 in [0, 254]) for block amax bits (finite, >= 0)."""
  return jnp.clip(mx_scale_code_unclamped(amax_bits, fmt, scale_rule), 0, 254)


def mx_scale_code_unclamped(amax_bits: jax.Array, fmt: formats_lib.Format,
                            scale_rule: str) -> jax.Array:
  """The E8M0 code the scale rule asks for (int32), before clamping to [0, 254].

  Outside [0, 254] the block's scale is clamped (numerics telemetry counts these);
  a zero amax gives code 0 (not a clamp).
  """
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
  return jnp.where(amax_bits == 0, 0, code)


def _check_x(x: jax.Array, fn: str) -> jax.Array:
  """float32 ``x``, or TypeError/ValueError naming the public function ``fn``."""
  x = rounding_lib.check_float_input(x, fn)
  if x.ndim == 0:
    raise ValueError(f"{fn}: block quantization needs an array with at least one axis, "
                     f"got a scalar")
  return x.astype(jnp.float32)


def _words(key, xp, rounding, rng):
  """Stochastic rounding's words for the padded array ``xp`` (its shard's own words
  inside ``shard_map``: :mod:`numerics.random_bits`)."""
  if rounding == "stochastic":
    if key is None:
      raise ValueError("rounding='stochastic' needs a PRNG key")
    return random_bits_lib.random_words(key, xp.shape, method=rng, shard_of=xp)
  if rounding not in rounding_lib.ROUNDINGS:
    raise ValueError(f"unknown rounding {rounding!r}; known: "
                     f"{', '.join(rounding_lib.ROUNDINGS)}")
  return None


def _round_elements(a, sign, fmt, scale_exp, rounding, words, rand_bits):
  """Element values of magnitude bits ``a`` / 2^scale_exp, saturated, as f32 bits."""
  mag = rounding_lib.round_magnitude(a, fmt.man_bits, fmt.emin, rounding, words,
                                     rand_bits, scale_exp=scale_exp)
  max_bits = _U(np.float32(fmt.max).view(np.uint32))
  return jnp.where(mag > max_bits, max_bits, mag) | (sign << 31)


_POISON = np.int32(1 << 20)  # beyond every block's grid exponent


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
  # One int32 broadcast carries both the exponent and the poison flag: Mosaic TPU
  # cannot move a boolean mask between layouts (no i1 transpose).
  s_full = jnp.broadcast_to(jnp.where(poisoned, _POISON, s_int), bshape).reshape(xp.shape)
  poison_full = s_full == _POISON
  a_fin = jnp.where(poison_full, _U(0), a)
  elem = _round_elements(a_fin, sign, f, s_full, rounding, words, rand_bits)
  scale_codes = jnp.where(poisoned, 255, code).astype(jnp.uint8)
  return elem, jnp.squeeze(scale_codes, axis=bpos), s_full, poison_full


def block_statistic(x: jax.Array, stat, *, block_shape: int | Sequence[int] | None = None,
                    axis: int | Sequence[int] | None = None, pad: bool = False
                    ) -> jax.Array:
  """A per-block statistic of float32 ``x``, broadcast back to ``x``'s shape.

  Blocks are laid out as in :func:`quantize_mx` (default 1x32 along the last axis).
  ``stat(values, valid, axes)`` gets the blocked float32 values, a same-shape bool mask
  that is False on padding, and the in-block axes; it must reduce over ``axes`` with
  ``keepdims=True``.
  """
  x = _check_x(x, "block_statistic")
  axes, blocks = _layout(x.ndim, block_shape, axis)
  xp = _pad(x, axes, blocks, pad)
  valid = _pad(jnp.ones(x.shape, bool), axes, blocks, pad)
  bshape, bpos = _blocked_shape(xp.shape, axes, blocks)
  out = stat(xp.reshape(bshape), valid.reshape(bshape), bpos)
  out = jnp.broadcast_to(out, bshape).reshape(xp.shape)
  return out[tuple(slice(0, d) for d in x.shape)]


def block_amax_bits(x: jax.Array, *, block_shape: int | Sequence[int] | None = None,
                    axis: int | Sequence[int] | None = None, pad: bool = False,
                    finite_only: bool = False) -> jax.Array:
  """uint32 magnitude bits of each element's block amax, broadcast to ``x``'s shape.

  The amax every MX scale rule starts from, on the float32 bit patterns (so float32
  subnormals are not flushed): ``>= 0x7F800000`` for a block holding NaN or Inf, unless
  ``finite_only`` leaves NaN and Inf out of the max. Blocks are laid out as in
  :func:`quantize_mx`; padding (``pad=True``) is zeros, which never raise the amax.
  ``lax.bitcast_convert_type(bits, jnp.float32)`` is the amax as a float.
  """
  x = _check_x(x, "block_amax_bits")
  axes, blocks = _layout(x.ndim, block_shape, axis)
  a = lax.bitcast_convert_type(_pad(x, axes, blocks, pad), jnp.uint32) & _U(0x7FFFFFFF)
  if finite_only:
    a = jnp.where(a >= _U(0x7F800000), _U(0), a)
  amax, bshape, _ = _block_amax_bits(a, axes, blocks)
  out = jnp.broadcast_to(amax, bshape).reshape(a.shape)
  return out[tuple(slice(0, d) for d in x.shape)]


def mx_grid_exponents(x: jax.Array, fmt: str | formats_lib.Format = "e4m3", *,
                      block_shape: int | Sequence[int] | None = None,
                      axis: int | Sequence[int] | None = None,
                      scale_rule: ScaleRule = "floor", pad: bool = False,
                      unclamped: bool = False) -> jax.Array:
  """int32 ``s`` per element (x's shape): MX rounds ``x / 2^s`` onto ``fmt``'s grid.

  The block scale of each element's block in the element format's own units (the
  E8M0 code minus its bias, less MXINT8's implicit 2^-6), for tools that need the
  quantization bin of a value (e.g. differential gradient estimation). NaN/Inf blocks
  get the all-zero-block exponent. ``unclamped=True`` gives the exponent the scale rule
  asks for before E8M0's range clamps it (:func:`mx_scale_code_unclamped`).
  """
  f = formats_lib.get(fmt)
  x = _check_x(x, "mx_grid_exponents")
  axes, blocks = _layout(x.ndim, block_shape, axis)
  xp = _pad(x, axes, blocks, pad)
  a = lax.bitcast_convert_type(xp, jnp.uint32) & _U(0x7FFFFFFF)
  amax, bshape, _ = _block_amax_bits(a, axes, blocks)
  amax = jnp.where(amax >= _U(0x7F800000), _U(0), amax)
  code_fn = mx_scale_code_unclamped if unclamped else mx_scale_exponent
  s_int = code_fn(amax, f, scale_rule) - 127 - (f.emax - f.mx_emax)
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


def _mx_args(x, fmt, block_shape, axis, scale_rule, rounding, key, rand_bits, rng,
             fn):
  """Validated (format name, float32 x, axes, blocks) for the MX entry points."""
  f = formats_lib.get(fmt)
  if f.name not in MX_ELEMENT_FORMATS:
    raise ValueError(f"MX element format must be one of {MX_ELEMENT_FORMATS}, got "
                     f"{f.name!r}")
  if scale_rule not in SCALE_RULES:
    raise ValueError(f"unknown scale_rule {scale_rule!r}; known: {', '.join(SCALE_RULES)}")
  rounding_lib.check_rounding_args(rounding, key, rand_bits, rng)
  x = _check_x(x, fn)
  axes, blocks = _layout(x.ndim, block_shape, axis)
  return f.name, x, axes, blocks


_MX_STATIC = ("fmt", "axes", "blocks", "scale_rule", "rounding", "rand_bits", "pad", "rng")


def _lazy_words(xp, key, rounding, rng):
  """Stochastic rounding's words as a function (None for other roundings): called
  where they are used, they fuse into the rounding instead of being materialized."""
  return (lambda: _words(key, xp, rounding, rng)) if rounding == "stochastic" else None


def _mx_fast():
  """:mod:`numerics.mx_fast`, the float-arithmetic element pass of :func:`quantize_mx`
  and :func:`quantize_dequantize_mx` (it builds on this module's scale rules, so it is
  imported when first traced rather than at import time)."""
  from lowprec.numerics import mx_fast  # pylint: disable=g-import-not-at-top
  return mx_fast


@functools.partial(jax.jit, static_argnames=_MX_STATIC)
def _qdq_mx(x, key, *, fmt, axes, blocks, scale_rule, rounding, rand_bits, pad, rng):
  f = formats_lib.get(fmt)

  def run(x, key):
    xp = _pad(x.astype(jnp.float32), axes, blocks, pad)
    out = _mx_fast().quantize(xp, f, axes, blocks, scale_rule, rounding,
                              _lazy_words(xp, key, rounding, rng), rand_bits,
                              dequantize=True)
    return out[tuple(slice(0, d) for d in x.shape)]

  return gradients_lib.straight_through(run, x, key)


def quantize_dequantize_mx(x: jax.Array, fmt: str | formats_lib.Format = "e4m3", *,
                           block_shape: int | Sequence[int] | None = None,
                           axis: int | Sequence[int] | None = None,
                           scale_rule: ScaleRule = "floor", rounding: str = "nearest",
                           key: jax.Array | None = None, rand_bits: int | None = None,
                           pad: bool = False, rng: random_bits_lib.Method = "hash"
                           ) -> jax.Array:
  """``dequantize(quantize_mx(x, ...))`` without forming codes (fake quantization).

  The fused path for training: the rounded elements are scaled back by integer
  exponent arithmetic, skipping the uint8 encode/decode. Equal bit for bit to the
  two-step form (tested). Arguments as :func:`quantize_mx`; returns float32.
  Gradient: straight-through (the cotangent, in x's dtype).
  """
  fmt, x32, axes, blocks = _mx_args(x, fmt, block_shape, axis, scale_rule, rounding,
                                    key, rand_bits, rng, "quantize_dequantize_mx")
  out = _qdq_mx(jnp.asarray(x), key, fmt=fmt, axes=axes, blocks=blocks,
                scale_rule=scale_rule, rounding=rounding, rand_bits=rand_bits, pad=pad,
                rng=rng)
  del x32
  return out


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
def _quantize_mx(x, key, *, fmt, axes, blocks, scale_rule, rounding, rand_bits, pad, rng):
  f = formats_lib.get(fmt)

  def run(x, key):
    x = x.astype(jnp.float32)
    xp = _pad(x, axes, blocks, pad)
    return _mx_fast().quantize(xp, f, axes, blocks, scale_rule, rounding,
                               _lazy_words(xp, key, rounding, rng), rand_bits,
                               dequantize=False)

  return gradients_lib.not_differentiable(
      run, "quantize_mx", "quantize_dequantize_mx or fake_quant")(x, key)


def quantize_mx(x: jax.Array, fmt: str | formats_lib.Format = "e4m3", *,
                block_shape: int | Sequence[int] | None = None,
                axis: int | Sequence[int] | None = None,
                scale_rule: ScaleRule = "floor", rounding: str = "nearest",
                key: jax.Array | None = None, rand_bits: int | None = None,
                pad: bool = False, rng: random_bits_lib.Method = "hash"
                ) -> QuantizedArray:
  """OCP MX block quantization with E8M0 scales.

  Args:
    x: float32/bfloat16/float16 array.
    fmt: element format: e4m3, e5m2 (MXFP8), e2m3, e3m2 (MXFP6), e2m1 (MXFP4), int8.
    block_shape: an int for 1D blocks along ``axis`` (default 32, OCP MX), or tile
      extents such as ``(32, 32)`` over the axes in ``axis``.
    axis: the blocked axis (default -1) for 1D blocks; a tuple of axes for tiles
      (default: the last ``len(block_shape)``).
    scale_rule: floor (OCP), ceil, rceil, even, alto (see the module docstring).
    rounding: element rounding, ``nearest`` (RNE) or ``stochastic`` (needs ``key``;
      the scale stays deterministic) or ``toward_zero``.
    key, rand_bits, rng: stochastic rounding's key, random bits per element and
      generator, as in :func:`numerics.cast` (only with ``rounding='stochastic'``);
      words are indexed by the row-major position in the padded array.
    pad: zero-pad blocked axes to a multiple of the block instead of raising.

  Returns:
    A :class:`QuantizedArray`; ``dequantize`` gives ``element * 2^(code - 127)``.
    Not differentiable (integer codes): use :func:`quantize_dequantize_mx` or
    :func:`numerics.fake_quant` for a straight-through gradient.
  """
  fmt, x32, axes, blocks = _mx_args(x, fmt, block_shape, axis, scale_rule, rounding,
                                    key, rand_bits, rng, "quantize_mx")
  codes, scale_codes = _quantize_mx(jnp.asarray(x), key, fmt=fmt, axes=axes,
                                    blocks=blocks, scale_rule=scale_rule,
                                    rounding=rounding, rand_bits=rand_bits, pad=pad,
                                    rng=rng)
  return QuantizedArray(codes=codes, scales=scale_codes,
                        tensor_scale=jnp.float32(1.0), fmt=fmt, scale_fmt="e8m0",
                        axes=axes, block_shape=blocks, shape=tuple(x32.shape),
                        scale_rule=scale_rule)


def nvfp4_layout(ndim: int, block_shape, axis) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(axes, extents) of NVFP4 blocks: 16 along one axis, or 16x16 tiles (default 1x16)."""
  axes, blocks = _layout(ndim, block_shape, axis, NVFP4_BLOCK)
  if any(b != NVFP4_BLOCK for b in blocks):
    raise ValueError(f"NVFP4 blocks are {NVFP4_BLOCK} elements along each blocked axis "
                     f"(1x16, or 16x16 tiles), got block_shape={block_shape!r}")
  return axes, blocks


AmaxAxisName = str | tuple[str, ...] | None


def check_amax_axis_name(amax_axis_name, fn: str) -> AmaxAxisName:
  """``amax_axis_name`` in canonical form (None, a str, or a tuple of str), or a
  ValueError naming the public function ``fn``."""
  if amax_axis_name is None or isinstance(amax_axis_name, str):
    return amax_axis_name
  if isinstance(amax_axis_name, (tuple, list)) and amax_axis_name and all(
      isinstance(a, str) for a in amax_axis_name):
    return tuple(amax_axis_name)
  raise ValueError(f"{fn}: amax_axis_name must be a mesh axis name, a tuple of them or "
                   f"None, got {amax_axis_name!r}")


def reduce_amax_bits(bits: jax.Array, amax_axis_name: AmaxAxisName) -> jax.Array:
  """int32 amax bits, maximized over the mesh axes ``amax_axis_name`` (None: as is).

  Non-negative float32 bits order like their values, so ``lax.pmax`` of the bits is the
  global amax exactly. This is Transformer Engine's amax reduction over a group: every
  shard then takes the same tensor scale, the one of the whole tensor.
  """
  if amax_axis_name is None:
    return bits
  try:
    return lax.pmax(bits, amax_axis_name)
  except NameError as e:
    raise ValueError(
        f"amax_axis_name={amax_axis_name!r} names no mesh axis bound here: the tensor "
        f"amax is reduced over it with lax.pmax, so call the quantizer inside "
        f"jax.shard_map over that axis ({e})") from None


@functools.partial(jax.jit, static_argnames=(
    "axes", "blocks", "rounding", "rand_bits", "pad", "rng", "convention",
    "amax_axis_name"))
def _quantize_nvfp4(x, key, *, axes, blocks, rounding, rand_bits, pad, rng, convention,
                    amax_axis_name):

  def run(x, key):
    xp = _pad(x.astype(jnp.float32), axes, blocks, pad)
    words = _words(key, xp, rounding, rng)
    if convention == "te":
      return nvfp4_te_fast(xp, axes, blocks, rounding=rounding, words=words,
                           rand_bits=rand_bits, dequantize=False,
                           amax_axis_name=amax_axis_name)
    pts = nvfp4_torchao_tensor_scale(xp, amax_axis_name=amax_axis_name)
    codes, scale_codes, _ = nvfp4_torchao_quantize_core(xp, pts, axes, blocks, rounding,
                                                       words, rand_bits)
    return codes, scale_codes, pts

  return gradients_lib.not_differentiable(
      run, "quantize_nvfp4", "quantizer.quantize_dequantize or fake_quant(x, 'nvfp4')"
  )(x, key)


def _nvfp4_args(x, block_shape, axis, rounding, key, rand_bits, rng, convention, fn,
                amax_axis_name=None):
  if convention not in NVFP4_CONVENTIONS:
    raise ValueError(f"NVFP4 convention must be one of {NVFP4_CONVENTIONS}, got "
                     f"{convention!r}")
  rounding_lib.check_rounding_args(rounding, key, rand_bits, rng)
  x32 = _check_x(x, fn)
  return x32, nvfp4_layout(x32.ndim, block_shape, axis), check_amax_axis_name(
      amax_axis_name, fn)


def quantize_nvfp4(x: jax.Array, *, block_shape: int | Sequence[int] | None = None,
                   axis: int | Sequence[int] | None = None,
                   rounding: str = "nearest", key: jax.Array | None = None,
                   rand_bits: int | None = None, pad: bool = False,
                   rng: random_bits_lib.Method = "hash", convention: str = "te",
                   amax_axis_name: AmaxAxisName = None) -> QuantizedArray:
  """NVFP4: E2M1 elements in 16-element blocks, E4M3 block scales, fp32 tensor scale.

  Args:
    x: float32/bfloat16/float16 array.
    block_shape: 16 (default: 1x16 blocks along ``axis``) or ``(16, 16)`` for 2D
      weight tiles; any other extent raises.
    axis: as in :func:`quantize_mx`.
    rounding, key, rand_bits, rng, pad: as in :func:`quantize_mx`.
    convention: ``"te"`` (Transformer Engine's scale chain) or ``"torchao"``
      (torchao's ``NVFP4Tensor.to_nvfp4`` with a per-tensor scale); see the module
      docstring for both formulas and where they differ.
    amax_axis_name: inside ``jax.shard_map``, the mesh axis (or axes) to take the
      tensor amax over (``lax.pmax``), as Transformer Engine reduces it over a
      tensor-parallel group: every shard gets the whole tensor's tensor scale, so the
      shards quantize as the unsharded tensor does wherever no block straddles two
      shards. None (default): the amax of the array this call sees (per shard inside
      ``shard_map``).

  Returns:
    A :class:`QuantizedArray` with ``tensor_scale = 1/S_enc`` (``te``) or torchao's
    ``per_tensor_scale`` (``torchao``). Not differentiable (integer codes).
  """
  x32, (axes, blocks), amax_axis_name = _nvfp4_args(
      x, block_shape, axis, rounding, key, rand_bits, rng, convention, "quantize_nvfp4",
      amax_axis_name)
  codes, scale_codes, tensor_scale = _quantize_nvfp4(
      jnp.asarray(x), key, axes=axes, blocks=blocks, rounding=rounding,
      rand_bits=rand_bits, pad=pad, rng=rng, convention=convention,
      amax_axis_name=amax_axis_name)
  return QuantizedArray(codes=codes, scales=scale_codes, tensor_scale=tensor_scale,
                        fmt="e2m1", scale_fmt="e4m3", axes=axes, block_shape=blocks,
                        shape=tuple(x32.shape), scale_rule=_NVFP4_SCALE_RULES[convention])


@functools.partial(jax.jit, static_argnames=(
    "axes", "blocks", "rounding", "rand_bits", "pad", "rng", "convention",
    "amax_axis_name"))
def _qdq_nvfp4(x, key, *, axes, blocks, rounding, rand_bits, pad, rng, convention,
               amax_axis_name):

  def run(x, key):
    xp = _pad(x.astype(jnp.float32), axes, blocks, pad)
    if convention == "te":
      # The words as a function: computed where they are used (inside lax.cond's
      # branches), they fuse into the rounding instead of being materialized.
      words = ((lambda: _words(key, xp, rounding, rng)) if rounding == "stochastic"
               else None)
      out = nvfp4_te_fast(xp, axes, blocks, rounding=rounding, words=words,
                          rand_bits=rand_bits, dequantize=True,
                          amax_axis_name=amax_axis_name)
    else:
      pts = nvfp4_torchao_tensor_scale(xp, amax_axis_name=amax_axis_name)
      out = nvfp4_torchao_quantize_core(xp, pts, axes, blocks, rounding,
                                        _words(key, xp, rounding, rng), rand_bits)[2]
    return out[tuple(slice(0, d) for d in x.shape)]

  return gradients_lib.straight_through(run, x, key)


def quantize_dequantize_nvfp4(x: jax.Array, *,
                              block_shape: int | Sequence[int] | None = None,
                              axis: int | Sequence[int] | None = None,
                              rounding: str = "nearest", key: jax.Array | None = None,
                              rand_bits: int | None = None, pad: bool = False,
                              rng: random_bits_lib.Method = "hash",
                              convention: str = "te",
                              amax_axis_name: AmaxAxisName = None) -> jax.Array:
  """float32 ``dequantize(quantize_nvfp4(x, ...))`` in one jitted pass over ``x``.

  Equal bit for bit to the two-step form (tested); arguments as
  :func:`quantize_nvfp4`. Gradient: straight-through.
  """
  _, (axes, blocks), amax_axis_name = _nvfp4_args(
      x, block_shape, axis, rounding, key, rand_bits, rng, convention,
      "quantize_dequantize_nvfp4", amax_axis_name)
  return _qdq_nvfp4(jnp.asarray(x), key, axes=axes, blocks=blocks, rounding=rounding,
                    rand_bits=rand_bits, pad=pad, rng=rng, convention=convention,
                    amax_axis_name=amax_axis_name)


@functools.partial(jax.jit, static_argnames=(
    "axes", "blocks", "rounding", "rand_bits", "pad", "rng", "amax_axis_name"))
def _qdq_nvfp4_blocks(x, key, *, axes, blocks, rounding, rand_bits, pad, rng,
                      amax_axis_name):

  def run(x, key):
    xp = _pad(x.astype(jnp.float32), axes, blocks, pad)
    words = _words(key, xp, rounding, rng)
    values, inv_s_enc = nvfp4_te_fast(xp, axes, blocks, rounding=rounding, words=words,
                                      rand_bits=rand_bits, dequantize="blocks",
                                      amax_axis_name=amax_axis_name)
    return values[tuple(slice(0, d) for d in x.shape)], inv_s_enc

  return gradients_lib.not_differentiable(
      run, "quantize_dequantize_nvfp4_blocks",
      "quantize_dequantize_nvfp4 (straight-through)")(x, key)


def quantize_dequantize_nvfp4_blocks(x: jax.Array, *,
                                     block_shape: int | Sequence[int] | None = None,
                                     axis: int | Sequence[int] | None = None,
                                     rounding: str = "nearest",
                                     key: jax.Array | None = None,
                                     rand_bits: int | None = None, pad: bool = False,
                                     rng: random_bits_lib.Method = "hash",
                                     amax_axis_name: AmaxAxisName = None
                                     ) -> tuple[jax.Array, jax.Array]:
  """NVFP4 (``te`` convention) dequantized up to its tensor scale: ``(values, 1/S_enc)``.

  ``values`` (float32, x's shape) is each element times its block's E4M3 scale,
  ``E2M1 * S_dec``: at most 6 significant bits and at least 2^-10 in magnitude, so
  exact in bfloat16 (NaN for a block holding NaN or Inf). ``values * (1/S_enc)`` equals
  :func:`quantize_dequantize_nvfp4` bit for bit (that function's one float32
  rounding). A GEMM of two such operands can multiply ``values`` in bfloat16 with
  float32 accumulation and apply both tensor scales to its output, as an NVFP4 tensor
  core GEMM does (Transformer Engine passes them to cuBLASLt as ``alpha``):
  :mod:`numerics.qdot` does. Arguments as :func:`quantize_nvfp4`.

  Not differentiable (raises under ``jax.grad``; ``values`` is not in x's units).
  """
  _, (axes, blocks), amax_axis_name = _nvfp4_args(
      x, block_shape, axis, rounding, key, rand_bits, rng, "te",
      "quantize_dequantize_nvfp4_blocks", amax_axis_name)
  return _qdq_nvfp4_blocks(jnp.asarray(x), key, axes=axes, blocks=blocks,
                           rounding=rounding, rand_bits=rand_bits, pad=pad, rng=rng,
                           amax_axis_name=amax_axis_name)


def _finite_amax(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(int32 bits, float32 value) of max |x| over finite values (0 when none)."""
  a = lax.bitcast_convert_type(x, jnp.uint32) & _U(0x7FFFFFFF)
  finite = a < _U(0x7F800000)
  bits = jnp.max(jnp.where(finite, a, _U(0)).astype(jnp.int32), initial=0)
  return bits, lax.bitcast_convert_type(bits, jnp.float32)


def nvfp4_tensor_scale(x: jax.Array, *, amax_axis_name: AmaxAxisName = None
                       ) -> tuple[jax.Array, jax.Array]:
  """float32 scalars ``(S_enc, 1/S_enc)`` of float32 ``x`` (amax over finite values,
  and over the mesh axes ``amax_axis_name`` inside ``shard_map``).

  The only whole-tensor step of NVFP4 (``te`` convention): the Pallas kernels take both
  as inputs.
  """
  bits, _ = _finite_amax(x)
  bits = reduce_amax_bits(bits, amax_axis_name)
  return _tensor_scale_of_amax(bits, lax.bitcast_convert_type(bits, jnp.float32))


def _tensor_scale_of_amax(t_amax_bits, t_amax):
  # Scalars, outside the Pallas kernels (they take both as inputs): XLA's exact
  # integer division, the same bits as div_rn's loop in fewer ops.
  div = rounding_lib.div_rn_idiv
  s_enc = jnp.minimum(div(np.float32(448.0 * 6.0), t_amax), _FLT_MAX)
  s_enc = jnp.where((t_amax_bits == 0) | (s_enc == 0), np.float32(1.0), s_enc)
  return s_enc, div(np.float32(1.0), s_enc)


def nvfp4_torchao_tensor_scale(x: jax.Array, *, amax_axis_name: AmaxAxisName = None
                               ) -> jax.Array:
  """torchao's ``per_tensor_scale = amax / (448 * 6)`` (float32 scalar; 1 when amax = 0).

  ``amax`` is over finite values (torchao's ``torch.max`` would propagate NaN), and over
  the mesh axes ``amax_axis_name`` inside ``shard_map``.
  """
  t_amax_bits, _ = _finite_amax(x)
  t_amax_bits = reduce_amax_bits(t_amax_bits, amax_axis_name)
  t_amax = lax.bitcast_convert_type(t_amax_bits, jnp.float32)
  pts = rounding_lib.div_rn_idiv(t_amax, np.float32(448.0 * 6.0))
  # XLA:CPU compares a subnormal quotient equal to zero (see nonzero_magnitude).
  pts_zero = ~rounding_lib.nonzero_magnitude(lax.bitcast_convert_type(pts, jnp.uint32))
  return jnp.where((t_amax_bits == 0) | pts_zero, np.float32(1.0), pts)


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


def _nvfp4_elements(xp, enc_full, poison_full, rounding, words, rand_bits):
  """(E2M1 codes, float32 element values) of ``xp * enc`` (poisoned blocks: zero codes)."""
  f = formats_lib.get("e2m1")
  scaled = _mul_subnormal_lhs(jnp.where(poison_full, np.float32(0.0), xp), enc_full)
  sb = lax.bitcast_convert_type(scaled, jnp.uint32)
  elem = _round_elements(sb & _U(0x7FFFFFFF), sb >> 31, f, 0, rounding, words, rand_bits)
  elem_f = lax.bitcast_convert_type(elem, jnp.float32)
  codes = jnp.where(poison_full, jnp.uint8(0), encoding.encode(elem_f, f))
  return codes, elem_f


def _block_amax(xp, axes, blocks):
  """(float32 finite block amax, poisoned, blocked shape, block positions) of ``xp``."""
  a = lax.bitcast_convert_type(xp, jnp.uint32) & _U(0x7FFFFFFF)
  amax, bshape, bpos = _block_amax_bits(a, axes, blocks)
  poisoned = amax >= _U(0x7F800000)
  block_amax = lax.bitcast_convert_type(jnp.where(poisoned, _U(0), amax), jnp.float32)
  return block_amax, poisoned, bshape, bpos


def _nvfp4_te_scales(block_amax, s_enc, scalar_div=rounding_lib.div_rn):
  """(E4M3-rounded S_dec, element multiplier enc) per block, TE's chain.

  ``scalar_div`` forms the scalar ``1/S_enc``: :func:`numerics.rounding.div_rn` in the
  Pallas kernels' body, :func:`numerics.rounding.div_rn_idiv` in jnp programs (the
  same bits; CSE'd with the tensor scale's own). The per-block reciprocal stays on
  ``div_rn``'s loop, which fuses into one pass (XLA:CPU keeps integer divisions out
  of fusions: per-block divisions took ``quantize_nvfp4`` from 0.8-1.3x a copy's
  time to 1.4-2.5x)."""
  s_dec = jnp.minimum(_mul_subnormal_lhs(block_amax, s_enc * np.float32(1.0 / 6.0)),
                      np.float32(448.0))
  s_dec = rounding_lib.round_f32(s_dec, formats_lib.get("e4m3"), rounding="nearest",
                                 saturate=True)
  inv_s_enc = scalar_div(np.float32(1.0), s_enc)
  # 1/S_enc is subnormal for a tensor amax below 2688 * 2^-126: the product is formed
  # in integers, as XLA:CPU and TPUs would read that operand as zero.
  enc = jnp.minimum(
      rounding_lib.div_rn(np.float32(1.0), rounding_lib.mul_narrow(s_dec, inv_s_enc)),
      _FLT_MAX)
  return s_dec, enc


def _nvfp4_torchao_scales(block_amax, per_tensor_scale):
  """(unclamped scaled block scale, E4M3 scale s, element multiplier) per block."""
  block_scale = rounding_lib.div_rn(block_amax, np.float32(6.0))
  scaled_scale = rounding_lib.div_rn(block_scale, per_tensor_scale)
  s = jnp.clip(scaled_scale, _E4M3_EPS, np.float32(448.0))
  s = rounding_lib.round_f32(s, formats_lib.get("e4m3"), rounding="nearest",
                             saturate=True)
  inv_pts = rounding_lib.div_rn_idiv(np.float32(1.0), per_tensor_scale)  # scalar
  # 1 / per_tensor_scale overflows for a tensor amax below 2688 / FLT_MAX; torchao's
  # Inf / s stays Inf (div_rn takes finite operands).
  reciprocal = jnp.where(jnp.isinf(inv_pts), inv_pts, rounding_lib.div_rn(inv_pts, s))
  return scaled_scale, s, reciprocal


def nvfp4_quantize_core(xp: jax.Array, s_enc: jax.Array, axes: tuple[int, ...],
                        blocks: tuple[int, ...], rounding: str, words: jax.Array | None,
                        rand_bits: int | None
                        ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(E2M1 codes, E4M3 scale codes, float32 element x block-scale values) of ``xp``.

  The ``te`` convention. ``xp`` is float32 with block-divisible axes and ``s_enc`` its
  tensor scale (:func:`nvfp4_tensor_scale`); the values (NaN in poisoned blocks) times
  ``1/S_enc`` are the dequantized tensor. Run by :func:`quantize_nvfp4` and the Pallas
  kernels in :mod:`numerics.kernels.nvfp4_quantizers`.
  """
  e4m3 = formats_lib.get("e4m3")
  block_amax, poisoned, bshape, bpos = _block_amax(xp, axes, blocks)
  s_dec, enc = _nvfp4_te_scales(block_amax, s_enc)
  enc_full = jnp.broadcast_to(enc, bshape).reshape(xp.shape)
  # The poison flag travels as a NaN scale (S_dec is otherwise finite): Mosaic TPU
  # cannot move a boolean mask between layouts (no i1 transpose).
  s_dec_full = jnp.broadcast_to(jnp.where(poisoned, np.float32(np.nan), s_dec),
                                bshape).reshape(xp.shape)
  poison_full = jnp.isnan(s_dec_full)
  codes, elem_f = _nvfp4_elements(xp, enc_full, poison_full, rounding, words, rand_bits)
  scale_codes = jnp.where(poisoned, jnp.uint8(e4m3.nan_code), encoding.encode(s_dec, e4m3))
  scale_codes = jnp.squeeze(scale_codes, axis=bpos)
  # element * E4M3 scale is exact in float32 (at most 2 + 4 significant bits, >= 2^-10);
  # poisoned blocks: 0 * NaN.
  values = elem_f * s_dec_full
  return codes, scale_codes, values


_E4M3_EPS = np.float32(2.0 ** -6)  # torchao's E4M3_EPS: float8_e4m3fn's smallest normal


def nvfp4_torchao_quantize_core(xp: jax.Array, per_tensor_scale: jax.Array,
                                axes: tuple[int, ...], blocks: tuple[int, ...],
                                rounding: str, words: jax.Array | None,
                                rand_bits: int | None
                                ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(E2M1 codes, E4M3 scale codes, float32 dequantized values) of ``xp``, torchao's way.

  torchao's ``nvfp4_quantize`` with a per-tensor scale: ``s = e4m3(clamp((block_amax /
  6) / per_tensor_scale, 2^-6, 448))``, elements ``e2m1(clamp(x * ((1 /
  per_tensor_scale) / s), -6, 6))``, dequantized ``e2m1 * (per_tensor_scale * s)``
  (every operation one float32 rounding; divisions by :func:`numerics.rounding.div_rn`).
  Runs on the jnp path only (no Pallas kernel).
  """
  e4m3 = formats_lib.get("e4m3")
  block_amax, poisoned, bshape, bpos = _block_amax(xp, axes, blocks)
  _, s, reciprocal = _nvfp4_torchao_scales(block_amax, per_tensor_scale)
  rec_full = jnp.broadcast_to(reciprocal, bshape).reshape(xp.shape)
  poison_full = jnp.broadcast_to(poisoned, bshape).reshape(xp.shape)
  # Saturation to +-6 is torchao's clamp before the E2M1 cast.
  codes, elem_f = _nvfp4_elements(xp, rec_full, poison_full, rounding, words, rand_bits)
  # A reciprocal that overflowed to Inf (a zero block of a tensor with amax below about
  # 5e-34) makes torchao's 0 * Inf a NaN, which the E2M1 cast stores as code 0; ours
  # would saturate the NaN to -6.
  zero_times_inf = jnp.isinf(rec_full) & ~rounding_lib.nonzero_magnitude(
      lax.bitcast_convert_type(xp, jnp.uint32) & _U(0x7FFFFFFF))
  codes = jnp.where(zero_times_inf, jnp.uint8(0), codes)
  elem_f = jnp.where(zero_times_inf, np.float32(0.0), elem_f)
  scale_codes = jnp.where(poisoned, jnp.uint8(e4m3.nan_code), encoding.encode(s, e4m3))
  scale_codes = jnp.squeeze(scale_codes, axis=bpos)
  values = tensor_scaled(per_tensor_scale, lambda mul: mul(
      elem_f, jnp.broadcast_to(mul(s, per_tensor_scale), bshape).reshape(xp.shape)))
  values = jnp.where(poison_full, np.float32(np.nan), values)
  return codes, scale_codes, values


def nvfp4_grid_multipliers(x: jax.Array, *, block_shape: int | Sequence[int] | None = None,
                           axis: int | Sequence[int] | None = None, pad: bool = False,
                           convention: str = "te", amax_axis_name: AmaxAxisName = None
                           ) -> tuple[jax.Array, jax.Array]:
  """(float32 per element: the multiplier that maps x onto E2M1's grid, bool per block:
  the block scale was clamped) of NVFP4 with these arguments.

  Clamped: ``te``, a nonzero block whose E4M3 scale rounded to zero (TE has no lower
  clamp, so its elements flush); ``torchao``, a nonzero block whose scale was raised to
  2^-6 or lowered to 448. For numerics telemetry; blocks and conventions as in
  :func:`quantize_nvfp4`.
  """
  if convention not in NVFP4_CONVENTIONS:
    raise ValueError(f"NVFP4 convention must be one of {NVFP4_CONVENTIONS}, got "
                     f"{convention!r}")
  x = _check_x(x, "nvfp4_grid_multipliers")
  axes, blocks = nvfp4_layout(x.ndim, block_shape, axis)
  xp = _pad(x, axes, blocks, pad)
  block_amax, _, bshape, bpos = _block_amax(xp, axes, blocks)
  amax_axis_name = check_amax_axis_name(amax_axis_name, "nvfp4_grid_multipliers")
  if convention == "te":
    s_enc, _ = nvfp4_tensor_scale(xp, amax_axis_name=amax_axis_name)
    s_dec, mult = _nvfp4_te_scales(block_amax, s_enc, rounding_lib.div_rn_idiv)
    clamped = (s_dec == 0) & (block_amax > 0)
  else:
    pts = nvfp4_torchao_tensor_scale(xp, amax_axis_name=amax_axis_name)
    scaled, _, mult = _nvfp4_torchao_scales(block_amax, pts)
    clamped = ((scaled < _E4M3_EPS) | (scaled > 448.0)) & (block_amax > 0)
  full = jnp.broadcast_to(mult, bshape).reshape(xp.shape)
  return (full[tuple(slice(0, d) for d in x.shape)],
          jnp.squeeze(clamped, axis=bpos))


def mx_scale_clamped(x: jax.Array, fmt: str | formats_lib.Format = "e4m3", *,
                     block_shape: int | Sequence[int] | None = None,
                     axis: int | Sequence[int] | None = None,
                     scale_rule: ScaleRule = "floor", pad: bool = False) -> jax.Array:
  """bool per block (the scales' shape): the scale rule asked for an E8M0 exponent
  outside [-127, 127], so the block's scale was clamped (NaN/Inf and zero blocks:
  False). For numerics telemetry; blocks as in :func:`quantize_mx`."""
  f = formats_lib.get(fmt)
  x = _check_x(x, "mx_scale_clamped")
  axes, blocks = _layout(x.ndim, block_shape, axis)
  xp = _pad(x, axes, blocks, pad)
  a = lax.bitcast_convert_type(xp, jnp.uint32) & _U(0x7FFFFFFF)
  amax, _, bpos = _block_amax_bits(a, axes, blocks)
  amax = jnp.where(amax >= _U(0x7F800000), _U(0), amax)
  code = mx_scale_code_unclamped(amax, f, scale_rule)
  return jnp.squeeze((code < 0) | (code > 254), axis=bpos)


def _materialize(*block_values: jax.Array) -> tuple[jax.Array, ...]:
  """The same per-block float32 arrays (values >= +0, or NaN with the sign bit clear),
  computed once.

  XLA fuses cheap per-block integer arithmetic (here: E4M3 rounding of the block
  scale, the integer-emulated division of ``enc``) into the per-element loop that
  broadcasts it, which recomputes it for every element (16-256x the work), and the CPU
  pipeline drops ``optimization_barrier`` before fusion. A reduction is never fused
  into its consumer, so each array is passed through a max-reduction with zero over a
  new axis of two, on the int32 bits (such floats order as their bits, NaN above every
  number): the result is the input, bit for bit, and materialized.
  """
  bits = [lax.bitcast_convert_type(v, jnp.int32) for v in block_values]
  stacked = [jnp.stack([b, jnp.zeros_like(b)], axis=-1) for b in bits]
  out = lax.reduce(tuple(stacked), tuple(np.int32(0) for _ in bits),
                   lambda x, y: tuple(jnp.maximum(a, b) for a, b in zip(x, y)),
                   (bits[0].ndim,))
  return tuple(lax.bitcast_convert_type(o, jnp.float32) for o in out)


# E2M1 round-to-nearest-even of a magnitude m >= 0 (saturating at 6) as float adds:
# ``(m + C) - C`` rounds m to a multiple of C's ulp in the sum's binade, ties to even,
# with C = 1.5 * 2^22 (quantum 0.5) below 2, 1.5 * 2^23 (quantum 1) below 4 and
# 1.5 * 2^24 (quantum 2) above; larger m (and Inf) come out above 6 and saturate.
_E2M1_RNE_ADD = (np.float32(1.5 * 2.0 ** 22), np.float32(1.5 * 2.0 ** 23),
                 np.float32(1.5 * 2.0 ** 24))


def _e2m1_rne_magnitude(m: jax.Array) -> jax.Array:
  """float32 E2M1 value (0 .. 6) nearest to float32 ``m >= 0``, ties to even."""
  c = jnp.where(m < np.float32(2.0), _E2M1_RNE_ADD[0],
                jnp.where(m < np.float32(4.0), _E2M1_RNE_ADD[1], _E2M1_RNE_ADD[2]))
  return jnp.minimum((m + c) - c, np.float32(6.0))


def _e2m1_sr_magnitude(m: jax.Array, words: jax.Array, rand_bits: int | None
                       ) -> jax.Array:
  """float32 E2M1 value (0 .. 6) of float32 ``m >= 0`` rounded stochastically.

  Equal bit for bit to :func:`numerics.rounding.round_magnitude` on E2M1's grid (then
  saturated at 6), but in float arithmetic: with quantum ``q`` (0.5 below 2, 1 below
  4, 2 above), ``t = m / q`` and its fraction ``t - floor(t)`` are exact, and the
  reference rounds away from zero exactly when the fraction's top ``r`` bits plus the
  word's top ``r`` bits carry out of ``r`` bits (``r = rand_bits``, 32 when None; a
  fraction with fewer bits is padded with zeros, which cannot change the carry). That
  is the carry of the fraction's top 32 bits plus the word with its low ``32 - r``
  bits cleared: the fraction's bits below ``r`` are too few to carry on their own.
  """
  inv_q = jnp.where(m < np.float32(2.0), np.float32(2.0),
                    jnp.where(m < np.float32(4.0), np.float32(1.0), np.float32(0.5)))
  t = m * inv_q
  k = jnp.floor(t)
  # The fraction's top 32 bits; exact below 2^32, and an Inf m gives NaN here, which
  # only decides whether Inf + 1 saturates to 6.
  frac = ((t - k) * np.float32(2.0 ** 32)).astype(jnp.uint32)
  if rand_bits is not None and rand_bits < 32:
    words = words & np.uint32((0xFFFFFFFF << (32 - rand_bits)) & 0xFFFFFFFF)
  away = words > ~frac  # frac + words >= 2^32
  return jnp.minimum((k + away.astype(jnp.float32)) / inv_q, np.float32(6.0))


def _e2m1_code_of_magnitude(bits: jax.Array) -> jax.Array:
  """uint32 E2M1 magnitude code (0..7) of the float32 bits of an E2M1 value >= 0."""
  e = bits >> 23  # 0.5 -> 126, 1 -> 127, ..., 6 -> 129
  normal = ((e - np.uint32(126)) << 1) | ((bits >> 22) & np.uint32(1))
  return jnp.where(e >= np.uint32(127), normal,
                   jnp.where(e == np.uint32(126), np.uint32(1), np.uint32(0)))


def nvfp4_te_fast(xp: jax.Array, axes: tuple[int, ...], blocks: tuple[int, ...], *,
                  rounding: str, words, rand_bits: int | None,
                  dequantize: bool | str, amax_axis_name: AmaxAxisName = None):
  """NVFP4 (``te`` convention, any rounding) in two passes over ``xp``.

  The fast jnp path of :func:`quantize_nvfp4` and :func:`quantize_dequantize_nvfp4`:
  one pass takes each block's amax (finite and not, in one variadic reduction), from
  which the tensor amax, ``S_enc`` and each block's ``S_dec`` and ``enc`` follow
  (:func:`_nvfp4_te_scales`, materialized once per block by :func:`_materialize`);
  the second works on ``x`` in its blocked shape (a per-block value is a plain
  broadcast there): it scales ``|x|`` by ``enc`` (a float32 subnormal ``x`` scaled up
  by 2^24 first, as :func:`_mul_subnormal_lhs` does) and rounds onto E2M1, to nearest
  by float adds (:func:`_e2m1_rne_magnitude`), stochastically on ``words`` in float
  arithmetic (:func:`_e2m1_sr_magnitude`), toward zero by the reference
  :func:`numerics.rounding.round_magnitude`. Equal bit for bit to
  :func:`nvfp4_quantize_core` (tested, and both against the NumPy reference).
  Returns (codes, scale codes, 1/S_enc), or the dequantized float32 tensor with
  ``dequantize``, or with ``dequantize="blocks"`` (the dequantized tensor before its
  tensor scale, 1/S_enc). ``words``: uint32 of ``xp``'s shape (or a function returning
  them, called where they are used, so that XLA fuses them), or None.
  ``amax_axis_name``: as :func:`quantize_nvfp4`. With ``dequantize=True`` the second
  pass runs behind :func:`tensor_scaled`.
  """
  e4m3 = formats_lib.get("e4m3")
  bshape, bpos = _blocked_shape(xp.shape, axes, blocks)
  xb = lax.bitcast_convert_type(xp, jnp.uint32).reshape(bshape)
  ab = lax.bitcast_convert_type(xb & np.uint32(0x7FFFFFFF), jnp.int32)
  finite_ab = jnp.where(ab < np.int32(0x7F800000), ab, np.int32(0))
  amax, finite_amax = ab, finite_ab
  for p in reversed(bpos):  # tiles: the contiguous in-block axis first (faster on CPU)
    amax, finite_amax = lax.reduce(
        (amax, finite_amax), (np.int32(0), np.int32(0)),
        lambda x, y: (jnp.maximum(x[0], y[0]), jnp.maximum(x[1], y[1])), (p,))
    amax, finite_amax = (jnp.expand_dims(v, p) for v in (amax, finite_amax))
  t_amax_bits = reduce_amax_bits(jnp.max(finite_amax, initial=np.int32(0)),
                                 amax_axis_name)
  s_enc, inv_s_enc = _tensor_scale_of_amax(
      t_amax_bits, lax.bitcast_convert_type(t_amax_bits, jnp.float32))
  poisoned = amax >= np.int32(0x7F800000)
  block_amax = lax.bitcast_convert_type(jnp.where(poisoned, np.int32(0), amax),
                                        jnp.float32)
  s_dec, enc = _materialize(*_nvfp4_te_scales(block_amax, s_enc,
                                                rounding_lib.div_rn_idiv))
  if dequantize is True:
    # x, not its bits, enters the branches: an operand of lax.cond is materialized.
    return tensor_scaled(inv_s_enc, lambda mul: _nvfp4_te_second_pass(
        xp, poisoned, s_dec, enc, words, rounding, rand_bits, bshape,
        lambda v: mul(v, inv_s_enc))).reshape(xp.shape)
  elem, elem_bits, sign = _nvfp4_te_elements(xb, poisoned, enc, words, rounding,
                                             rand_bits, bshape)
  if dequantize:
    value = elem * s_dec  # exact: at most 2 + 4 significant bits, >= 2^-10
    value = lax.bitcast_convert_type(
        lax.bitcast_convert_type(value, jnp.uint32) | sign, jnp.float32)
    value = jnp.where(poisoned, np.float32(np.nan), value).reshape(xp.shape)
    return value, inv_s_enc
  codes = (sign >> 28) | _e2m1_code_of_magnitude(elem_bits)
  codes = jnp.where(poisoned, np.uint32(0), codes).astype(jnp.uint8).reshape(xp.shape)
  scale_codes = jnp.where(poisoned, np.uint32(e4m3.nan_code),
                          encode_e4m3_nonnegative(s_dec)).astype(jnp.uint8)
  return codes, jnp.squeeze(scale_codes, axis=bpos), inv_s_enc


_NORMAL_PRODUCT_MIN = np.int32(np.float32(2.0 ** -116).view(np.int32))


def _multiply_is_normal(scale: jax.Array) -> jax.Array:
  """Whether ``scale >= 2^-116``: then ``v * scale`` for every nonzero NVFP4 value
  ``v`` before its tensor scale (``|v| >= 2^-10``, or torchao's ``s >= 2^-9`` and
  ``element >= 2^-1``) has normal operands and a normal result, so a float multiply
  rounds it as IEEE does on every backend, XLA:CPU's flushing ones included."""
  # int32 bits (magnitudes order like them): the Pallas kernels run this on a scalar.
  return (lax.bitcast_convert_type(scale, jnp.int32) & _I(0x7FFFFFFF)) >= \
      _NORMAL_PRODUCT_MIN


def tensor_scaled(scale: jax.Array, fn):
  """``fn(mul)``: a per-element pass that multiplies NVFP4 values by the tensor scale
  ``scale`` with ``mul``, the float multiply where :func:`_multiply_is_normal` and
  :func:`numerics.rounding.mul_narrow` (exact in integers, about as costly as the rest
  of the pass) where a subnormal scale or result needs it. The pass is traced twice
  behind a scalar ``lax.cond``, so a normal tensor pays nothing for the exact one."""
  return lax.cond(_multiply_is_normal(scale), lambda: fn(jnp.multiply),
                  lambda: fn(rounding_lib.mul_narrow))


def _call(words):
  """Random words given as an array or as a function returning one."""
  return words() if callable(words) else words


def _nvfp4_te_elements(xb, poisoned, enc, words, rounding, rand_bits, bshape):
  """(E2M1 magnitudes as float32 and as bits, sign bits) of the blocked bits ``xb``."""
  words = None if words is None else _call(words)
  a = jnp.where(poisoned, np.uint32(0), xb & np.uint32(0x7FFFFFFF))
  sign = xb & np.uint32(0x80000000)
  # |x| * enc, also for a float32 subnormal |x| (XLA:CPU would read it as zero): the
  # bits of a subnormal are its value in units of 2^-149, so float(a) * 2^-125 is
  # |x| * 2^24 exactly; the product is scaled back by 2^-24 (_mul_subnormal_lhs).
  sub = a < np.uint32(0x00800000)
  up = jnp.where(sub, a.astype(jnp.float32) * np.float32(2.0 ** -125),
                 lax.bitcast_convert_type(a, jnp.float32))
  prod = up * enc
  scaled = jnp.where(sub, prod * np.float32(2.0 ** -24), prod)
  if rounding == "nearest":
    elem = _e2m1_rne_magnitude(scaled)
    elem_bits = lax.bitcast_convert_type(elem, jnp.uint32)
  elif rounding == "stochastic":
    elem = _e2m1_sr_magnitude(scaled, words.reshape(bshape), rand_bits)
    elem_bits = lax.bitcast_convert_type(elem, jnp.uint32)
  else:
    elem_bits = _round_elements(lax.bitcast_convert_type(scaled, jnp.uint32), _U(0),
                                formats_lib.get("e2m1"), 0, rounding,
                                None if words is None else words.reshape(bshape),
                                rand_bits)
    elem = lax.bitcast_convert_type(elem_bits, jnp.float32)
  return elem, elem_bits, sign


def _nvfp4_te_second_pass(xp, poisoned, s_dec, enc, words, rounding, rand_bits, bshape,
                          scale_by_tensor):
  """The dequantized tensor (blocked shape): ``scale_by_tensor(element * S_dec)``."""
  xb = lax.bitcast_convert_type(xp, jnp.uint32).reshape(bshape)
  elem, _, sign = _nvfp4_te_elements(xb, poisoned, enc, words, rounding, rand_bits,
                                     bshape)
  value = elem * s_dec  # exact: at most 2 + 4 significant bits, >= 2^-10
  value = lax.bitcast_convert_type(
      lax.bitcast_convert_type(value, jnp.uint32) | sign, jnp.float32)
  return jnp.where(poisoned, np.float32(np.nan), scale_by_tensor(value))


def encode_e4m3_nonnegative(v: jax.Array) -> jax.Array:
  """uint32 E4M3 code (0..126) of float32 ``v >= 0`` exactly representable in E4M3."""
  b = lax.bitcast_convert_type(v, jnp.uint32)
  e = (b >> 23).astype(jnp.int32) - 127  # normal float32 (E4M3 values are >= 2^-9)
  normal = ((e + 7).astype(jnp.uint32) << 3) | ((b >> 20) & np.uint32(7))
  sub = (b >> 20 & np.uint32(7) | np.uint32(8)) >> jnp.clip(-6 - e, 0, 4).astype(
      jnp.uint32)
  return jnp.where(v == 0, np.uint32(0), jnp.where(e >= -6, normal, sub))


def _expand_scales(q: QuantizedArray, values: jax.Array) -> jax.Array:
  """Broadcasts per-block ``values`` (scales' shape) to the codes' shape."""
  bshape, bpos = _blocked_shape(q.padded_shape, q.axes, q.block_shape)
  v = jnp.expand_dims(values, bpos)
  return jnp.broadcast_to(v, bshape).reshape(q.padded_shape)


def _dequantize_one(q: QuantizedArray) -> jax.Array:
  f = formats_lib.get(q.fmt)
  if q.scale_fmt == "e8m0":
    s_code = _expand_scales(q, q.scales.astype(jnp.int32))
    s_int = s_code - 127 - (f.emax - f.mx_emax)
    out = encoding.decode_scaled(q.codes, f, s_int)
    out = jnp.where(s_code == 255, np.float32(np.nan), out)
  elif q.scale_rule == "nvfp4_torchao":
    def decode(mul):
      scale = _expand_scales(q, encoding.decode(q.scales, "e4m3"))
      return mul(encoding.decode(q.codes, f), mul(scale, q.tensor_scale))
    out = tensor_scaled(q.tensor_scale, decode)
  else:
    # Element (n_e 2^qe_e) times E4M3 scale (n_s 2^qe_s): integer product, exact.
    _, n_e_t, qe_e_t, _ = encoding.decode_parts_table(f.name)
    sgn_s_t, n_s_t, qe_s_t, nan_s_t = encoding.decode_parts_table(q.scale_fmt)
    def decode(mul):
      ce = q.codes.astype(jnp.int32)
      cs = _expand_scales(q, q.scales.astype(jnp.int32))
      n = jnp.take(jnp.asarray(n_e_t), ce) * jnp.take(jnp.asarray(n_s_t), cs)
      qe = jnp.take(jnp.asarray(qe_e_t), ce) + jnp.take(jnp.asarray(qe_s_t), cs)
      bits = rounding_lib.compose_bits(n, qe) | ((q.codes.astype(jnp.uint32) >> 3) << 31)
      out = mul(lax.bitcast_convert_type(bits, jnp.float32), q.tensor_scale)
      return jnp.where(jnp.take(jnp.asarray(nan_s_t), cs), np.float32(np.nan), out)
    out = tensor_scaled(q.tensor_scale, decode)
  return out[tuple(slice(0, d) for d in q.shape)]


@jax.jit
def dequantize(q: QuantizedArray) -> jax.Array:
  """float32 array of the original shape: element * block scale (* tensor scale).

  MX decoding is exact (the product is built bit by bit, so block scales down to
  2^-127 work on XLA:CPU too). NVFP4 (``te``): element * E4M3 scale is exact as well;
  the final multiply by the fp32 tensor scale is one float32 rounding. NVFP4
  (``torchao``): ``element * (per_tensor_scale * scale)``, two roundings, as torchao's
  ``dequantize``. A batched ``q`` (leading dimensions from ``jax.vmap``) gives
  ``batch_shape + shape``. Gradient: none (integer codes).
  """
  if not isinstance(q, QuantizedArray):
    raise TypeError(f"dequantize expects a QuantizedArray, got {type(q).__name__}")
  batch = q.batch_shape
  if not batch:
    return _dequantize_one(q)
  n = math.prod(batch)
  flat = dataclasses.replace(
      q, codes=q.codes.reshape((n,) + q.codes.shape[len(batch):]),
      scales=q.scales.reshape((n,) + q.scales.shape[len(batch):]),
      tensor_scale=(q.tensor_scale.reshape(n) if q.tensor_scale.shape else
                    jnp.broadcast_to(q.tensor_scale, (n,))))
  out = jax.vmap(_dequantize_one)(flat)
  return out.reshape(batch + q.shape)
