"""NF4 tensors (QLoRA): 4-bit NormalFloat codes, blockwise absmax, double quantization.

Layout (bitsandbytes' ``quantize_4bit(quant_type="nf4")`` with QLoRA's defaults):

* Blocks of ``block_size`` (64) consecutive elements along ``axis``. For a kernel
  ``[in, out]`` pass ``axis=0``: blocks then run along the contraction axis, as
  bitsandbytes' row blocks of a ``[out, in]`` weight do.
* Per block, ``absmax = max |x|`` in float32; each element is coded as the nearest
  NF4 level to ``x * fl32(1 / absmax)`` (thresholds at the float32 midpoints, ties
  to the lower code; see :mod:`numerics.codebooks` for these rules and the handling
  of non-finite and subnormal blocks). Two codes per byte, the first element of a pair
  in the high nibble.
* Double quantization (``double_quant=True``): the block absmaxes, flattened in
  row-major block order, have their mean ``offset`` subtracted and are quantized
  with the 8-bit signed dynamic map (:func:`numerics.codebooks.dynamic_map`) in
  blocks of ``scale_block_size`` (256), keeping one float32 absmax per 256 scales
  and the float32 offset. Decoded absmax = ``(dynamic8[code] + offset /
  scale_absmax) * scale_absmax`` in float32: bitsandbytes' ``dynamic8[code] *
  scale_absmax + offset`` up to float32 rounding, written without a multiply feeding
  an add (XLA contracts those into FMAs inside fusions, which would make the value
  depend on fusion decisions); ``offset`` alone where ``scale_absmax`` is 0. The
  offset is the mean computed by pairwise halving (zero-padded to a
  power of two, then ``v[:h] + v[h:]`` until one value is left, times the float32
  reciprocal of the count)
  so that it is bit-reproducible across backends and in NumPy.
* Dequantize: ``nf4[code] * absmax`` (one float32 multiply).

Storage per element: 4 bits + 32/64 bits of scale = 4.5 bits without double
quantization; 4 + 8/64 + 32/(64*256) = 4.127 bits with it (plus 4 bytes of offset
per tensor), QLoRA's figures. :func:`numerics.memory.tree_bytes` measures it.

The zero-padding of a blocked axis that ``block_size`` does not divide (``pad=True``)
leaves every block's absmax unchanged; the padded codes are stored.

Gradients: quantization is not differentiable (integer codes);
:func:`dequantize_nf4` is differentiable only with respect to the float scales.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from lowprec.numerics import codebooks
from lowprec.numerics import encoding

LEVELS = codebooks.NF4_LEVELS
BLOCK = 64
SCALE_BLOCK = 256


@dataclasses.dataclass(frozen=True)
class NF4Array:
  """An NF4-quantized tensor (a pytree; layout fields are static metadata).

  Attributes:
    codes: uint8 ``[*lead, padded_len // 2]``: the blocked axis moved last, two 4-bit
      codes per byte.
    scales: per-block absmax, ``[*lead, n_blocks]``: float32, or uint8 dynamic-map
      codes with double quantization.
    scale_absmax: float32 ``[ceil(n_scales / scale_block_size)]`` (double
      quantization) or None.
    scale_offset: float32 scalar (double quantization) or None.
    shape: the original shape.
    axis: the blocked axis of ``shape`` (non-negative).
    block_size: elements per block.
    scale_block_size: scales per block of the double quantization (0: none).
  """

  codes: jax.Array
  scales: jax.Array
  scale_absmax: jax.Array | None
  scale_offset: jax.Array | None
  shape: tuple[int, ...]
  axis: int
  block_size: int
  scale_block_size: int

  @property
  def double_quant(self) -> bool:
    return self.scale_block_size > 0


jax.tree_util.register_dataclass(
    NF4Array, data_fields=["codes", "scales", "scale_absmax", "scale_offset"],
    meta_fields=["shape", "axis", "block_size", "scale_block_size"])


@jax.jit
def pairwise_mean(v: jax.Array) -> jax.Array:
  """float32 mean of 1-D ``v`` by pairwise halving (bit-reproducible; see docstring)."""
  v = jnp.asarray(v, jnp.float32)
  n = v.shape[0]
  if n == 0:
    raise ValueError("pairwise_mean of an empty array")
  size = 1 << (n - 1).bit_length()
  v = jnp.pad(v, (0, size - n))
  while v.shape[0] > 1:
    h = v.shape[0] // 2
    v = v[:h] + v[h:]
  # Times the float32 reciprocal, written out: XLA rewrites a division by a constant
  # into this multiply anyway, so spelling it keeps eager, jit and NumPy equal.
  return v[0] * (np.float32(1) / np.float32(n))


def _check_int(name: str, v, minimum: int) -> int:
  if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
    raise ValueError(f"{name} must be an int >= {minimum}, got {v!r}")
  return int(v)


@functools.partial(jax.jit, static_argnames=("block_size", "axis", "double_quant",
                                             "scale_block_size", "pad"))
def quantize_nf4(x: jax.Array, *, block_size: int = BLOCK, axis: int = -1,
                 double_quant: bool = True, scale_block_size: int = SCALE_BLOCK,
                 pad: bool = False) -> NF4Array:
  """NF4 quantization with blockwise absmax and optional double quantization.

  Args:
    x: float32, bfloat16 or float16 array with at least one axis.
    block_size: elements per block along ``axis`` (even; QLoRA: 64).
    axis: the blocked axis.
    double_quant: quantize the block absmaxes to 8 bits (QLoRA's double quantization).
    scale_block_size: scales per double-quantization block (QLoRA: 256).
    pad: zero-pad ``axis`` to a multiple of ``block_size`` instead of raising.

  Returns:
    An :class:`NF4Array`; :func:`dequantize_nf4` gives the float32 approximation.
  """
  x = jnp.asarray(x)
  if x.dtype not in (jnp.float32, jnp.bfloat16, jnp.float16):
    raise TypeError(f"quantize_nf4 expects float32, bfloat16 or float16, got {x.dtype}")
  if x.ndim == 0:
    raise ValueError("quantize_nf4 needs an array with at least one axis")
  block_size = _check_int("block_size", block_size, 2)
  if block_size % 2:
    raise ValueError(f"block_size must be even (two codes per byte), got {block_size}")
  scale_block_size = _check_int("scale_block_size", scale_block_size, 1)
  if not isinstance(axis, (int, np.integer)) or not -x.ndim <= axis < x.ndim:
    raise ValueError(f"axis {axis!r} out of range for a {x.ndim}-d array")
  axis = int(axis) % x.ndim
  xt = jnp.moveaxis(x.astype(jnp.float32), axis, -1)
  length = xt.shape[-1]
  if length % block_size:
    if not pad:
      raise ValueError(f"axis {axis} of shape {x.shape} has length {length}, not "
                       f"divisible by block_size={block_size}; pass pad=True")
    xt = jnp.pad(xt, [(0, 0)] * (xt.ndim - 1) + [(0, block_size - length % block_size)])
  lead = xt.shape[:-1]
  n_blocks = xt.shape[-1] // block_size
  codes, absmax = codebooks.quantize_blocks(xt.reshape(-1, block_size), "nf4")
  codes = encoding.pack_nibbles(codes.reshape(*lead, n_blocks * block_size))
  absmax = absmax.reshape(*lead, n_blocks)
  if not double_quant:
    return NF4Array(codes, absmax, None, None, tuple(x.shape), axis, block_size, 0)
  flat = absmax.reshape(-1)
  offset = pairwise_mean(flat)
  centred = flat - offset
  n = centred.shape[0]
  n_sb = -(-n // scale_block_size)
  centred = jnp.pad(centred, (0, n_sb * scale_block_size - n))
  q2, absmax2 = codebooks.quantize_blocks(centred.reshape(n_sb, scale_block_size),
                                          "dynamic8")
  q2 = q2.reshape(-1)[:n].reshape(absmax.shape)
  return NF4Array(codes, q2, absmax2, offset, tuple(x.shape), axis, block_size,
                  scale_block_size)


@jax.jit
def block_scales(q: NF4Array) -> jax.Array:
  """float32 per-block absmax ``[*lead, n_blocks]`` (decoded when double-quantized)."""
  if not q.double_quant:
    return q.scales
  flat = q.scales.reshape(-1)
  n = flat.shape[0]
  sb = q.scale_block_size
  n_sb = q.scale_absmax.shape[0]
  codes = jnp.pad(flat, (0, n_sb * sb - n)).reshape(n_sb, sb)
  level = codebooks.decode(codes, "dynamic8")
  a2 = q.scale_absmax[:, None]
  # (level + offset / a2) * a2: no multiply feeds an add, so XLA cannot contract the
  # decode into an FMA (it does inside fusions on CPU and GPU) and every backend and
  # the NumPy reference round the same three times.
  ratio = q.scale_offset / jnp.where(a2 > 0, a2, 1.0)
  absmax = jnp.where((a2 > 0) & jnp.isfinite(ratio), (level + ratio) * a2,
                     jnp.where(jnp.isnan(a2), a2, q.scale_offset))
  return absmax.reshape(-1)[:n].reshape(q.scales.shape)


@jax.jit
def dequantize_nf4(q: NF4Array) -> jax.Array:
  """float32 array of ``q.shape``: ``nf4[code] * absmax`` per element."""
  if not isinstance(q, NF4Array):
    raise TypeError(f"dequantize_nf4 expects an NF4Array, got {type(q).__name__}")
  absmax = block_scales(q)
  lead = q.codes.shape[:-1]
  codes = encoding.unpack_nibbles(q.codes)
  values = codebooks.dequantize_blocks(codes.reshape(-1, q.block_size),
                                       absmax.reshape(-1), "nf4")
  values = values.reshape(*lead, -1)[..., :q.shape[q.axis]]
  return jnp.moveaxis(values, -1, q.axis)
