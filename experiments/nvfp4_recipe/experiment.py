"""NVIDIA's NVFP4 pretraining recipe (arXiv 2509.25149), one component at a time.

    python -m experiments.nvfp4_recipe                          # the full NVFP4 recipe
    python -m experiments.nvfp4_recipe --grad_sr=false          # without stochastic rounding
    python -m experiments.nvfp4_recipe --fmt=mxfp4              # the same recipe in MXFP4
    python -m experiments.nvfp4_recipe --fmt=bf16 --weight_2d=false --wgrad_rht=false \\
        --grad_sr=false --bf16_last_blocks=0                    # the bf16 baseline
    python -m launch.sweep --sweep=nvfp4_recipe                 # the leave-one-out table

The model is the dense char-level LM of :mod:`experiments.lm` (``LMConfig``'s fields,
trained by :func:`experiments.common.trainers.lm_trainer.train_and_evaluate`). The recipe runs
the blocks' linear projections (q/k/v, attention output, feed-forward); the attention
products and the LM head stay bf16 (:func:`experiments.common.trainers.recipe_flag.model_rules`).
Each component of the paper's recipe is one field:

* ``fmt``: ``nvfp4`` (E2M1, E4M3 scales over 16 elements and a float32 tensor scale,
  Transformer Engine's convention), ``mxfp4`` (E2M1, E8M0 scales over 32 elements) or
  ``bf16`` (the baseline: no quantization, every component off).
* ``weight_2d``: W in square tiles (16x16; MXFP4: 32x32) quantized once and reused,
  transposed, in dgrad, so the forward and backward see the same weight. Off: W in 1D
  blocks along each GEMM's contraction axis (K in the forward, N in dgrad), quantized
  again from high precision for dgrad.
* ``wgrad_rht``: a random Hadamard transform along the tokens on both wgrad operands,
  of the block size (16; MXFP4: 32), and nowhere else (the paper: no gain on the
  forward and dgrad).
* ``grad_sr``: stochastic rounding of the output gradient dO in dgrad and wgrad, and
  of nothing else (the paper: SR on forward tensors hurts).
* ``bf16_last_blocks``: the last N transformer blocks entirely in bf16 (the paper keeps
  about the last 15% of its layers in high precision).

With every component on and ``fmt=nvfp4`` the recipe is ``numerics.recipes``'
``nvfp4`` exactly (only its name differs). The MXFP4 arm uses the scale rule ``rceil``
(the smallest power of two with ``amax / scale <= 6``), Blackwell's conversion and the
one Transformer Engine's MX recipes use: it never saturates a block's largest element.
This is the hardware convention, not the best rule for post-training quantization of
this model: ``experiments/scale_rules/report/FINDINGS.md`` found the nearest power of
two best, and floor vs rceil undecided (rceil, if anything, slightly worse).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from experiments.common.harness.config_flags import config_field
from experiments.common.harness.run_options import RunOptions
from experiments.common.trainers import lm_trainer
from experiments.common.trainers import recipe_flag
from experiments.common.trainers.lm_trainer import LMConfig
from lowprec.models import quantization
from lowprec.numerics import recipes as recipes_lib
from lowprec.numerics import rounding as rounding_lib
from lowprec.numerics.recipes import GemmRecipe, MXQuant, NVFP4Quant

EXPERIMENT = "nvfp4_recipe"
FORMATS = ("nvfp4", "mxfp4", "bf16")
# Block size of each format: NVFP4's 16, MX's 32 (the tile edge and the RHT size too).
BLOCK = {"nvfp4": 16, "mxfp4": 32}
MX_SCALE_RULE = "rceil"
COMPONENTS = ("weight_2d", "wgrad_rht", "grad_sr", "bf16_last_blocks")


@dataclasses.dataclass(frozen=True)
class Nvfp4RecipeConfig(LMConfig):
  """The dense LM's fields (``LMConfig``; its ``recipe`` is replaced by ``fmt`` and the
  components, so it must stay at its default) and the recipe's components."""

  fmt: str = config_field("nvfp4", "Element format of the projections: nvfp4, mxfp4 "
                          "(E8M0 scales over 32, rule rceil) or bf16 (the baseline: every "
                          "component must be off).", choices=FORMATS)
  weight_2d: bool = config_field(
      True, "W in square tiles (16x16; mxfp4 32x32) reused, transposed, in dgrad; false: "
      "1D blocks along each GEMM's contraction axis, W quantized again for dgrad.")
  wgrad_rht: bool = config_field(
      True, "Random Hadamard transform (16-point; mxfp4 32-point) along the tokens on "
      "both wgrad operands.")
  grad_sr: bool = config_field(True, "Stochastic rounding of dO in dgrad and wgrad.")
  bf16_last_blocks: int = config_field(
      1, "The last N transformer blocks entirely in bf16 (at most num_layers - 1).",
      domain="[0, inf)")

  def __post_init__(self):
    super().__post_init__()
    if self.recipe != "bf16":
      raise ValueError(f"--recipe={self.recipe} is not used by {EXPERIMENT}: choose the "
                       "format with --fmt and the components with their flags")
    if self.bf16_last_blocks > self.num_layers - 1:
      raise ValueError(f"--bf16_last_blocks={self.bf16_last_blocks} must be at most "
                       f"num_layers - 1 = {self.num_layers - 1} (at least one block "
                       "runs the recipe)")
    on = [c for c in COMPONENTS if getattr(self, c)]
    if self.fmt == "bf16" and on:
      raise ValueError(f"--fmt=bf16 is the unquantized baseline: turn off "
                       f"{', '.join('--' + c for c in on)} (false / 0)")

  def build_recipe(self) -> recipes_lib.Recipe:
    """The projections' recipe from the components (``bf16_last_blocks`` is a rule,
    :meth:`model_rules`, not part of it)."""
    if self.fmt == "bf16":
      return recipes_lib.get("bf16")
    b = BLOCK[self.fmt]

    def quant(**kw) -> recipes_lib.OperandQuant:
      if self.fmt == "nvfp4":
        return NVFP4Quant(**kw)
      return MXQuant(fmt="e2m1", scale_rule=MX_SCALE_RULE, **kw)

    x = quant()
    do = quant(rounding=rounding_lib.Stochastic() if self.grad_sr
               else rounding_lib.Nearest())
    if self.weight_2d:  # dgrad's rhs None: the forward's quantized tiles, transposed
      w, dgrad = quant(block_shape=(b, b)), GemmRecipe(lhs=do, rhs=None)
    else:
      w, dgrad = quant(), GemmRecipe(lhs=do, rhs=quant())
    parts = [self.fmt] + [name for name, on in (("2d", self.weight_2d),
                                                 ("rht", self.wgrad_rht),
                                                 ("sr", self.grad_sr)) if on]
    return recipes_lib.Recipe(
        name="_".join(parts), forward=GemmRecipe(lhs=x, rhs=w), dgrad=dgrad,
        wgrad=GemmRecipe(lhs=x, rhs=do, hadamard=b if self.wgrad_rht else None),
        reuse_forward_weight=self.weight_2d)

  def model_recipe(self) -> recipes_lib.Recipe:
    return self.build_recipe()

  def bf16_blocks(self) -> tuple[int, ...]:
    """Indices of the blocks kept entirely in bf16 (the last ``bf16_last_blocks``)."""
    return tuple(range(self.num_layers - self.bf16_last_blocks, self.num_layers))

  def model_rules(self, recipe: recipes_lib.Recipe) -> tuple[quantization.Rule, ...]:
    """The experiments' rules, after one bf16 rule per kept block: it matches the block
    itself (its attention products) and every module below it (its projections)."""
    kept = tuple(quantization.Rule(rf"block_{i}(/.*)?", "bf16") for i in self.bf16_blocks())
    return kept + recipe_flag.model_rules(recipe)


def train_and_evaluate(config: Nvfp4RecipeConfig, options: RunOptions) -> dict[str, Any]:
  """Trains and evaluates one run; returns its summary (see
  experiments.common.trainers.lm_trainer)."""
  return lm_trainer.train_and_evaluate(config, options, experiment=EXPERIMENT)
