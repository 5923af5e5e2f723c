"""Tensor quantizers as data (QuantSpec) and fake quantization with a straight-through gradient.

A :class:`QuantSpec` names one tensor quantizer as data: an element format with a
block layout (OCP MX when ``fmt`` is an MX element format and a block is given,
``nvfp4`` for NVFP4, or a plain element-wise cast when ``block_size`` and
``block_shape`` are both ``None``), the scale rule and the rounding. Recipes
(:mod:`numerics.recipes`) are built from these.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp

from numerics import blockscale
from numerics import formats as formats_lib
from numerics import random_bits as random_bits_lib
from numerics import rounding as rounding_lib


@dataclasses.dataclass(frozen=True)
class QuantSpec:
  """One tensor quantizer (hashable, so it can be a static jit argument).

  Attributes:
    fmt: element format name, or ``nvfp4``.
    block_size: 1D block length along ``axis``; ``None`` with ``block_shape=None``
      means an element-wise cast without scaling.
    axis: blocked axis (or axes, with ``block_shape``).
    block_shape: tile extents for 2D blocks, e.g. ``(32, 32)``.
    scale_rule: MX scale rule (ignored for nvfp4 and casts).
    rounding: ``nearest``, ``stochastic`` or ``toward_zero``.
    rand_bits: random bits per element for stochastic rounding (None: all).
    pad: zero-pad blocked axes instead of raising.
    rng: random-word generator for stochastic rounding.
    saturate: for element-wise casts, clamp overflow to +-max (blocks always do).
    tensorwise: with an element-wise cast, scale the whole tensor first by
      ``fmt.max / amax`` (float32 "current scaling", as FP8 training recipes do), then
      cast, then divide the scale back out.
  """

  fmt: str = "e4m3"
  block_size: int | None = 32
  axis: int | tuple[int, ...] = -1
  block_shape: tuple[int, ...] | None = None
  scale_rule: str = "floor"
  rounding: str = "nearest"
  rand_bits: int | None = None
  pad: bool = False
  rng: str = "hash"
  saturate: bool = True
  tensorwise: bool = False

  def __post_init__(self):
    if self.fmt != "nvfp4":
      formats_lib.get(self.fmt)  # raises on unknown names
    if self.rounding not in rounding_lib.ROUNDINGS:
      raise ValueError(f"unknown rounding {self.rounding!r}; known: "
                       f"{', '.join(rounding_lib.ROUNDINGS)}")
    if self.scale_rule not in blockscale.SCALE_RULES:
      raise ValueError(f"unknown scale_rule {self.scale_rule!r}; known: "
                       f"{', '.join(blockscale.SCALE_RULES)}")
    if self.rng not in random_bits_lib.METHODS:
      raise ValueError(f"unknown rng {self.rng!r}; known: "
                       f"{', '.join(random_bits_lib.METHODS)}")
    if self.block_shape is not None:
      object.__setattr__(self, "block_shape", tuple(self.block_shape))
    if isinstance(self.axis, list):
      object.__setattr__(self, "axis", tuple(self.axis))
    if self.tensorwise and not self.is_cast:
      raise ValueError("tensorwise scaling applies to element-wise casts "
                       "(block_size=None, block_shape=None)")

  @property
  def is_cast(self) -> bool:
    return self.fmt != "nvfp4" and self.block_size is None and self.block_shape is None

  @property
  def needs_key(self) -> bool:
    return self.rounding == "stochastic"


def quantize(x: jax.Array, spec: QuantSpec, key: jax.Array | None = None
             ) -> blockscale.QuantizedArray:
  """Block-quantizes ``x`` per ``spec`` (MX or NVFP4; not for element-wise casts)."""
  if spec.is_cast:
    raise ValueError(f"spec {spec} is an element-wise cast, not a block quantizer")
  if spec.fmt == "nvfp4":
    return blockscale.quantize_nvfp4(
        x, axis=spec.axis, block_shape=spec.block_shape, rounding=spec.rounding,
        key=key, rand_bits=spec.rand_bits, pad=spec.pad, rng=spec.rng)
  return blockscale.quantize_mx(
      x, spec.fmt, block_size=spec.block_size, axis=spec.axis,
      block_shape=spec.block_shape, scale_rule=spec.scale_rule,
      rounding=spec.rounding, key=key, rand_bits=spec.rand_bits, pad=spec.pad,
      rng=spec.rng)


def quantize_dequantize(x: jax.Array, spec: QuantSpec,
                        key: jax.Array | None = None) -> jax.Array:
  """``dequantize(quantize(x))`` (or ``cast``) in float32, x's shape; no STE."""
  if spec.is_cast:
    x32 = jnp.asarray(x).astype(jnp.float32)
    scale = tensor_scale(x32, spec.fmt) if spec.tensorwise else None
    y = rounding_lib.cast(
        x32 if scale is None else x32 * scale, spec.fmt, rounding=spec.rounding,
        key=key, saturate=spec.saturate, rand_bits=spec.rand_bits, rng=spec.rng)
    return y if scale is None else y / scale
  if spec.fmt == "nvfp4":
    return blockscale.dequantize(quantize(x, spec, key))
  return blockscale.quantize_dequantize_mx(
      x, spec.fmt, block_size=spec.block_size, axis=spec.axis,
      block_shape=spec.block_shape, scale_rule=spec.scale_rule,
      rounding=spec.rounding, key=key, rand_bits=spec.rand_bits, pad=spec.pad,
      rng=spec.rng)


def tensor_scale(x: jax.Array, fmt: str) -> jax.Array:
  """float32 per-tensor scale ``fmt.max / amax(x)`` over finite values (1 if amax=0)."""
  a = jnp.abs(x.astype(jnp.float32))
  amax = jnp.max(jnp.where(jnp.isfinite(a), a, 0.0))
  scale = jnp.float32(formats_lib.get(fmt).max) / amax
  return jnp.where((amax > 0) & jnp.isfinite(scale), scale, jnp.float32(1.0))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _ste(x, key, spec):
  return quantize_dequantize(x, spec, key).astype(x.dtype)


def _ste_fwd(x, key, spec):
  return _ste(x, key, spec), None


def _ste_bwd(spec, _, g):
  del spec
  return g, None


_ste.defvjp(_ste_fwd, _ste_bwd)


def fake_quant_spec(x: jax.Array, spec: QuantSpec,
                    key: jax.Array | None = None) -> jax.Array:
  """Straight-through fake quantization of ``x`` per ``spec``; returns x's dtype.

  Forward: ``dequantize(quantize(x))`` cast back to x's dtype. Backward: the identity
  (the gradient passes through unchanged, also outside the representable range).
  """
  x = jnp.asarray(x)
  if spec.needs_key and key is None:
    raise ValueError("rounding='stochastic' needs a PRNG key")
  return _ste(x, key, spec)


def fake_quant(x: jax.Array, fmt: str = "e4m3", *, block_size: int | None = 32,
               axis: int | Sequence[int] = -1,
               block_shape: Sequence[int] | None = None, scale_rule: str = "floor",
               rounding: str = "nearest", key: jax.Array | None = None,
               rand_bits: int | None = None, pad: bool = False, rng: str = "hash",
               saturate: bool = True) -> jax.Array:
  """``dequantize(quantize(x, ...))`` with a straight-through gradient.

  ``fmt`` is an MX element format (block-scaled with ``block_size``/``block_shape``),
  ``"nvfp4"`` (16-element E4M3-scaled blocks; ``block_size`` is ignored), or any
  format with ``block_size=None`` for an element-wise :func:`numerics.cast`. The
  other arguments are those of :func:`numerics.quantize_mx`. Returns x's dtype.
  """
  if fmt == "nvfp4":
    block_size = blockscale.NVFP4_BLOCK
  spec = QuantSpec(fmt=fmt, block_size=block_size,
                   axis=tuple(axis) if isinstance(axis, (list, tuple)) else axis,
                   block_shape=None if block_shape is None else tuple(block_shape),
                   scale_rule=scale_rule, rounding=rounding, rand_bits=rand_bits,
                   pad=pad, rng=rng, saturate=saturate)
  return fake_quant_spec(x, spec, key)
