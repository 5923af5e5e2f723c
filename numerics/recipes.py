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
    prescale: static clipping (ALTO): the operand is multiplied by this before
      quantization and the GEMM's output divided by the product of its operands'
      prescales (so the GEMM still multiplies exact MX values). 1: off.
    clip: ``none``, or ``rms`` (dynamic QuEST-style clipping of each block at
      2.922 x its RMS before quantization, :mod:`numerics.clipping`).
    macro_block: a float32 macro-block scale above the MX scales
      (:mod:`numerics.macro_scaling`): 1 x macro_block along the contraction axis for
      ``1d``, macro_block tiles for ``2d``; a multiple of ``block``. None: off.
  """

  fmt: str
  scaling: Literal["block", "tensor"] = "block"
  block: int = 32
  layout: Layout = "1d"
  scale_rule: str = "floor"
  rounding: str = "nearest"
  rand_bits: int | None = None
  prescale: float = 1.0
  clip: Literal["none", "rms"] = "none"
  macro_block: int | None = None

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
    if not (0 < self.prescale < float("inf")):
      raise ValueError(f"prescale must be positive and finite, got {self.prescale}")
    if self.clip not in ("none", "rms"):
      raise ValueError(f"clip must be 'none' or 'rms', got {self.clip!r}")
    mx_only = self.clip != "none" or self.macro_block is not None
    if mx_only and (self.scaling != "block" or self.fmt == "nvfp4"):
      raise ValueError("clip and macro_block apply to MX block quantizers only")
    if self.macro_block is not None and (self.macro_block < self.block
                                         or self.macro_block % self.block):
      raise ValueError(f"macro_block must be a multiple of block={self.block}, got "
                       f"{self.macro_block}")

  def blocks(self, contract_axis: int, free_axis: int, extent: int | None = None
             ) -> dict:
    """Block layout keyword arguments (``block_size``/``axis``/``block_shape``/``pad``)
    of this operand's blocks, or of blocks of ``extent`` (e.g. the macro blocks)."""
    b = self.block if extent is None else extent
    if self.layout == "2d":
      return dict(block_size=None, axis=tuple(sorted((contract_axis, free_axis))),
                  block_shape=(b, b), pad=True)
    return dict(block_size=b, axis=contract_axis, block_shape=None, pad=True)

  def spec(self, contract_axis: int, free_axis: int) -> quantizer.QuantSpec:
    """The :class:`QuantSpec` for an operand with these (negative) axes."""
    if self.scaling == "tensor":
      return quantizer.QuantSpec(fmt=self.fmt, block_size=None, rounding=self.rounding,
                                 rand_bits=self.rand_bits, tensorwise=True)
    return quantizer.QuantSpec(fmt=self.fmt, scale_rule=self.scale_rule,
                               rounding=self.rounding, rand_bits=self.rand_bits,
                               **self.blocks(contract_axis, free_axis))


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
  dge_k: int | None = None
  dge_clamp: float = 3.0

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
    ops = [op for g in self.gemms for op in (g.lhs, g.rhs) if op is not None]
    if self.compute_dtype == "bfloat16" and any(op.macro_block for op in ops):
      raise ValueError("macro-block scaled operands are not bf16-exact: use "
                       "compute_dtype='float32'")
    if self.dge_k is not None:
      w = self.forward.rhs
      if (w is None or w.scaling != "block" or w.fmt == "nvfp4"
          or formats_lib.get(w.fmt).kind != "float" or w.macro_block is not None):
        raise ValueError("DGE needs an MX float forward weight quantizer without "
                         "macro blocks")
      if self.dge_k < 1 or not self.dge_clamp > 0:
        raise ValueError(f"need dge_k >= 1 and dge_clamp > 0, got {self.dge_k}, "
                         f"{self.dge_clamp}")

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


def _map_operands(recipe: Recipe, **changes) -> dict:
  return {name: dataclasses.replace(g, **{
      side: (None if op is None else dataclasses.replace(op, **changes))
      for side, op in (("lhs", g.lhs), ("rhs", g.rhs))})
          for name, g in (("forward", recipe.forward), ("dgrad", recipe.dgrad),
                          ("wgrad", recipe.wgrad))}


def with_static_clipping(recipe: str | Recipe, factor: float = 0.75) -> Recipe:
  """ALTO's static clipping: every quantized operand x ``factor`` before quantization,
  every GEMM output / (product of its operands' factors) after (wgrad: x 16/9)."""
  r = get(recipe)
  return dataclasses.replace(r, name=f"{r.name}+static_clip",
                             **_map_operands(r, prescale=factor))


def with_dynamic_clipping(recipe: str | Recipe) -> Recipe:
  """QuEST-style dynamic clipping (2.922 x block RMS) on every quantized operand."""
  r = get(recipe)
  return dataclasses.replace(r, name=f"{r.name}+dynamic_clip",
                             **_map_operands(r, clip="rms"))


def with_macro_blocks(recipe: str | Recipe, macro_block: int = 128) -> Recipe:
  """Macro-block scaling on every quantized operand (1 x 128 for 1d blocks, 128 x 128
  tiles for 2d), multiplied in float32."""
  r = get(recipe)
  return dataclasses.replace(r, name=f"{r.name}+mbs", compute_dtype="float32",
                             **_map_operands(r, macro_block=macro_block))


def with_dge(recipe: str | Recipe, k: int = 5, clamp: float = 3.0) -> Recipe:
  """Differential gradient estimation on the weight gradient (:mod:`numerics.dge`)."""
  r = get(recipe)
  return dataclasses.replace(r, name=f"{r.name}+dge", dge_k=k, dge_clamp=clamp)


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
