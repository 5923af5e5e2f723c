"""Quantization recipes as data: which operand of which GEMM gets which quantizer.

A linear layer ``O = X W`` (X: tokens x K, W: K x N) runs three GEMMs:

=========  =====================  ======  ======  ===================
GEMM       product                lhs     rhs     contraction axis
=========  =====================  ======  ======  ===================
forward    ``O  = X  W``          X       W       K
dgrad      ``dX = dO W^T``        dO      W       N
wgrad      ``dW = X^T dO``        X       dO      tokens (M)
=========  =====================  ======  ======  ===================

Each operand of each GEMM has an :class:`OperandQuant` (or ``None``: not quantized,
only cast to the recipe's compute dtype). ``layout="1d"`` puts blocks along that GEMM's
contraction axis; ``layout="2d"`` uses square ``block x block`` tiles over the
operand's (contraction, free) axes, which quantize a matrix and its transpose the same
way. ``GemmRecipe.hadamard`` applies a randomized Hadamard transform of that block size
to both operands along the contraction axis first (exact in real arithmetic because
the transform is orthonormal). ``reuse_forward_weight`` feeds the forward-quantized W
to dgrad (ALTO 1d2d: no forward/backward weight mismatch, no second quantization).

Named recipes (``names()``):

* ``bf16``: no quantization; bf16 operands, fp32 accumulation (a plain dot_general).
* ``fp8``: tensorwise current scaling (scale = max / amax per tensor), E4M3 for X and
  W, E5M2 for dO (Transformer Engine's HYBRID format).
* ``mxfp8``: OCP MXFP8, E4M3 everywhere, 1x32 blocks along each GEMM's contraction
  axis (so W and dO are re-quantized for the backward GEMMs from high precision) with
  the RCEIL scale rule, as Blackwell/TE do.
* ``mxfp4_1d2d``, ``mxfp4_rht``, ``mxfp4``: ALTO's MXFP4 (E2M1, ALTO's scale rule): X
  1x32, W 32x32 tiles reused in dgrad, dO 1x32; ``_rht`` adds a 32-point RHT on both
  wgrad operands along tokens; ``mxfp4`` (= ALTO's 1d2d + RHT + SR) also rounds dO
  stochastically in dgrad and wgrad.
* ``nvfp4``: NVFP4 (E2M1, 1x16 E4M3-scaled blocks + fp32 tensor scale): W in 16x16
  tiles reused in dgrad, a 16-point RHT on wgrad, SR on dO.

``compute_dtype`` is the dtype of the GEMM operands after fake quantization: bf16 for
MX recipes (their dequantized values are exact in bf16), float32 for ``fp8`` and
``nvfp4``, whose fp32 tensor scales make dequantized values inexact in bf16 (hardware
applies those scales after the GEMM). Accumulation is always float32.

Build a custom recipe with :class:`Recipe` directly or :func:`replace`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from numerics import blockscale
from numerics import formats as formats_lib
from numerics import quantizer
from numerics import rounding as rounding_lib

Layout = Literal["1d", "2d"]


@dataclasses.dataclass(frozen=True)
class OperandQuant:
  """How one operand of one GEMM is quantized.

  Attributes:
    fmt: element format name (an MX element format, ``bf16``/``fp16`` for plain
      casts, or ``nvfp4``).
    scaling: ``block`` (MX / NVFP4 block scales) or ``tensor`` (one float32 scale
      per tensor, ``max / amax``, then an element-wise cast).
    block: block length along the contraction axis (tile side for ``2d``).
    layout: ``1d`` (blocks along the contraction axis) or ``2d`` (square tiles).
    scale_rule: MX scale rule (see :mod:`numerics.blockscale`).
    rounding: ``nearest`` or ``stochastic`` (or ``toward_zero``).
    rand_bits: random bits per element for stochastic rounding (None: all).
  """

  fmt: str
  scaling: Literal["block", "tensor"] = "block"
  block: int = 32
  layout: Layout = "1d"
  scale_rule: str = "floor"
  rounding: str = "nearest"
  rand_bits: int | None = None

  def __post_init__(self):
    if self.fmt != "nvfp4":
      formats_lib.get(self.fmt)
    if self.scaling not in ("block", "tensor"):
      raise ValueError(f"scaling must be 'block' or 'tensor', got {self.scaling!r}")
    if self.layout not in ("1d", "2d"):
      raise ValueError(f"layout must be '1d' or '2d', got {self.layout!r}")
    if self.scaling == "block" and self.fmt not in blockscale.MX_ELEMENT_FORMATS + (
        "nvfp4",):
      raise ValueError(f"block scaling needs an MX element format or nvfp4, got "
                       f"{self.fmt!r}")
    if self.fmt == "nvfp4" and self.block != blockscale.NVFP4_BLOCK:
      raise ValueError(f"nvfp4 blocks are {blockscale.NVFP4_BLOCK} long, got "
                       f"{self.block}")
    if self.rounding not in rounding_lib.ROUNDINGS:
      raise ValueError(f"unknown rounding {self.rounding!r}")
    if self.scale_rule not in blockscale.SCALE_RULES:
      raise ValueError(f"unknown scale_rule {self.scale_rule!r}")

  def spec(self, contract_axis: int, free_axis: int) -> quantizer.QuantSpec:
    """The :class:`QuantSpec` for an operand with these (negative) axes."""
    if self.scaling == "tensor":
      return quantizer.QuantSpec(fmt=self.fmt, block_size=None, rounding=self.rounding,
                                 rand_bits=self.rand_bits, tensorwise=True)
    if self.layout == "2d":
      axes = tuple(sorted((contract_axis, free_axis)))
      return quantizer.QuantSpec(fmt=self.fmt, block_size=None, axis=axes,
                                 block_shape=(self.block, self.block),
                                 scale_rule=self.scale_rule, rounding=self.rounding,
                                 rand_bits=self.rand_bits, pad=True)
    return quantizer.QuantSpec(fmt=self.fmt, block_size=self.block, axis=contract_axis,
                               scale_rule=self.scale_rule, rounding=self.rounding,
                               rand_bits=self.rand_bits, pad=True)


@dataclasses.dataclass(frozen=True)
class GemmRecipe:
  """Quantizers of one GEMM's operands (None: not quantized) and an optional RHT."""

  lhs: OperandQuant | None = None
  rhs: OperandQuant | None = None
  hadamard: int | None = None

  @property
  def needs_key(self) -> bool:
    return self.hadamard is not None or any(
        op is not None and op.rounding == "stochastic" for op in (self.lhs, self.rhs))


@dataclasses.dataclass(frozen=True)
class Recipe:
  """A quantization recipe for the three GEMMs of a linear layer (hashable)."""

  name: str
  forward: GemmRecipe = GemmRecipe()
  dgrad: GemmRecipe = GemmRecipe()
  wgrad: GemmRecipe = GemmRecipe()
  reuse_forward_weight: bool = False
  compute_dtype: str = "bfloat16"

  def __post_init__(self):
    if self.reuse_forward_weight:
      if self.forward.rhs is None:
        raise ValueError("reuse_forward_weight needs a forward weight quantizer")
      if self.dgrad.hadamard is not None:
        raise ValueError("a reused forward weight cannot take a dgrad Hadamard")
      if self.forward.rhs.layout != "2d":
        raise ValueError("reusing the forward weight in dgrad is only consistent with "
                         "2d tiles (1d blocks run along K, dgrad contracts over N)")
    if self.compute_dtype not in ("bfloat16", "float32"):
      raise ValueError(f"compute_dtype must be bfloat16 or float32, got "
                       f"{self.compute_dtype!r}")

  @property
  def gemms(self) -> tuple[GemmRecipe, GemmRecipe, GemmRecipe]:
    return (self.forward, self.dgrad, self.wgrad)

  @property
  def quantized(self) -> bool:
    """Whether any operand of any GEMM is quantized (or transformed)."""
    return any(g.lhs is not None or g.rhs is not None or g.hadamard is not None
               for g in self.gemms)

  @property
  def needs_key(self) -> bool:
    """Whether the recipe draws random numbers (stochastic rounding or an RHT)."""
    return any(g.needs_key for g in self.gemms)


def _mx(fmt, rule, **kw):
  return OperandQuant(fmt=fmt, scale_rule=rule, **kw)


def _mxfp4(name: str, *, rht: bool, sr: bool) -> Recipe:
  rule = "alto"
  x = _mx("e2m1", rule)
  w = _mx("e2m1", rule, layout="2d")
  do = _mx("e2m1", rule, rounding="stochastic" if sr else "nearest")
  return Recipe(name=name,
                forward=GemmRecipe(lhs=x, rhs=w),
                dgrad=GemmRecipe(lhs=do, rhs=None),
                wgrad=GemmRecipe(lhs=x, rhs=do, hadamard=32 if rht else None),
                reuse_forward_weight=True)


def _nvfp4() -> Recipe:
  x = OperandQuant(fmt="nvfp4", block=16)
  w = OperandQuant(fmt="nvfp4", block=16, layout="2d")
  do = OperandQuant(fmt="nvfp4", block=16, rounding="stochastic")
  return Recipe(name="nvfp4", forward=GemmRecipe(lhs=x, rhs=w),
                dgrad=GemmRecipe(lhs=do, rhs=None),
                wgrad=GemmRecipe(lhs=x, rhs=do, hadamard=16),
                reuse_forward_weight=True, compute_dtype="float32")


def _fp8() -> Recipe:
  a = OperandQuant(fmt="e4m3", scaling="tensor")
  g = OperandQuant(fmt="e5m2", scaling="tensor")
  return Recipe(name="fp8", forward=GemmRecipe(lhs=a, rhs=a),
                dgrad=GemmRecipe(lhs=g, rhs=a), wgrad=GemmRecipe(lhs=a, rhs=g),
                compute_dtype="float32")


def _mxfp8() -> Recipe:
  q = _mx("e4m3", "rceil")
  gemm = GemmRecipe(lhs=q, rhs=q)
  return Recipe(name="mxfp8", forward=gemm, dgrad=gemm, wgrad=gemm)


_RECIPES: dict[str, Recipe] = {
    r.name: r for r in (
        Recipe(name="bf16"),
        _fp8(),
        _mxfp8(),
        _mxfp4("mxfp4_1d2d", rht=False, sr=False),
        _mxfp4("mxfp4_rht", rht=True, sr=False),
        _mxfp4("mxfp4", rht=True, sr=True),
        _nvfp4(),
    )
}


def names() -> tuple[str, ...]:
  """Names of the built-in recipes."""
  return tuple(_RECIPES)


def get(recipe: str | Recipe) -> Recipe:
  """A built-in recipe by name (a :class:`Recipe` is returned unchanged)."""
  if isinstance(recipe, Recipe):
    return recipe
  try:
    return _RECIPES[recipe]
  except KeyError:
    raise ValueError(f"unknown recipe {recipe!r}; known recipes: "
                     f"{', '.join(names())}") from None


def replace(recipe: str | Recipe, **changes) -> Recipe:
  """A copy of ``recipe`` with fields changed (give a new ``name`` for a variant)."""
  return dataclasses.replace(get(recipe), **changes)
