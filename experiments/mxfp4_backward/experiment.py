"""MXFP4 in the backward pass only: stochastic rounding x Hadamard transforms.

    python -m experiments.mxfp4_backward --backward=mxfp4                  # RTN
    python -m experiments.mxfp4_backward --backward=mxfp4 --stochastic_rounding \\
        --hadamard=random                                                  # Tseng et al.
    python -m experiments.mxfp4_backward --backward=mxfp4 --hadamard=deterministic
    python -m launch.sweep --sweep=mxfp4_backward                          # the ablation

Two papers disagree (``../shared/papers-field.md``). Tseng, Yu and Park, "Training LLMs
with MXFP4" (arXiv 2502.20586), put MXFP4 on the backward GEMMs only and find naive
round-to-nearest degrades training, stochastic rounding (SR) is unbiased but noisy, and
a random Hadamard transform (RHT) bounds that noise: RHT + SR is near-lossless. "Pretraining
LLMs with MXFP4 on Native FP4 Hardware" (arXiv 2605.09825) finds that once the weight
gradient is quantized, SR and random Hadamard rotations fail and a *deterministic*
Hadamard rotation restores training.

One run trains the char-level LM of :mod:`experiments.lm` (the harness's
:mod:`experiments.common.trainers.lm_trainer`) with the forward GEMMs in bf16 and, with
``--backward=mxfp4``, both operands of dgrad (``dX = dO W^T``, contracted over the
layer's output width) and wgrad (``dW = X^T dO``, contracted over tokens) in MXFP4:
E2M1 elements with E8M0 scales over 32 elements along each GEMM's contraction axis,
``--scale_rule`` (default OCP's ``floor``, as Tseng et al.). The options:

* ``--stochastic_rounding``: both backward operands rounded stochastically, after
  Tseng et al.'s x ``sr_prescale`` (3/4: the floor scale maps a block's amax up to
  ``8 x 0.75 = 6``, E2M1's largest value, so SR never clips and stays unbiased; the
  GEMM output is divided by ``0.75^2``, :class:`numerics.operand_quant.MXQuant`'s
  ``prescale``);
* ``--hadamard=random``: the same RHT of ``--hadamard_size`` along the contraction
  axis of both operands of each backward GEMM, drawn per GEMM call from its key
  (:mod:`numerics.hadamard`); ``deterministic``: the fixed ``H_b / sqrt(b)``
  (``GemmRecipe.hadamard_random=False``);
* ``--noquantize_wgrad``: wgrad stays bf16 (dgrad alone in MXFP4: arXiv 2605.09825's
  "quantizing Wgrad is the primary driver").

Attention products and the LM head stay bf16
(:func:`experiments.common.trainers.recipe_flag.model_rules`); ``--recipe`` is not used (the recipe comes from the flags above; leave it at bf16).
Metrics, curves, checkpoints and the results row are the LM trainer's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from experiments.common.harness.config_flags import config_field
from experiments.common.harness.run_options import RunOptions
from experiments.common.trainers import lm_trainer
from experiments.common.trainers.lm_trainer import LMConfig
from lowprec.numerics import mx_scales
from lowprec.numerics import recipes as recipes_lib
from lowprec.numerics.rounding import Nearest, Stochastic

EXPERIMENT = "mxfp4_backward"
BACKWARD = ("bf16", "mxfp4")
HADAMARD = ("none", "random", "deterministic")


@dataclasses.dataclass(frozen=True)
class Mxfp4BackwardConfig(LMConfig):
  """The LM's fields (``LMConfig``; ``recipe`` unused) and the backward GEMMs' recipe."""

  backward: str = config_field("mxfp4", "Backward GEMMs (dgrad, wgrad): bf16, or MXFP4 "
                               "(E2M1, E8M0 scales over 32 along the contraction).",
                               choices=BACKWARD)
  stochastic_rounding: bool = config_field(
      False, "Round the backward operands stochastically (after x sr_prescale).")
  sr_prescale: float = config_field(
      0.75, "Tseng et al.'s scale before stochastic rounding (output / prescale^2).",
      domain="(0, 1]")
  hadamard: str = config_field("none", "Hadamard transform along each backward GEMM's "
                               "contraction: none, random (RHT), deterministic "
                               "(H_b / sqrt(b)).", choices=HADAMARD)
  hadamard_size: int = config_field(32, "The transform's block size (a power of two).",
                                    domain="[1, inf)")
  quantize_wgrad: bool = config_field(True, "Quantize wgrad too (False: dgrad only).")
  scale_rule: str = config_field("floor", "The MX block-scale rule (numerics.mx_scales).",
                                 choices=tuple(mx_scales.SCALE_RULES))

  def __post_init__(self):
    super().__post_init__()
    if self.recipe != "bf16":
      raise ValueError(f"--recipe={self.recipe} is not used here: the study's recipe "
                       f"comes from --backward, --stochastic_rounding, --hadamard and "
                       f"--quantize_wgrad; leave --recipe at bf16")
    size = self.hadamard_size
    if size & (size - 1):
      raise ValueError(f"--hadamard_size={size} must be a power of two")
    if self.backward == "bf16" and (self.stochastic_rounding or self.hadamard != "none"
                                    or not self.quantize_wgrad):
      raise ValueError("--backward=bf16 quantizes nothing: --stochastic_rounding, "
                       "--hadamard and --noquantize_wgrad need --backward=mxfp4")

  def backward_gemm(self) -> recipes_lib.GemmRecipe:
    """One backward GEMM's recipe: both operands MXFP4 along the contraction axis."""
    rounding = Stochastic() if self.stochastic_rounding else Nearest()
    prescale = self.sr_prescale if self.stochastic_rounding else 1.0
    q = recipes_lib.MXQuant(fmt="e2m1", scale_rule=self.scale_rule, rounding=rounding,
                            prescale=prescale)
    size = None if self.hadamard == "none" else self.hadamard_size
    return recipes_lib.GemmRecipe(lhs=q, rhs=q, hadamard=size,
                                  hadamard_random=self.hadamard != "deterministic")

  def model_recipe(self) -> recipes_lib.Recipe | str:
    """bf16 forward; dgrad and (``quantize_wgrad``) wgrad from :meth:`backward_gemm`."""
    if self.backward == "bf16":
      return "bf16"
    gemm = self.backward_gemm()
    name = "_".join(["bwd_mxfp4"] + (["sr"] if self.stochastic_rounding else [])
                    + ({"random": ["rht"], "deterministic": ["dh"]}.get(self.hadamard, []))
                    + ([] if self.quantize_wgrad else ["dgrad_only"]))
    return recipes_lib.Recipe(
        name=name, dgrad=gemm,
        wgrad=gemm if self.quantize_wgrad else recipes_lib.GemmRecipe())


def train_and_evaluate(config: Mxfp4BackwardConfig, options: RunOptions) -> dict[str, Any]:
  """Trains and evaluates one run; returns its summary (see
  experiments.common.trainers.lm_trainer)."""
  return lm_trainer.train_and_evaluate(config, options, experiment=EXPERIMENT)
