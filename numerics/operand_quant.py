"""How one GEMM operand is quantized: one class per scaling mode.

* :class:`MXQuant`: OCP MX block scaling: an MX element format (``e4m3``, ``e2m1``,
  ``int8``, ...) with one E8M0 scale per block (an MX scale rule), optional ALTO
  static clipping (``prescale``), QuEST dynamic clipping (``clip="rms"``) and a
  float32 macro-block scale above the block scales (``macro_block``).
* :class:`NVFP4Quant`: NVFP4: E2M1 elements, E4M3 block scales of 16 and a float32
  tensor scale (``convention`` ``te``, ``torchao`` or ``qwix``, which has none; the
  tensor amax reduced over ``amax_axis_name`` inside ``jax.shard_map``).
* :class:`TensorQuant`: one float32 scale per tensor from its current amax (``max /
  amax``), then an element-wise cast to ``fmt``.
* :class:`DelayedQuant`: Transformer Engine's delayed scaling: the scale comes from an
  amax history carried between steps (:mod:`numerics.delayed_scaling`).

All four are :class:`OperandQuant`, and each holds only the options its mode has, so a
bad mix (an NVFP4 operand with an MX scale rule, a tensor-scaled one with blocks)
cannot be built: the constructor has no such argument. Reading an option another mode
has gives its neutral value (an :class:`NVFP4Quant`'s ``clip`` is ``"none"``, its
``scaling`` ``"block"``), so code that reads operands generically works on all four.
:func:`replace` changes options and keeps the class, with a ``ValueError`` naming an
option the class does not take. ``OperandQuant`` itself is only the base: build one of
the four.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

import numpy as np

from lowprec.numerics import blockscale
from lowprec.numerics import formats as formats_lib
from lowprec.numerics import mx_scales
from lowprec.numerics import quantizer
from lowprec.numerics import rounding as rounding_lib

Scaling = Literal["block", "tensor", "delayed"]
_DELAYED_DEFAULTS = dict(amax_history_len=1024, amax_compute_algo="max", margin=0)


def is_int(v) -> bool:
  """An int (numpy's included), not a bool: the type of sizes and counts in options."""
  return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


@dataclasses.dataclass(frozen=True)
class OperandQuant:
  """How one operand of one GEMM is quantized: an :class:`MXQuant`,
  :class:`NVFP4Quant`, :class:`TensorQuant` or :class:`DelayedQuant`.

  Attributes common to all: ``rounding`` (a :data:`numerics.rounding.Rounding`:
  ``Nearest()``, ``TowardZero()`` or ``Stochastic(bits=..., rng=...)``) and
  ``prescale`` (ALTO's static clipping: the operand is multiplied by it
  before quantization and the GEMM's output divided by the product of its operands'
  prescales, so the GEMM still multiplies exact quantized values; 1: off).
  """

  scaling: ClassVar[str]
  # The neutral value of every option, for the modes that do not have it.
  block_shape = None
  scale_rule = "floor"
  rounding = rounding_lib.Nearest()
  prescale = 1.0
  clip = "none"
  macro_block = None
  amax_history_len = _DELAYED_DEFAULTS["amax_history_len"]
  amax_compute_algo = _DELAYED_DEFAULTS["amax_compute_algo"]
  margin = _DELAYED_DEFAULTS["margin"]
  convention = "te"
  amax_axis_name = None

  def __new__(cls, *args, **kwargs):
    del args, kwargs
    if cls is OperandQuant:
      raise TypeError("OperandQuant is the base class: build an MXQuant, NVFP4Quant, "
                      "TensorQuant or DelayedQuant (lowprec.numerics.operand_quant)")
    return super().__new__(cls)

  def _check_common(self) -> None:
    rounding_lib.check_rounding(self.rounding, type(self).__name__)
    if not (0 < self.prescale < float("inf")):
      raise ValueError(f"prescale must be positive and finite, got {self.prescale}")

  @property
  def block_extents(self) -> tuple[int, ...]:
    """``(b,)`` for 1D blocks, ``(b_contraction, b_free)`` for tiles, () without blocks."""
    if self.block_shape is None:
      return ()
    return self.block_shape if isinstance(self.block_shape, tuple) else (self.block_shape,)

  @property
  def is_2d(self) -> bool:
    return len(self.block_extents) == 2

  def blocks(self, contract_axis: int, free_axis: int, extent: int | None = None
             ) -> dict:
    """Block layout keyword arguments (``block_shape``/``axis``/``pad``) of this
    operand's blocks, or of blocks of ``extent`` (e.g. the macro blocks)."""
    if self.is_2d:
      shape = self.block_shape if extent is None else (extent, extent)
      return dict(block_shape=shape, axis=(contract_axis, free_axis), pad=True)
    b = self.block_extents[0] if extent is None else extent
    return dict(block_shape=b, axis=contract_axis, pad=True)

  def spec(self, contract_axis: int, free_axis: int) -> quantizer.QuantSpec:
    """The :class:`QuantSpec` for an operand with these (negative) axes."""
    raise NotImplementedError


def _block_shape(block_shape, default: int):
  blocks, _ = blockscale.canonical_block(block_shape, None, default)
  if len(blocks) > 2:
    raise ValueError(f"an operand's block_shape is an int or (b_contraction, "
                     f"b_free), got {block_shape!r}")
  return blocks, (blocks[0] if len(blocks) == 1 else blocks)


@dataclasses.dataclass(frozen=True)
class MXQuant(OperandQuant):
  """An MX block-scaled operand.

  Attributes:
    fmt: an MX element format (``blockscale.MX_ELEMENT_FORMATS``).
    block_shape: an int (1D blocks along the contraction axis; default 32) or
      ``(b_contraction, b_free)`` tiles.
    scale_rule: the MX scale rule (``blockscale.SCALE_RULES``, or ``"qwix"``: qwix
      0.1.8's scale, for e4m3 and e2m1; see :class:`numerics.quantizer.QuantSpec`).
    rounding, prescale: see :class:`OperandQuant`.
    clip: ``none``, or ``rms`` (QuEST-style dynamic clipping of each block at 2.922 x
      its RMS before quantization, :mod:`numerics.clipping`).
    macro_block: a float32 macro-block scale above the MX scales
      (:mod:`numerics.macro_scaling`): 1 x macro_block along the contraction axis for
      1D blocks, macro_block tiles for 2D; a multiple of the block. None: off.
  """

  scaling: ClassVar[str] = "block"
  fmt: str
  block_shape: int | tuple[int, ...] | None = None
  scale_rule: str = "floor"
  rounding: rounding_lib.Rounding = rounding_lib.Nearest()
  prescale: float = 1.0
  clip: Literal["none", "rms"] = "none"
  macro_block: int | None = None

  def __post_init__(self):
    if self.fmt == "nvfp4":
      raise ValueError("nvfp4 operands are NVFP4Quant (MXQuant takes MX element "
                       "formats)")
    formats_lib.get(self.fmt)
    if self.fmt not in blockscale.MX_ELEMENT_FORMATS:
      raise ValueError(f"block scaling needs an MX element format or nvfp4, got "
                       f"{self.fmt!r}")
    blocks, canonical = _block_shape(self.block_shape, blockscale.MX_BLOCK)
    object.__setattr__(self, "block_shape", canonical)
    self._check_common()
    if self.scale_rule not in blockscale.SCALE_RULES + (mx_scales.QWIX_RULE,):
      raise ValueError(f"unknown scale_rule {self.scale_rule!r}")
    if self.clip not in ("none", "rms"):
      raise ValueError(f"clip must be 'none' or 'rms', got {self.clip!r}")
    if self.macro_block is not None:
      if not is_int(self.macro_block) or any(
          self.macro_block < b or self.macro_block % b for b in blocks):
        raise ValueError(f"macro_block must be a multiple of block_shape="
                         f"{self.block_shape}, got {self.macro_block}")

  def spec(self, contract_axis: int, free_axis: int) -> quantizer.QuantSpec:
    return quantizer.QuantSpec(fmt=self.fmt, rounding=self.rounding,
                               scale_rule=self.scale_rule,
                               **self.blocks(contract_axis, free_axis))


@dataclasses.dataclass(frozen=True)
class NVFP4Quant(OperandQuant):
  """An NVFP4 operand: E2M1 elements, E4M3 scales per block of 16 and a float32 tensor
  scale.

  Attributes:
    block_shape: 16 (1D blocks along the contraction axis) or ``(16, 16)`` tiles.
    rounding, prescale: see :class:`OperandQuant`.
    convention: the scale convention, ``te`` (Transformer Engine), ``torchao`` or ``qwix``.
    amax_axis_name: inside ``jax.shard_map``, the mesh axis (or axes) over which the
      tensor amax is reduced (see :class:`numerics.quantizer.QuantSpec` and
      :func:`numerics.recipes.with_amax_axis_name`).
  """

  scaling: ClassVar[str] = "block"
  fmt: ClassVar[str] = "nvfp4"
  block_shape: int | tuple[int, ...] | None = None
  rounding: rounding_lib.Rounding = rounding_lib.Nearest()
  prescale: float = 1.0
  convention: str = "te"
  amax_axis_name: str | tuple[str, ...] | None = None

  def __post_init__(self):
    blocks, canonical = _block_shape(self.block_shape, blockscale.NVFP4_BLOCK)
    if any(b != blockscale.NVFP4_BLOCK for b in blocks):
      raise ValueError(f"nvfp4 blocks are {blockscale.NVFP4_BLOCK} long, got "
                       f"block_shape={self.block_shape!r}")
    object.__setattr__(self, "block_shape", canonical)
    if self.convention not in blockscale.NVFP4_CONVENTIONS:
      raise ValueError(f"convention must be one of {blockscale.NVFP4_CONVENTIONS}, got "
                       f"{self.convention!r}")
    object.__setattr__(self, "amax_axis_name", blockscale.check_amax_axis_name(
        self.amax_axis_name, "NVFP4Quant"))
    self._check_common()

  def spec(self, contract_axis: int, free_axis: int) -> quantizer.QuantSpec:
    return quantizer.QuantSpec(fmt="nvfp4", rounding=self.rounding,
                               convention=self.convention,
                               amax_axis_name=self.amax_axis_name,
                               **self.blocks(contract_axis, free_axis))


def _element_format(fmt: str, scaling: str) -> None:
  if fmt == "nvfp4":
    raise ValueError(f"nvfp4 is block-scaled, got scaling={scaling!r}")
  formats_lib.get(fmt)


@dataclasses.dataclass(frozen=True)
class TensorQuant(OperandQuant):
  """One float32 scale per tensor, ``max / amax`` of the current tensor, then an
  element-wise cast to ``fmt`` (any format of :mod:`numerics.formats`).

  Attributes:
    fmt: the element format.
    rounding, prescale: see :class:`OperandQuant`.
    amax_axis_name: inside ``jax.shard_map``, the mesh axis (or axes) over which the
      tensor amax is reduced.
  """

  scaling: ClassVar[str] = "tensor"
  fmt: str
  rounding: rounding_lib.Rounding = rounding_lib.Nearest()
  prescale: float = 1.0
  amax_axis_name: str | tuple[str, ...] | None = None

  def __post_init__(self):
    _element_format(self.fmt, "tensor")
    object.__setattr__(self, "amax_axis_name", blockscale.check_amax_axis_name(
        self.amax_axis_name, "TensorQuant"))
    self._check_common()

  def spec(self, contract_axis: int, free_axis: int) -> quantizer.QuantSpec:
    del contract_axis, free_axis
    return quantizer.QuantSpec(fmt=self.fmt, scaling="tensor", rounding=self.rounding,
                               amax_axis_name=self.amax_axis_name)


@dataclasses.dataclass(frozen=True)
class DelayedQuant(OperandQuant):
  """Transformer Engine's delayed scaling: the scale comes from an amax history carried
  between steps (:mod:`numerics.delayed_scaling`; the GEMMs need
  :func:`numerics.qdot.quantized_dot_general_with_state`).

  Attributes:
    fmt: the element format.
    rounding, prescale: see :class:`OperandQuant`.
    amax_history_len, amax_compute_algo, margin: ``DelayedScaling``'s history length,
      its reduction (``max`` or ``most_recent``) and the scale's power-of-two margin.
  """

  scaling: ClassVar[str] = "delayed"
  fmt: str
  rounding: rounding_lib.Rounding = rounding_lib.Nearest()
  prescale: float = 1.0
  amax_history_len: int = _DELAYED_DEFAULTS["amax_history_len"]
  amax_compute_algo: Literal["max", "most_recent"] = _DELAYED_DEFAULTS["amax_compute_algo"]
  margin: int = _DELAYED_DEFAULTS["margin"]

  def __post_init__(self):
    _element_format(self.fmt, "delayed")
    self._check_common()
    if not is_int(self.amax_history_len) or self.amax_history_len < 1:
      raise ValueError(f"amax_history_len must be a positive int, got "
                       f"{self.amax_history_len!r}")
    if self.amax_compute_algo not in ("max", "most_recent"):
      raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent', got "
                       f"{self.amax_compute_algo!r}")
    if not is_int(self.margin) or self.margin < 0:
      raise ValueError(f"margin must be an int >= 0, got {self.margin!r}")

  def spec(self, contract_axis: int, free_axis: int) -> quantizer.QuantSpec:
    raise ValueError("a delayed-scaling operand has no stateless QuantSpec")


# Options by the classes that take them: what replace() names when a class lacks one.
_DELAYED_OPTIONS = ("amax_history_len", "amax_compute_algo", "margin")


def _foreign_option(op: OperandQuant, name: str) -> str:
  """Why ``op``'s class takes no option ``name`` (one line)."""
  kind = type(op).__name__
  if name == "scale_rule":
    return ("nvfp4 has no MX scale rule (see convention)" if isinstance(op, NVFP4Quant)
            else f"scale_rule is an MX option (MXQuant), not {kind}'s")
  if name == "convention":
    return f"convention is an nvfp4 option (NVFP4Quant), not {kind}'s"
  if name == "amax_axis_name":
    return (f"amax_axis_name reduces a tensor amax, which only NVFP4Quant and "
            f"TensorQuant operands take, not {kind}")
  if name in ("clip", "macro_block"):
    return f"clip and macro_block apply to MX block quantizers (MXQuant) only, not {kind}"
  if name == "block_shape":
    return f"block_shape describes blocks, which {kind} has none of"
  if name in _DELAYED_OPTIONS:
    return f"{name} is a delayed-scaling option (DelayedQuant), not {kind}'s"
  if name in ("scaling", "fmt"):
    return (f"{name} picks the class: build the operand of the other mode (MXQuant, "
            f"NVFP4Quant, TensorQuant, DelayedQuant) instead of changing {kind}'s")
  return f"{kind} has no option {name!r}"


def replace(op: OperandQuant, **changes: Any) -> OperandQuant:
  """``op`` (same class) with options changed, validated as at construction. An
  option its class does not take raises ``ValueError`` naming it, unless the value is
  that option's neutral value (what the class reads for it), so a recipe transform can
  map one change over every operand alike."""
  if not isinstance(op, OperandQuant):
    raise TypeError(f"op must be an OperandQuant, got {type(op).__name__}")
  own = {f.name for f in dataclasses.fields(op)}
  for name, value in changes.items():
    if name not in own and not (hasattr(OperandQuant, name)
                                and value == getattr(op, name)):
      raise ValueError(_foreign_option(op, name))
  return dataclasses.replace(op, **{k: v for k, v in changes.items() if k in own})
