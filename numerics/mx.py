"""OCP MX block quantization: E8M0 block scales over FP8, FP6, FP4 and INT8 elements.

:func:`quantize_mx` gives a :class:`numerics.block_layout.QuantizedArray` (element and
scale codes), :func:`quantize_dequantize_mx` the fake-quantized float32 tensor in one
pass. Blocks are 1x32 along the last axis by default, or any ``block_shape`` and
``axis`` (:mod:`numerics.block_layout`); the scale is the E8M0 exponent of the
block's amax under a scale rule (:mod:`numerics.mx_scales`: ``floor``, OCP's, by
default). Elements are ``x / 2^e`` rounded once (RNE by default, or stochastic, or
toward zero) with saturation to ``+-max``.

Special blocks (tested; ``convention="qwix"`` differs, see :mod:`numerics.mx_scales`:
zero and tiny blocks get scale code 127, NaN/Inf blocks are as below):

* all-zero block: scale code 0 (2^-127), zero elements (as microxcaling and torchao,
  which take log2 of amax plus the smallest normal);
* a block holding NaN or +-Inf: scale code 0xFF (NaN) and zero element codes, so the
  whole block dequantizes to NaN (OCP: a NaN scale makes every element NaN);
* a block of float32 subnormals only: ``floor(log2 amax)`` is taken from the bits, so
  the scale clamps at 2^-127 and the elements keep what precision the format has.

The public functions run :mod:`numerics.mx_fast` (the elements in float arithmetic);
the integer cores here (:func:`mx_quantize_core`, :func:`mx_quantize_dequantize_core`)
are what the Pallas kernels run, and the tests hold all of them to the NumPy
reference. Gradients (:mod:`numerics.gradients`): :func:`quantize_dequantize_mx` is
straight-through; :func:`quantize_mx` returns integer codes and raises when
differentiated.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.numerics import block_layout
from lowprec.numerics import encoding
from lowprec.numerics import float_bits
from lowprec.numerics import formats as formats_lib
from lowprec.numerics import gradients as gradients_lib
from lowprec.numerics import mx_fast
from lowprec.numerics import mx_scales
from lowprec.numerics import rounding as rounding_lib
from lowprec.numerics.block_layout import QuantizedArray
from lowprec.numerics.mx_scales import (MX_CONVENTIONS, MX_ELEMENT_FORMATS,
                                        QWIX_MX_FORMATS, QWIX_RULE, SCALE_RULES,
                                        ScaleRule)

_U = np.uint32
_POISON = np.int32(1 << 20)  # beyond every block's grid exponent


def _mx_elements(xp, f, axes, blocks, scale_rule, rounding, words):
  """(element f32 bits with sign, scale codes (blocked shape), s_int, poisoned)."""
  b = lax.bitcast_convert_type(xp, jnp.uint32)
  sign = b >> 31
  a = b & _U(0x7FFFFFFF)
  amax, bshape, bpos = block_layout.max_bits_per_block(a, axes, blocks)
  poisoned = amax >= _U(0x7F800000)
  code = mx_scales.mx_scale_exponent(jnp.where(poisoned, _U(0), amax), f, scale_rule)
  # Internal grid exponent: the element grid of ``f`` times 2^s_int.
  s_int = code - 127 - (f.emax - f.mx_emax)
  # One int32 broadcast carries both the exponent and the poison flag: Mosaic TPU
  # cannot move a boolean mask between layouts (no i1 transpose).
  s_full = jnp.broadcast_to(jnp.where(poisoned, _POISON, s_int), bshape).reshape(xp.shape)
  poison_full = s_full == _POISON
  a_fin = jnp.where(poison_full, _U(0), a)
  elem = block_layout.round_elements(a_fin, sign, f, s_full, rounding, words)
  scale_codes = jnp.where(poisoned, 255, code).astype(jnp.uint8)
  return elem, jnp.squeeze(scale_codes, axis=bpos), s_full, poison_full


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
  asks for before E8M0's range clamps it
  (:func:`numerics.mx_scales.mx_scale_code_unclamped`).
  """
  f = formats_lib.get(fmt)
  x = block_layout.check_block_input(x, "mx_grid_exponents")
  axes, blocks = block_layout.resolve_layout(x.ndim, block_shape, axis)
  xp = block_layout.pad_blocks(x, axes, blocks, pad)
  a = lax.bitcast_convert_type(xp, jnp.uint32) & _U(0x7FFFFFFF)
  amax, bshape, _ = block_layout.max_bits_per_block(a, axes, blocks)
  amax = jnp.where(amax >= _U(0x7F800000), _U(0), amax)
  code_fn = (mx_scales.mx_scale_code_unclamped if unclamped
             else mx_scales.mx_scale_exponent)
  s_int = code_fn(amax, f, scale_rule) - 127 - (f.emax - f.mx_emax)
  out = jnp.broadcast_to(s_int, bshape).reshape(xp.shape)
  return out[tuple(slice(0, d) for d in x.shape)]


def mx_quantize_core(xp: jax.Array, f: formats_lib.Format, axes: tuple[int, ...],
                     blocks: tuple[int, ...], scale_rule: str,
                     rounding: rounding_lib.Rounding, words: jax.Array | None
                     ) -> tuple[jax.Array, jax.Array]:
  """(element codes, E8M0 scale codes) of float32 ``xp`` (block-divisible shape).

  The whole MX algorithm in plain jnp integer ops; :func:`quantize_mx` and the Pallas
  kernel in :mod:`numerics.kernels.mx_quantizers` both run exactly this code (their
  tests hold both against the independent NumPy reference, not only each other).
  """
  elem, scale_codes, _, poison = _mx_elements(xp, f, axes, blocks, scale_rule,
                                              rounding, words)
  codes = encoding.encode(lax.bitcast_convert_type(elem, jnp.float32), f)
  return jnp.where(poison, jnp.uint8(0), codes), scale_codes


def mx_quantize_dequantize_core(xp: jax.Array, f: formats_lib.Format,
                                axes: tuple[int, ...], blocks: tuple[int, ...],
                                scale_rule: str, rounding: rounding_lib.Rounding,
                                words: jax.Array | None) -> jax.Array:
  """float32 ``dequantize(quantize_mx(xp))`` of a block-divisible float32 ``xp``.

  Integer ops only (the elements are scaled back by exponent arithmetic); run by
  :func:`quantize_dequantize_mx` and by the fused Pallas kernel in
  :mod:`numerics.kernels.mx_quantizers`.
  """
  elem, _, s_full, poison = _mx_elements(xp, f, axes, blocks, scale_rule, rounding,
                                         words)
  mag = float_bits.ldexp_bits(elem & _U(0x7FFFFFFF), s_full)
  sign = elem & _U(0x80000000)
  if not f.kind == "float":  # INT8 has no negative zero
    sign = jnp.where(mag == 0, _U(0), sign)
  out = lax.bitcast_convert_type(mag | sign, jnp.float32)
  return jnp.where(poison, np.float32(np.nan), out)


def mx_scale_clamped(x: jax.Array, fmt: str | formats_lib.Format = "e4m3", *,
                     block_shape: int | Sequence[int] | None = None,
                     axis: int | Sequence[int] | None = None,
                     scale_rule: ScaleRule = "floor", pad: bool = False) -> jax.Array:
  """bool per block (the scales' shape): the scale rule asked for an E8M0 exponent
  outside [-127, 127], so the block's scale was clamped (NaN/Inf and zero blocks:
  False). For numerics telemetry; blocks as in :func:`quantize_mx`."""
  f = formats_lib.get(fmt)
  x = block_layout.check_block_input(x, "mx_scale_clamped")
  axes, blocks = block_layout.resolve_layout(x.ndim, block_shape, axis)
  xp = block_layout.pad_blocks(x, axes, blocks, pad)
  a = lax.bitcast_convert_type(xp, jnp.uint32) & _U(0x7FFFFFFF)
  amax, _, bpos = block_layout.max_bits_per_block(a, axes, blocks)
  amax = jnp.where(amax >= _U(0x7F800000), _U(0), amax)
  code = mx_scales.mx_scale_code_unclamped(amax, f, scale_rule)
  return jnp.squeeze((code < 0) | (code > 254), axis=bpos)


def _mx_args(x, fmt, block_shape, axis, scale_rule, rounding, key, fn, convention="ocp"):
  """Validated (format name, float32 x, axes, blocks, scale rule) for the MX entry
  points; the scale rule is ``qwix``'s under ``convention="qwix"``."""
  f = formats_lib.get(fmt)
  if f.name not in MX_ELEMENT_FORMATS:
    raise ValueError(f"MX element format must be one of {MX_ELEMENT_FORMATS}, got "
                     f"{f.name!r}")
  if convention not in MX_CONVENTIONS:
    raise ValueError(f"MX convention must be one of {MX_CONVENTIONS}, got {convention!r}")
  if convention == "qwix":
    if f.name not in QWIX_MX_FORMATS:
      raise ValueError(f"convention='qwix' has mxfp8 (e4m3) and mxfp4 (e2m1) only, got "
                       f"{f.name!r}")
    if scale_rule is not None:
      raise ValueError(f"convention='qwix' has its own scale rule; leave scale_rule "
                       f"unset, got {scale_rule!r}")
    scale_rule = QWIX_RULE
  elif scale_rule is None:
    scale_rule = "floor"
  elif scale_rule not in SCALE_RULES:
    raise ValueError(f"unknown scale_rule {scale_rule!r}; known: "
                     f"{', '.join(SCALE_RULES)}")
  rounding_lib.check_rounding_and_key(rounding, key, fn)
  x = block_layout.check_block_input(x, fn)
  axes, blocks = block_layout.resolve_layout(x.ndim, block_shape, axis)
  return f.name, x, axes, blocks, scale_rule


_MX_STATIC = ("fmt", "axes", "blocks", "scale_rule", "rounding", "pad")


@functools.partial(jax.jit, static_argnames=_MX_STATIC)
def _qdq_mx(x, key, *, fmt, axes, blocks, scale_rule, rounding, pad):
  f = formats_lib.get(fmt)

  def run(x, key):
    xp = block_layout.pad_blocks(x.astype(jnp.float32), axes, blocks, pad)
    words = rounding.lazy_words(key, xp)
    out = mx_fast.quantize(xp, f, axes, blocks, scale_rule, rounding, words,
                           dequantize=True)
    return out[tuple(slice(0, d) for d in x.shape)]

  return gradients_lib.straight_through(run, x, key)


def quantize_dequantize_mx(x: jax.Array, fmt: str | formats_lib.Format = "e4m3", *,
                           block_shape: int | Sequence[int] | None = None,
                           axis: int | Sequence[int] | None = None,
                           scale_rule: ScaleRule | None = None,
                           rounding: rounding_lib.Rounding = rounding_lib.Nearest(),
                           key: jax.Array | None = None, pad: bool = False,
                           convention: str = "ocp"
                           ) -> jax.Array:
  """``dequantize(quantize_mx(x, ...))`` without forming codes (fake quantization).

  The fused path for training: the rounded elements are scaled back by integer
  exponent arithmetic, skipping the uint8 encode/decode. Equal bit for bit to the
  two-step form (tested). Arguments as :func:`quantize_mx`; returns float32.
  Gradient: straight-through (the cotangent, in x's dtype).
  """
  fmt, x32, axes, blocks, scale_rule = _mx_args(
      x, fmt, block_shape, axis, scale_rule, rounding, key, "quantize_dequantize_mx",
      convention)
  out = _qdq_mx(jnp.asarray(x), key, fmt=fmt, axes=axes, blocks=blocks,
                scale_rule=scale_rule, rounding=rounding, pad=pad)
  del x32
  return out


@functools.partial(jax.jit, static_argnames=_MX_STATIC)
def _quantize_mx(x, key, *, fmt, axes, blocks, scale_rule, rounding, pad):
  f = formats_lib.get(fmt)

  def run(x, key):
    x = x.astype(jnp.float32)
    xp = block_layout.pad_blocks(x, axes, blocks, pad)
    words = rounding.lazy_words(key, xp)
    return mx_fast.quantize(xp, f, axes, blocks, scale_rule, rounding, words,
                            dequantize=False)

  return gradients_lib.not_differentiable(
      run, "quantize_mx", "quantize_dequantize_mx or fake_quant")(x, key)


def quantize_mx(x: jax.Array, fmt: str | formats_lib.Format = "e4m3", *,
                block_shape: int | Sequence[int] | None = None,
                axis: int | Sequence[int] | None = None,
                scale_rule: ScaleRule | None = None,
                rounding: rounding_lib.Rounding = rounding_lib.Nearest(),
                key: jax.Array | None = None, pad: bool = False,
                convention: str = "ocp") -> QuantizedArray:
  """OCP MX block quantization with E8M0 scales.

  Args:
    x: float32/bfloat16/float16 array.
    fmt: element format: e4m3, e5m2 (MXFP8), e2m3, e3m2 (MXFP6), e2m1 (MXFP4), int8.
    block_shape: an int for 1D blocks along ``axis`` (default 32, OCP MX), or tile
      extents such as ``(32, 32)`` over the axes in ``axis``.
    axis: the blocked axis (default -1) for 1D blocks; a tuple of axes for tiles
      (default: the last ``len(block_shape)``).
    scale_rule: floor (OCP; the default), ceil, rceil, even, alto
      (:mod:`numerics.mx_scales`). Leave unset with ``convention="qwix"``.
    rounding: element rounding (:mod:`numerics.rounding`), ``Nearest()`` (RNE),
      ``Stochastic(bits=..., rng=...)`` (needs ``key``; the scale stays
      deterministic) or ``TowardZero()``.
    key: stochastic rounding's key, as in :func:`numerics.cast` (only with
      ``Stochastic``); words are indexed by the row-major position in the padded
      array.
    pad: zero-pad blocked axes to a multiple of the block instead of raising.
    convention: ``"ocp"`` (default: OCP MX with ``scale_rule``) or ``"qwix"``: qwix
      0.1.8's mxfp8 (``fmt="e4m3"``) or mxfp4 (``"e2m1"``) scale, bit for bit with
      ``qwix.quantize`` on float32 input (docs/api.md, "Conventions"; the QuantizedArray
      records ``scale_rule="qwix"``). qwix rounds to nearest only; other roundings
      apply to its scale as to OCP's.

  Returns:
    A :class:`numerics.block_layout.QuantizedArray`; ``dequantize`` gives
    ``element * 2^(code - 127)``.
    Not differentiable (integer codes): use :func:`quantize_dequantize_mx` or
    :func:`numerics.fake_quant` for a straight-through gradient.
  """
  fmt, x32, axes, blocks, scale_rule = _mx_args(
      x, fmt, block_shape, axis, scale_rule, rounding, key, "quantize_mx", convention)
  codes, scale_codes = _quantize_mx(jnp.asarray(x), key, fmt=fmt, axes=axes,
                                    blocks=blocks, scale_rule=scale_rule,
                                    rounding=rounding, pad=pad)
  return QuantizedArray(codes=codes, scales=scale_codes,
                        tensor_scale=jnp.float32(1.0), fmt=fmt, scale_fmt="e8m0",
                        axes=axes, block_shape=blocks, shape=tuple(x32.shape),
                        scale_rule=scale_rule)
