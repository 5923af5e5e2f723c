"""Block-scaled arrays and their layouts: :class:`QuantizedArray`, block geometry,
padding, per-block amaxes, and the checks every block quantizer runs on its input.

``block_shape`` is the one name for block geometry. An int ``b`` (or ``(b,)``) is a 1D
block of ``b`` consecutive elements along the int ``axis`` (default ``-1``); a tuple
``(b0, b1, ...)`` tiles the axes in the tuple ``axis`` (default: the last
``len(block_shape)`` axes), e.g. ``block_shape=(32, 32)`` for ALTO's 2D weight tiles.
Conflicting arguments raise (an int ``axis`` with a 2D ``block_shape``, a tuple
``axis`` of another length, a non-positive extent). An axis whose length the block
does not divide raises, unless ``pad=True`` (zeros are appended, which leaves every
block's amax unchanged, and ``dequantize`` slices them off).

A :class:`QuantizedArray` checks its fields when built (code and scale shapes against
``shape``, ``axes`` and ``block_shape``, and an MX or NVFP4 pairing of element format,
scale format and scale rule); one with leading batch dimensions (e.g. from
``jax.vmap(quantize_mx)``) dequantizes per example.

All amax arithmetic is done on the float32 bit patterns: XLA:CPU flushes float32
subnormals to zero in float arithmetic, which would silently change scales. The
quantizers are :mod:`numerics.mx` (OCP MX) and :mod:`numerics.nvfp4`;
:mod:`numerics.blockscale` gathers their public names and :func:`dequantize`.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.numerics import encoding
from lowprec.numerics import formats as formats_lib
from lowprec.numerics import rounding as rounding_lib
from lowprec.numerics.mx_scales import (MX_BLOCK, MX_ELEMENT_FORMATS, QWIX_RULE,
                                        SCALE_RULES)

_U = np.uint32

NVFP4_BLOCK = 16  # elements per E4M3 block scale
NVFP4_CONVENTIONS = ("te", "torchao", "qwix")
# The scale_rule a QuantizedArray of each NVFP4 convention records.
NVFP4_SCALE_RULES = {"te": "nvfp4", "torchao": "nvfp4_torchao", "qwix": "nvfp4_qwix"}


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
                                NVFP4_SCALE_RULES.values()):
    raise ValueError(f"an E4M3-scaled QuantizedArray is NVFP4 (fmt 'e2m1', scale_rule "
                     f"in {tuple(NVFP4_SCALE_RULES.values())}), got fmt {q.fmt!r}, "
                     f"scale_rule {q.scale_rule!r}")
  if q.scale_fmt == "e8m0" and (q.fmt not in MX_ELEMENT_FORMATS
                                or q.scale_rule not in SCALE_RULES + (QWIX_RULE,)):
    raise ValueError(f"an E8M0-scaled QuantizedArray is MX (fmt in {MX_ELEMENT_FORMATS}, "
                     f"scale_rule in {SCALE_RULES + (QWIX_RULE,)}), got fmt {q.fmt!r}, "
                     f"scale_rule {q.scale_rule!r}")
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


def resolve_layout(ndim: int, block_shape, axis, default: int = MX_BLOCK) -> tuple[
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


def pad_blocks(x: jax.Array, axes, blocks, pad: bool) -> jax.Array:
  if not pad:
    for a, b in zip(axes, blocks):
      if x.shape[a] % b:
        raise ValueError(
            f"axis {a} of shape {x.shape} has length {x.shape[a]}, not divisible by "
            f"the block extent {b}; pass pad=True to zero-pad it")
  return pad_to_multiple(x, axes, blocks)


def blocked_shape(shape, axes, blocks):
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


def max_bits_per_block(a: jax.Array, axes, blocks) -> jax.Array:
  """Per-block max of magnitude bits ``a`` (uint32), broadcastable to ``a``'s blocks.

  Reduced as int32 (magnitude bits are below 2^31, so the order is the same): Mosaic
  TPU kernels, which run this code, have no unsigned reductions.
  """
  bshape, bpos = blocked_shape(a.shape, axes, blocks)
  m = jnp.max(lax.bitcast_convert_type(a, jnp.int32).reshape(bshape), axis=bpos,
              keepdims=True)
  return lax.bitcast_convert_type(m, jnp.uint32), bshape, bpos


def check_block_input(x: jax.Array, fn: str) -> jax.Array:
  """float32 ``x``, or TypeError/ValueError naming the public function ``fn``."""
  x = rounding_lib.check_float_input(x, fn)
  if x.ndim == 0:
    raise ValueError(f"{fn}: block quantization needs an array with at least one axis, "
                     f"got a scalar")
  return x.astype(jnp.float32)


def round_elements(a, sign, fmt, scale_exp, rounding, words):
  """Element values of magnitude bits ``a`` / 2^scale_exp, saturated, as f32 bits."""
  mag = rounding_lib.round_magnitude(a, fmt.man_bits, fmt.emin, rounding, words,
                                     scale_exp=scale_exp)
  max_bits = _U(np.float32(fmt.max).view(np.uint32))
  return jnp.where(mag > max_bits, max_bits, mag) | (sign << 31)


def block_statistic(x: jax.Array, stat, *, block_shape: int | Sequence[int] | None = None,
                    axis: int | Sequence[int] | None = None, pad: bool = False
                    ) -> jax.Array:
  """A per-block statistic of float32 ``x``, broadcast back to ``x``'s shape.

  Blocks are laid out as in :func:`numerics.mx.quantize_mx` (default 1x32 along the
  last axis).
  ``stat(values, valid, axes)`` gets the blocked float32 values, a same-shape bool mask
  that is False on padding, and the in-block axes; it must reduce over ``axes`` with
  ``keepdims=True``.
  """
  x = check_block_input(x, "block_statistic")
  axes, blocks = resolve_layout(x.ndim, block_shape, axis)
  xp = pad_blocks(x, axes, blocks, pad)
  valid = pad_blocks(jnp.ones(x.shape, bool), axes, blocks, pad)
  bshape, bpos = blocked_shape(xp.shape, axes, blocks)
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
  :func:`numerics.mx.quantize_mx`; padding (``pad=True``) is zeros, which never raise
  the amax.
  ``lax.bitcast_convert_type(bits, jnp.float32)`` is the amax as a float.
  """
  x = check_block_input(x, "block_amax_bits")
  axes, blocks = resolve_layout(x.ndim, block_shape, axis)
  a = lax.bitcast_convert_type(pad_blocks(x, axes, blocks, pad), jnp.uint32)
  a = a & _U(0x7FFFFFFF)
  if finite_only:
    a = jnp.where(a >= _U(0x7F800000), _U(0), a)
  amax, bshape, _ = max_bits_per_block(a, axes, blocks)
  out = jnp.broadcast_to(amax, bshape).reshape(a.shape)
  return out[tuple(slice(0, d) for d in x.shape)]


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
