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
only cast to the recipe's compute dtype), one class per scaling mode
(:mod:`numerics.operand_quant`, also named here): :class:`MXQuant` and
:class:`NVFP4Quant` block scaling, whose ``block_shape`` is an int for 1D blocks along
that GEMM's contraction axis, or ``(b_contraction, b_free)`` for tiles over the
operand's (contraction, free) axes (square tiles quantize a matrix and its transpose the
same way); :class:`TensorQuant`, one float32 scale per tensor from the current amax;
:class:`DelayedQuant`, Transformer Engine's delayed scaling (a scale from an amax
history carried between steps, :mod:`numerics.delayed_scaling`), which needs
:func:`numerics.qdot.quantized_dot_general_with_state`. ``GemmRecipe.hadamard`` applies
a randomized Hadamard transform of that size to both operands along the contraction
axis first (exact in real arithmetic because the transform is orthonormal; random
unless ``GemmRecipe.hadamard_random`` is False).
``GemmRecipe.accumulation`` emulates a tensor core's limited-precision accumulator
(:mod:`numerics.accumulation`). ``reuse_forward_weight`` feeds the forward-quantized W
to dgrad (ALTO 1d2d: no forward/backward weight mismatch, no second quantization).

Named recipes (``names()``):

* ``fp32``: no quantization; float32 operands multiplied at ``Precision.HIGHEST``.
* ``bf16``: no quantization; bf16 operands, fp32 accumulation (a plain dot_general).
* ``fp8``: tensorwise current scaling (scale = max / amax per tensor), E4M3 for X and
  W, E5M2 for dO (Transformer Engine's HYBRID format).
* ``fp8_delayed``: the same formats with Transformer Engine's ``DelayedScaling``
  defaults (amax history of 1024 steps, ``max`` reduction, margin 0).
* ``mxfp8``: OCP MXFP8, E4M3 everywhere, 1x32 blocks along each GEMM's contraction
  axis (so W and dO are re-quantized for the backward GEMMs from high precision) with
  the RCEIL scale rule, as Blackwell/TE do.
* ``mxfp4_1d2d``, ``mxfp4_rht``, ``mxfp4``: ALTO's MXFP4 (E2M1, ALTO's scale rule): X
  1x32, W 32x32 tiles reused in dgrad, dO 1x32; ``_rht`` adds a 32-point RHT on both
  wgrad operands along tokens; ``mxfp4`` (= ALTO's 1d2d + RHT + SR) also rounds dO
  stochastically in dgrad and wgrad.
* ``nvfp4``: NVFP4 (E2M1, 1x16 E4M3-scaled blocks + fp32 tensor scale): W in 16x16
  tiles reused in dgrad, a 16-point RHT on wgrad, SR on dO.

``compute_dtype`` (``"bf16"`` or ``"fp32"``, the format names used everywhere) is the
dtype of the GEMM operands after fake quantization: bf16 for MX recipes (their
dequantized values are exact in bf16) and for ``nvfp4``, fp32 for ``fp8`` and
``fp8_delayed``, whose fp32 tensor scales make dequantized values inexact in bf16.
NVFP4 operands (``te`` convention) enter the GEMM as their block-scaled values
(E2M1 x E4M3, exact in bf16) and the GEMM multiplies its float32 output by the two
tensor scales, as the hardware does (:mod:`numerics.qdot`). Accumulation is float32
unless a GEMM emulates a narrower accumulator.

Build a custom recipe with :class:`Recipe` directly or :func:`replace`;
:func:`with_amax_axis_name` reduces every tensor amax over mesh axes inside
``jax.shard_map``.
"""

from __future__ import annotations

import dataclasses

from lowprec.numerics import accumulation as accumulation_lib
from lowprec.numerics import blockscale
from lowprec.numerics import formats as formats_lib
from lowprec.numerics import native_gemm
from lowprec.numerics import operand_quant
from lowprec.numerics import rounding as rounding_lib
# The operand quantizers live in numerics.operand_quant; recipes name them here too.
from lowprec.numerics.operand_quant import (DelayedQuant, MXQuant, NVFP4Quant,
                                            OperandQuant, TensorQuant)

Scaling = operand_quant.Scaling
COMPUTE_DTYPES = ("bf16", "fp32")


@dataclasses.dataclass(frozen=True)
class GemmRecipe:
  """Quantizers of one GEMM's operands (None: not quantized), an optional Hadamard
  transform of size ``hadamard`` (a power of two) along the contraction axis of both
  operands, and an optional emulated accumulator.

  ``hadamard_random`` (default True) draws the transform's signs and permutation from
  the GEMM's key (the RHT of :mod:`numerics.hadamard`); False applies the fixed
  Sylvester matrix ``H_b / sqrt(b)`` (no key: arXiv 2605.09825's deterministic
  rotation).

  ``native`` (default False) runs the GEMM on its operands' storage types where the
  program is lowered for ``cuda`` (:mod:`numerics.native_gemm`; set it with
  :func:`with_native_gemm`); elsewhere the emulated GEMM, with the same bits.
  """

  lhs: OperandQuant | None = None
  rhs: OperandQuant | None = None
  hadamard: int | None = None
  accumulation: accumulation_lib.Accumulation | None = None
  hadamard_random: bool = True
  native: bool = False

  def __post_init__(self):
    for side in ("lhs", "rhs"):
      op = getattr(self, side)
      if op is not None and not isinstance(op, OperandQuant):
        raise TypeError(f"GemmRecipe.{side} must be an OperandQuant or None, got "
                        f"{type(op).__name__}")
    h = self.hadamard
    if h is not None and (not operand_quant.is_int(h) or h < 1 or h & (h - 1)):
      raise ValueError(f"hadamard must be a power of two (the RHT size), got {h!r}")
    for name in ("hadamard_random", "native"):
      if not isinstance(getattr(self, name), bool):
        raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
    if self.native and self.accumulation is not None:
      raise ValueError("a native GEMM accumulates in the hardware's own accumulator; "
                       "an emulated accumulation cannot be native too")
    if self.accumulation is not None and not isinstance(
        self.accumulation, accumulation_lib.Accumulation):
      raise TypeError(f"accumulation must be a lowprec.numerics.accumulation.Accumulation, "
                      f"got {type(self.accumulation).__name__}")

  @property
  def needs_key(self) -> bool:
    return (self.hadamard is not None and self.hadamard_random) or any(
        op is not None and op.rounding.needs_key for op in (self.lhs, self.rhs))


GEMM_NAMES = ("forward", "dgrad", "wgrad")


@dataclasses.dataclass(frozen=True)
class Recipe:
  """A quantization recipe for the three GEMMs of a linear layer (hashable)."""

  name: str
  forward: GemmRecipe = GemmRecipe()
  dgrad: GemmRecipe = GemmRecipe()
  wgrad: GemmRecipe = GemmRecipe()
  reuse_forward_weight: bool = False
  compute_dtype: str = "bf16"
  dge_k: int | None = None
  dge_clamp: float = 3.0

  def __post_init__(self):
    for name in GEMM_NAMES:
      if not isinstance(getattr(self, name), GemmRecipe):
        raise TypeError(f"Recipe.{name} must be a GemmRecipe, got "
                        f"{type(getattr(self, name)).__name__}")
    if self.reuse_forward_weight:
      w = self.forward.rhs
      if w is None:
        raise ValueError("reuse_forward_weight needs a forward weight quantizer")
      if self.dgrad.hadamard is not None:
        raise ValueError("a reused forward weight cannot take a dgrad Hadamard")
      if not (w.is_2d and w.block_extents[0] == w.block_extents[1]):
        raise ValueError("reusing the forward weight in dgrad is only consistent with "
                         "square 2D tiles (1D blocks run along K, dgrad contracts over N)")
      if isinstance(w, DelayedQuant):
        raise ValueError("a delayed-scaling forward weight cannot be reused in dgrad")
    if self.compute_dtype not in COMPUTE_DTYPES:
      raise ValueError(f"compute_dtype must be one of {COMPUTE_DTYPES}, got "
                       f"{self.compute_dtype!r}")
    ops = [op for g in self.gemms for op in (g.lhs, g.rhs) if op is not None]
    if self.compute_dtype == "bf16" and any(op.macro_block for op in ops):
      raise ValueError("macro-block scaled operands are not bf16-exact: use "
                       "compute_dtype='fp32'")
    for name, (lhs, rhs) in zip(GEMM_NAMES, self.operand_pairs):
      if getattr(self, name).native and native_gemm.pair_kind(lhs, rhs) is None:
        raise ValueError(f"the {name} GEMM is native but its operands {_kinds(lhs, rhs)} "
                         f"have no common native form (both per-tensor FP8, both MXFP8 "
                         f"or both NVFP4: lowprec.numerics.native_gemm)")
    if self.dge_k is not None:
      w = self.forward.rhs
      if (not isinstance(w, MXQuant) or formats_lib.get(w.fmt).kind != "float"
          or w.macro_block is not None):
        raise ValueError("DGE needs an MX float forward weight quantizer without "
                         "macro blocks")
      if self.dge_k < 1 or not self.dge_clamp > 0:
        raise ValueError(f"need dge_k >= 1 and dge_clamp > 0, got {self.dge_k}, "
                         f"{self.dge_clamp}")

  @property
  def gemms(self) -> tuple[GemmRecipe, GemmRecipe, GemmRecipe]:
    return (self.forward, self.dgrad, self.wgrad)

  @property
  def operand_pairs(self) -> tuple[tuple[OperandQuant | None, OperandQuant | None], ...]:
    """(lhs, rhs) quantizer of each GEMM as it runs: dgrad's rhs is the forward weight
    quantizer when ``reuse_forward_weight``."""
    dgrad_rhs = self.forward.rhs if self.reuse_forward_weight else self.dgrad.rhs
    return ((self.forward.lhs, self.forward.rhs), (self.dgrad.lhs, dgrad_rhs),
            (self.wgrad.lhs, self.wgrad.rhs))

  @property
  def quantized(self) -> bool:
    """Whether any GEMM quantizes, transforms or emulates its accumulation."""
    return any(g.lhs is not None or g.rhs is not None or g.hadamard is not None
               or g.accumulation is not None for g in self.gemms)

  @property
  def needs_key(self) -> bool:
    """Whether the recipe draws random numbers (stochastic rounding or a random
    Hadamard transform)."""
    return any(g.needs_key for g in self.gemms)

  @property
  def delayed_operands(self) -> tuple[str, ...]:
    """``"<gemm>/<side>"`` of every delayed-scaling operand (they carry state)."""
    return tuple(f"{name}/{side}" for name, g in zip(GEMM_NAMES, self.gemms)
                 for side in ("lhs", "rhs")
                 if isinstance(getattr(g, side), DelayedQuant))


def _kinds(lhs: OperandQuant | None, rhs: OperandQuant | None) -> str:
  name = lambda op: "unquantized" if op is None else type(op).__name__
  return f"({name(lhs)}, {name(rhs)})"


def _mx(fmt, rule, **kw):
  return MXQuant(fmt=fmt, scale_rule=rule, **kw)


def _mxfp4(name: str, *, rht: bool, sr: bool) -> Recipe:
  rule = "alto"
  x = _mx("e2m1", rule)
  w = _mx("e2m1", rule, block_shape=(32, 32))
  do = _mx("e2m1", rule,
           rounding=rounding_lib.Stochastic() if sr else rounding_lib.Nearest())
  return Recipe(name=name,
                forward=GemmRecipe(lhs=x, rhs=w),
                dgrad=GemmRecipe(lhs=do, rhs=None),
                wgrad=GemmRecipe(lhs=x, rhs=do, hadamard=32 if rht else None),
                reuse_forward_weight=True)


def _nvfp4() -> Recipe:
  x = NVFP4Quant()
  w = NVFP4Quant(block_shape=(16, 16))
  do = NVFP4Quant(rounding=rounding_lib.Stochastic())
  return Recipe(name="nvfp4", forward=GemmRecipe(lhs=x, rhs=w),
                dgrad=GemmRecipe(lhs=do, rhs=None),
                wgrad=GemmRecipe(lhs=x, rhs=do, hadamard=16),
                reuse_forward_weight=True)


def _fp8(name: str, kind: type[TensorQuant] | type[DelayedQuant]) -> Recipe:
  a, g = kind(fmt="e4m3"), kind(fmt="e5m2")
  return Recipe(name=name, forward=GemmRecipe(lhs=a, rhs=a),
                dgrad=GemmRecipe(lhs=g, rhs=a), wgrad=GemmRecipe(lhs=a, rhs=g),
                compute_dtype="fp32")


def _mxfp8() -> Recipe:
  q = _mx("e4m3", "rceil")
  gemm = GemmRecipe(lhs=q, rhs=q)
  return Recipe(name="mxfp8", forward=gemm, dgrad=gemm, wgrad=gemm)


_RECIPES: dict[str, Recipe] = {
    r.name: r for r in (
        Recipe(name="fp32", compute_dtype="fp32"),
        Recipe(name="bf16"),
        _fp8("fp8", TensorQuant),
        _fp8("fp8_delayed", DelayedQuant),
        _mxfp8(),
        _mxfp4("mxfp4_1d2d", rht=False, sr=False),
        _mxfp4("mxfp4_rht", rht=True, sr=False),
        _mxfp4("mxfp4", rht=True, sr=True),
        _nvfp4(),
    )
}


def _map_operands(recipe: Recipe, **changes) -> dict:
  return {name: dataclasses.replace(g, **{
      side: (None if op is None else operand_quant.replace(op, **changes))
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
  return dataclasses.replace(r, name=f"{r.name}+mbs", compute_dtype="fp32",
                             **_map_operands(r, macro_block=macro_block))


def with_dge(recipe: str | Recipe, k: int = 5, clamp: float = 3.0) -> Recipe:
  """Differential gradient estimation on the weight gradient (:mod:`numerics.dge`)."""
  r = get(recipe)
  return dataclasses.replace(r, name=f"{r.name}+dge", dge_k=k, dge_clamp=clamp)


def with_accumulation(recipe: str | Recipe,
                      accumulation: accumulation_lib.Accumulation) -> Recipe:
  """Every GEMM of ``recipe`` accumulated by the emulated limited-precision
  ``accumulation`` (:mod:`numerics.accumulation`), e.g. Hopper FP8's ~14 fraction bits
  promoted to float32 every 128 products (DeepSeek-V3)."""
  if not isinstance(accumulation, accumulation_lib.Accumulation):
    raise TypeError(f"accumulation must be a lowprec.numerics.accumulation.Accumulation, "
                    f"got {type(accumulation).__name__}")
  r = get(recipe)
  gemms = {name: dataclasses.replace(g, accumulation=accumulation)
           for name, g in (("forward", r.forward), ("dgrad", r.dgrad), ("wgrad", r.wgrad))}
  return dataclasses.replace(r, name=f"{r.name}+acc{accumulation.fraction_bits}", **gemms)


def with_native_gemm(recipe: str | Recipe) -> Recipe:
  """``recipe`` with every GEMM that has a native form marked ``native``: its operands
  enter the GEMM in their storage types where the program is lowered for ``cuda``
  (per-tensor FP8: ``f8 x f8 -> f32``; MXFP8 and NVFP4: :func:`jax.nn.scaled_matmul`),
  the emulated GEMM elsewhere (same bits there; :mod:`numerics.native_gemm`). A GEMM
  keeps the emulated form when its two operands are not both per-tensor FP8
  (``e4m3``/``e5m2``), both MXFP8 (blocks of 32 along the contraction axis) or both
  NVFP4, or when it emulates its accumulation.

  Raises:
    ValueError: no GEMM of ``recipe`` has a native form (e.g. ``bf16``, the MXFP4
      recipes).
  """
  r = get(recipe)
  gemms = {name: dataclasses.replace(g, native=True) if ok else g
           for name, g, ok in zip(GEMM_NAMES, r.gemms, _native_gemms(r))}
  if not any(g.native for g in gemms.values()):
    raise ValueError(f"recipe {r.name!r} has no GEMM with a native form: a native GEMM "
                     f"needs both operands per-tensor FP8 (e4m3/e5m2), both MXFP8 or both "
                     f"NVFP4, and no emulated accumulation")
  return dataclasses.replace(r, name=f"{r.name}+native", **gemms)


def _native_gemms(r: Recipe) -> tuple[bool, bool, bool]:
  """Whether each GEMM of ``r`` has a native form (:func:`with_native_gemm`)."""
  return tuple(native_gemm.pair_kind(lhs, rhs) is not None and g.accumulation is None
               for g, (lhs, rhs) in zip(r.gemms, r.operand_pairs))


def has_native_gemm(recipe: str | Recipe) -> bool:
  """Whether :func:`with_native_gemm` accepts ``recipe`` (some GEMM has a native form)."""
  return any(_native_gemms(get(recipe)))


def with_amax_axis_name(recipe: str | Recipe,
                        amax_axis_name: str | tuple[str, ...]) -> Recipe:
  """``recipe`` with every tensor amax (NVFP4 and ``tensor``-scaled operands) reduced
  over the mesh axes ``amax_axis_name`` inside ``jax.shard_map``, as Transformer Engine
  reduces amaxes over a data- or tensor-parallel group: every shard then quantizes with
  the whole operand's tensor scale. Other operands are unchanged (MX has no tensor
  amax; a ``delayed`` operand's amax history is reduced by
  :func:`numerics.qdot.quantized_dot_general_with_state` itself)."""
  r = get(recipe)
  blockscale.check_amax_axis_name(amax_axis_name, "with_amax_axis_name")
  if amax_axis_name is None:
    raise ValueError("with_amax_axis_name needs a mesh axis name, got None")

  def change(op):
    if not isinstance(op, (NVFP4Quant, TensorQuant)):
      return op
    return operand_quant.replace(op, amax_axis_name=amax_axis_name)

  gemms = {name: dataclasses.replace(g, lhs=change(g.lhs), rhs=change(g.rhs))
           for name, g in zip(GEMM_NAMES, r.gemms)}
  label = amax_axis_name if isinstance(amax_axis_name, str) else ",".join(amax_axis_name)
  return dataclasses.replace(r, name=f"{r.name}+amax@{label}", **gemms)


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
