"""Tensor quantizers as data (QuantSpec) and fake quantization with a straight-through gradient.

A :class:`QuantSpec` names one tensor quantizer as data: an element format and a
scaling (``block``: OCP MX when ``fmt`` is an MX element format, NVFP4 for ``nvfp4``;
``tensor``: one float32 scale ``max / amax`` per tensor, then an element-wise cast;
``none``: a plain element-wise cast), the block geometry, the scale rule and the
rounding. Recipes (:mod:`numerics.recipes`) are built from these. Arguments that the
chosen quantizer would ignore raise at construction.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Sequence

import jax
import jax.numpy as jnp

from lowprec.numerics import blockscale
from lowprec.numerics import formats as formats_lib
from lowprec.numerics import gradients
from lowprec.numerics import mx_scales
from lowprec.numerics import rounding as rounding_lib

Scaling = Literal["block", "tensor", "none"]
SCALINGS = ("block", "tensor", "none")
_BLOCK_FORMATS = blockscale.MX_ELEMENT_FORMATS + ("nvfp4",)


@dataclasses.dataclass(frozen=True)
class QuantSpec:
  """One tensor quantizer (hashable, so it can be a static jit argument).

  Fields are stored in canonical form (``block_shape`` a tuple, ``axis`` an int for 1D
  blocks or a tuple for tiles), so equal quantizers compare equal.

  Attributes:
    fmt: element format name, or ``nvfp4``.
    block_shape: block geometry for ``block`` scaling, as in
      :func:`numerics.quantize_mx` (default: 32 for MX, 16 for NVFP4).
    axis: blocked axis (or axes, for tiles).
    scaling: ``block``, ``tensor`` or ``none`` (default: ``block`` for MX element
      formats and ``nvfp4``, ``none`` for the rest, e.g. ``bf16``).
    scale_rule: MX scale rule (MX only): one of ``blockscale.SCALE_RULES``, or
      ``"qwix"`` (qwix 0.1.8's scale, e4m3 and e2m1: ``convention="qwix"`` of
      :func:`numerics.mx.quantize_mx`).
    rounding: a :data:`numerics.rounding.Rounding` (``Nearest()``, ``TowardZero()``
      or ``Stochastic(bits=..., rng=...)``).
    pad: zero-pad blocked axes instead of raising (``block`` only).
    saturate: for ``none``/``tensor`` casts, clamp overflow to +-max (block formats
      always saturate).
    convention: NVFP4 scale convention, ``te``, ``torchao`` or ``qwix`` (``nvfp4`` only).
    amax_axis_name: inside ``jax.shard_map``, the mesh axis (or tuple of axes) over
      which the tensor amax is reduced (``lax.pmax``), so every shard takes the whole
      tensor's scale (Transformer Engine's amax reduction group). For the quantizers
      with a tensor amax only: ``nvfp4`` and ``tensor`` scaling. None: per shard.

  Raises:
    ValueError: an unknown name, a non-positive block, or an argument the quantizer
      would ignore (a block for a cast, a scale rule for NVFP4, ...).
    TypeError: ``rounding`` is not a :data:`numerics.rounding.Rounding`.
  """

  fmt: str = "e4m3"
  block_shape: int | tuple[int, ...] | None = None
  axis: int | tuple[int, ...] | None = None
  scaling: Scaling | None = None
  scale_rule: str = "floor"
  rounding: rounding_lib.Rounding = rounding_lib.Nearest()
  pad: bool = False
  saturate: bool = True
  convention: str = "te"
  amax_axis_name: str | tuple[str, ...] | None = None

  def __post_init__(self):
    if self.fmt != "nvfp4":
      formats_lib.get(self.fmt)  # raises on unknown names
    scaling = self.scaling
    if scaling is None:  # blocks when the format has them or a block is asked for
      blocked = self.fmt in _BLOCK_FORMATS or self.block_shape is not None
      scaling = "block" if blocked else "none"
    if scaling not in SCALINGS:
      raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
    if scaling == "block" and self.fmt not in _BLOCK_FORMATS:
      raise ValueError(f"{self.fmt!r} has no block scaling (block formats: "
                       f"{', '.join(_BLOCK_FORMATS)}); use scaling='none' for an "
                       f"element-wise cast")
    if scaling != "block" and self.fmt == "nvfp4":
      raise ValueError(f"nvfp4 is block-scaled by definition, got scaling={scaling!r}")
    object.__setattr__(self, "scaling", scaling)
    rounding_lib.check_rounding(self.rounding, "QuantSpec")
    if self.scale_rule not in blockscale.SCALE_RULES + (mx_scales.QWIX_RULE,):
      raise ValueError(f"unknown scale_rule {self.scale_rule!r}; known: "
                       f"{', '.join(blockscale.SCALE_RULES)}, {mx_scales.QWIX_RULE}")
    if self.scale_rule == mx_scales.QWIX_RULE and self.fmt not in mx_scales.QWIX_MX_FORMATS:
      raise ValueError(f"scale_rule={mx_scales.QWIX_RULE!r} (qwix 0.1.8's MX scale) is "
                       f"for {', '.join(mx_scales.QWIX_MX_FORMATS)}, got fmt={self.fmt!r}")
    if self.convention not in blockscale.NVFP4_CONVENTIONS:
      raise ValueError(f"convention must be one of {blockscale.NVFP4_CONVENTIONS}, got "
                       f"{self.convention!r}")
    if self.fmt != "nvfp4" and self.convention != "te":
      raise ValueError(f"convention is an NVFP4 option, got fmt={self.fmt!r}")
    object.__setattr__(self, "amax_axis_name", blockscale.check_amax_axis_name(
        self.amax_axis_name, "QuantSpec"))
    if self.amax_axis_name is not None and not (self.fmt == "nvfp4"
                                                or scaling == "tensor"):
      raise ValueError(f"amax_axis_name reduces a tensor amax, which only nvfp4 and "
                       f"scaling='tensor' take; got fmt={self.fmt!r}, scaling="
                       f"{scaling!r}")
    if scaling == "block":
      default = blockscale.NVFP4_BLOCK if self.fmt == "nvfp4" else blockscale.MX_BLOCK
      blocks, axis = blockscale.canonical_block(self.block_shape, self.axis, default)
      if self.fmt == "nvfp4":
        if any(b != blockscale.NVFP4_BLOCK for b in blocks):
          raise ValueError(f"NVFP4 blocks are {blockscale.NVFP4_BLOCK} along each blocked "
                           f"axis, got block_shape={self.block_shape!r}")
        if self.scale_rule != "floor":
          raise ValueError("NVFP4 has one scale rule (its convention); scale_rule is "
                           "for MX formats")
      if not self.saturate:
        raise ValueError("block-scaled formats always saturate; saturate=False applies "
                         "to element-wise casts")
      object.__setattr__(self, "block_shape", blocks)
      object.__setattr__(self, "axis", axis)
    else:
      if self.block_shape is not None or self.axis is not None or self.pad:
        raise ValueError(f"block_shape, axis and pad describe blocks; scaling="
                         f"{scaling!r} has none")
      if self.scale_rule != "floor":
        raise ValueError(f"scale_rule is an MX option, got scaling={scaling!r}")

  @property
  def is_cast(self) -> bool:
    """An element-wise cast (``tensor`` or ``none`` scaling), not a block quantizer."""
    return self.scaling != "block"

  @property
  def tensorwise(self) -> bool:
    return self.scaling == "tensor"



def _check_key(spec: QuantSpec, key) -> None:
  spec.rounding.check_key(key)


def quantize(x: jax.Array, spec: QuantSpec, *, key: jax.Array | None = None
             ) -> blockscale.QuantizedArray:
  """Block-quantizes ``x`` per ``spec`` (MX or NVFP4; not for element-wise casts).

  Not differentiable (integer codes); see :func:`quantize_dequantize`.
  """
  if spec.is_cast:
    raise ValueError(f"spec {spec} is an element-wise cast, not a block quantizer")
  x = rounding_lib.check_float_input(x, "quantizer.quantize")
  _check_key(spec, key)
  if spec.fmt == "nvfp4":
    return blockscale.quantize_nvfp4(
        x, block_shape=spec.block_shape, axis=spec.axis, rounding=spec.rounding,
        pad=spec.pad, convention=spec.convention, amax_axis_name=spec.amax_axis_name,
        key=key)
  return blockscale.quantize_mx(
      x, spec.fmt, block_shape=spec.block_shape, axis=spec.axis, rounding=spec.rounding,
      pad=spec.pad, key=key, **_mx_rule(spec))


def _mx_rule(spec: QuantSpec) -> dict[str, str]:
  """The MX quantizers' scale arguments of ``spec``: qwix's scale is a convention of
  its own (:func:`numerics.mx.quantize_mx`), the others a scale rule."""
  if spec.scale_rule == mx_scales.QWIX_RULE:
    return {"convention": "qwix"}
  return {"scale_rule": spec.scale_rule}


def _qdq(x: jax.Array, spec: QuantSpec, key) -> jax.Array:
  """float32 ``dequantize(quantize(x))`` (or the cast) with no gradient policy."""
  x32 = jnp.asarray(x).astype(jnp.float32)
  if spec.is_cast:
    if spec.tensorwise:
      y, scale = tensor_quantize(x32, spec, key=key)
      return y / scale
    return jax.lax.stop_gradient(rounding_lib.cast(
        x32, spec.fmt, rounding=spec.rounding, saturate=spec.saturate, key=key))
  if spec.fmt == "nvfp4":
    return jax.lax.stop_gradient(blockscale.quantize_dequantize_nvfp4(
        x32, block_shape=spec.block_shape, axis=spec.axis, rounding=spec.rounding,
        pad=spec.pad, convention=spec.convention, amax_axis_name=spec.amax_axis_name,
        key=key))
  return jax.lax.stop_gradient(blockscale.quantize_dequantize_mx(
      x32, spec.fmt, block_shape=spec.block_shape, axis=spec.axis, rounding=spec.rounding,
      pad=spec.pad, key=key, **_mx_rule(spec)))


def quantize_dequantize(x: jax.Array, spec: QuantSpec, *,
                        key: jax.Array | None = None) -> jax.Array:
  """``dequantize(quantize(x))`` (or the cast) in float32, x's shape.

  Gradient: straight-through (the cotangent, in x's dtype).

  Raises:
    TypeError: ``x`` is not float32, bfloat16 or float16 (complex, integer, bool).
  """
  x = rounding_lib.check_float_input(x, "quantizer.quantize_dequantize")
  _check_key(spec, key)
  return gradients.straight_through(lambda x, key: _qdq(x, spec, key), x, key)


def tensor_quantize(x: jax.Array, spec: QuantSpec, *, key: jax.Array | None = None
                    ) -> tuple[jax.Array, jax.Array]:
  """``(codes, scale)`` of a ``tensor``-scaled spec: float32 values of ``spec.fmt``
  (exact), ``cast(x * scale)``, and the float32 scalar :func:`tensor_scale`; the
  dequantized tensor is ``codes / scale``. No gradient (for callers that keep the codes
  apart from the scale, e.g. a native FP8 GEMM)."""
  if not spec.tensorwise:
    raise ValueError(f"tensor_quantize needs scaling='tensor', got {spec.scaling!r}")
  x32 = rounding_lib.check_float_input(x, "quantizer.tensor_quantize").astype(jnp.float32)
  scale = tensor_scale(x32, spec.fmt, amax_axis_name=spec.amax_axis_name)
  y = jax.lax.stop_gradient(rounding_lib.cast(
      x32 * scale, spec.fmt, rounding=spec.rounding, saturate=spec.saturate, key=key))
  return y, jax.lax.stop_gradient(scale)


def tensor_scale(x: jax.Array, fmt: str, *,
                 amax_axis_name: str | tuple[str, ...] | None = None) -> jax.Array:
  """float32 per-tensor scale ``fmt.max / amax(x)`` over finite values (1 if amax=0);
  the amax also over the mesh axes ``amax_axis_name`` inside ``shard_map``."""
  a = jnp.abs(x.astype(jnp.float32))
  amax = jnp.max(jnp.where(jnp.isfinite(a), a, 0.0), initial=0.0)
  if amax_axis_name is not None:  # amax >= 0: its bits order like its values
    bits = blockscale.reduce_amax_bits(jax.lax.bitcast_convert_type(amax, jnp.int32),
                                       amax_axis_name)
    amax = jax.lax.bitcast_convert_type(bits, jnp.float32)
  scale = jnp.float32(formats_lib.get(fmt).max) / amax
  return jnp.where((amax > 0) & jnp.isfinite(scale), scale, jnp.float32(1.0))


def fake_quant_spec(x: jax.Array, spec: QuantSpec, *,
                    key: jax.Array | None = None) -> jax.Array:
  """Straight-through fake quantization of ``x`` per ``spec``; returns x's dtype.

  Forward: ``dequantize(quantize(x))`` cast back to x's dtype. Backward: the identity
  (the gradient passes through unchanged, also outside the representable range).

  Raises:
    TypeError: ``x`` is not float32, bfloat16 or float16 (complex, integer, bool), as
      :func:`numerics.cast`.
  """
  x = rounding_lib.check_float_input(x, "fake_quant_spec")
  _check_key(spec, key)
  return gradients.straight_through(
      lambda x, key: _qdq(x, spec, key).astype(x.dtype), x, key)


def fake_quant(x: jax.Array, fmt: str = "e4m3", *, scaling: Scaling | None = None,
               block_shape: int | Sequence[int] | None = None,
               axis: int | Sequence[int] | None = None, scale_rule: str = "floor",
               rounding: rounding_lib.Rounding = rounding_lib.Nearest(),
               key: jax.Array | None = None, pad: bool = False, saturate: bool = True,
               convention: str = "te",
               amax_axis_name: str | tuple[str, ...] | None = None) -> jax.Array:
  """``dequantize(quantize(x, ...))`` with a straight-through gradient.

  ``fmt`` is an MX element format (block-scaled, default 1x32), ``"nvfp4"`` (1x16 or
  16x16 E4M3-scaled blocks), or any format for an element-wise cast (the default for
  non-block formats such as ``bf16``; ``scaling="none"`` for an MX element format).
  The other arguments are :class:`QuantSpec`'s. Returns x's dtype.

  Raises:
    TypeError: ``x`` is not float32, bfloat16 or float16: complex (whose imaginary part
      would be dropped), integer and bool inputs are rejected, as by
      :func:`numerics.cast`.
    ValueError: invalid quantizer arguments (see :class:`QuantSpec`).
  """
  x = rounding_lib.check_float_input(x, "fake_quant")
  spec = QuantSpec(fmt=fmt, scaling=scaling, block_shape=block_shape, axis=axis,
                   scale_rule=scale_rule, rounding=rounding, pad=pad, saturate=saturate,
                   convention=convention,
                   amax_axis_name=amax_axis_name)
  return fake_quant_spec(x, spec, key=key)
