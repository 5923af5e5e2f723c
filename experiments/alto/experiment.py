"""ALTO in miniature: a small mixture-of-experts LM on Shakespeare, trained with a recipe.

    python -m experiments.alto                                   # mxfp4 (RHT + SR)
    python -m experiments.alto --recipe=mxfp4 --deoscillation --workdir=runs/alto/deosc
    python -m experiments.alto --recipe=mxfp4 --recipe_options=dge
    python -m launch.sweep --sweep=alto                          # the ablation table

The model is :class:`models.transformer.DecoderLM` with a top-k MoE feed-forward in every
block (:class:`experiments.common.trainers.moe_lm.MoELMConfig`); the recipe quantizes
the attention projections and the grouped expert GEMMs, and the router, attention
products and LM head stay bf16 (ALTO's convention, the rule list of
:func:`experiments.common.trainers.recipe_flag.model_rules`). ``--recipe_options``
adds ALTO's negative-result options to the recipe (:mod:`numerics.recipes`:
``with_dge``, ``with_static_clipping``, ``with_dynamic_clipping``,
``with_macro_blocks``); ``--deoscillation`` chains
:func:`numerics.optim.deoscillation.deoscillate` after AdamW, masked to the quantized
weights, with the recipe's forward weight quantizer. ``--compensation_rank`` adds
ALTO's trainable low-rank compensation branch (its report §3.8) to the attention
projections (:class:`models.transformer.Linear`; its GEMMs run the projections'
recipe). ``--target_loss`` and ``--late_from`` add two curve metrics to the results
row: the steps to a validation loss, and the loss drop after a step (ALTO's
steps-to-target overhead and late de-oscillation benefit). Training, logging, checkpointing
and resume are :func:`experiments.common.trainers.lm_trainer.train_and_evaluate`'s.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import optax

from experiments.common.evidence import curves
from experiments.common.evidence.tensorboard_reader import read_scalars
from experiments.common.harness.config_flags import config_field
from experiments.common.harness.run_options import RunOptions
from experiments.common.trainers import lm_trainer
from experiments.common.trainers import moe_lm
from lowprec.models.transformer import TransformerConfig
from lowprec.numerics import qdot
from lowprec.numerics import tree_paths
from lowprec.numerics import recipes as recipes_lib
from lowprec.numerics.optim.deoscillation import DeoscillationState, deoscillate
from lowprec.numerics.optim.dge_statistics import DGEStatisticsState, dge_statistics

EXPERIMENT = "alto"
RECIPE_OPTIONS = ("dge", "static_clip", "dynamic_clip", "macro_block")


@dataclasses.dataclass(frozen=True)
class AltoConfig(moe_lm.MoELMConfig):
  """An ALTO run: the small MoE LM's fields plus the recipe options and OsciReset."""

  recipe: str = config_field(
      "mxfp4", "Base recipe of the projections and expert GEMMs: bf16, or one of "
      "numerics.recipes.names() (mxfp4_1d2d; mxfp4_rht = + RHT; mxfp4 = + RHT + SR; nvfp4).")
  recipe_options: str = config_field(
      "", "Comma-separated recipe options: " + ", ".join(RECIPE_OPTIONS) + " (ALTO's "
      "negative results; '' for none).")
  dge_k: int = config_field(5, "DGE surrogate sharpness k.", domain="[1, inf)")
  dge_clamp: float = config_field(3.0, "DGE derivative clamp [0, clamp].", domain="(0, inf)")
  static_clip_factor: float = config_field(0.75, "Static clipping: x factor before, "
                                           "/ factor after each GEMM operand.", domain="(0, 1]")
  macro_block: int = config_field(128, "Macro-block size of the macro_block option.",
                                  domain="[1, inf)")
  deoscillation: bool = config_field(False, "Chain weight de-oscillation after AdamW.")
  deosc_period: int = config_field(50, "De-oscillation window P (steps).", domain="[1, inf)")
  deosc_ratio: float = config_field(4.0, "Snap elements with d_Q / d_w >= this ratio.",
                                    domain="(0, inf)")
  deosc_start: int = config_field(150, "Optimizer steps before the first window.",
                                  domain="[0, inf)")
  compensation_rank: int = config_field(
      0, "Rank of ALTO's low-rank compensation branch on the attention projections, "
      "trained with them and quantized by their recipe (0: none).", domain="[0, inf)")
  target_loss: float = config_field(
      0.0, "Record eval/steps_to_target, the step at which the validation loss first "
      "reaches this (interpolated between evaluations; num_steps, with "
      "eval/target_reached 0, if it never does); 0: not recorded.", domain="[0, inf)")
  late_from: int = config_field(
      0, "Record eval/late_gain, the validation loss at this step minus the final one "
      "(a multiple of eval_every below num_steps; 0: not recorded).", domain="[0, inf)")

  def __post_init__(self):
    super().__post_init__()
    unknown = set(self.option_list) - set(RECIPE_OPTIONS)
    if unknown:
      raise ValueError(f"unknown recipe_options {sorted(unknown)}; known: "
                       f"{', '.join(RECIPE_OPTIONS)}")
    if self.option_list and self.recipe in ("fp32", "bf16"):
      raise ValueError(f"recipe_options need a quantized recipe, got {self.recipe!r}")
    recipe = self.build_recipe()  # fails early on an inconsistent option combination
    if self.late_from and (self.late_from >= self.num_steps or not self.eval_every
                           or self.late_from % self.eval_every):
      raise ValueError(f"late_from={self.late_from} must be an evaluated step below "
                       f"num_steps={self.num_steps} (a multiple of eval_every="
                       f"{self.eval_every})")
    if self.deoscillation and recipe.forward.rhs is None:
      raise ValueError(f"deoscillation needs a recipe that quantizes the forward "
                       f"weight, got {self.recipe!r}")

  @property
  def option_list(self) -> tuple[str, ...]:
    return tuple(o for o in (p.strip() for p in self.recipe_options.split(",")) if o)

  def build_recipe(self) -> recipes_lib.Recipe:
    """The base recipe with the options applied (in RECIPE_OPTIONS order)."""
    if self.recipe == "fp32":
      raise ValueError("ALTO's unquantized baseline is bf16 (its ablations quantize from "
                       "bf16), not fp32")
    recipe = recipes_lib.get(self.recipe)
    options = self.option_list
    if "dge" in options:
      recipe = recipes_lib.with_dge(recipe, self.dge_k, self.dge_clamp)
    if "static_clip" in options:
      recipe = recipes_lib.with_static_clipping(recipe, self.static_clip_factor)
    if "dynamic_clip" in options:
      recipe = recipes_lib.with_dynamic_clipping(recipe)
    if "macro_block" in options:
      recipe = recipes_lib.with_macro_blocks(recipe, self.macro_block)
    return recipe

  def model_recipe(self) -> recipes_lib.Recipe:
    return self.build_recipe()

  def transformer_config(self, vocab_size: int) -> TransformerConfig:
    return dataclasses.replace(super().transformer_config(vocab_size),
                               compensation_rank=self.compensation_rank)

  def curve_metrics(self, workdir: str) -> dict[str, float]:
    """``eval/steps_to_target`` and ``eval/target_reached`` (with ``target_loss``) and
    ``eval/late_gain`` (with ``late_from``), from the logged ``eval/loss`` curve."""
    if not (self.target_loss or self.late_from):
      return {}
    curve = read_scalars(workdir).get("eval/loss", [])
    metrics = {}
    if self.target_loss:
      steps = curves.steps_to_target(curve, self.target_loss)
      metrics["eval/target_reached"] = float(steps is not None)
      metrics["eval/steps_to_target"] = float(self.num_steps if steps is None else steps)
    if self.late_from:
      metrics["eval/late_gain"] = (curves.value_at(curve, self.late_from)
                                   - curves.value_at(curve, self.num_steps))
    return metrics

  def optimizer(self) -> optax.GradientTransformation:
    """AdamW, preceded by the DGE statistics (a dge run: they read the gradients as
    the backward produced them) and followed by de-oscillation (when on)."""
    parts = [lm_trainer.make_optimizer(self)]
    recipe = self.build_recipe()
    if recipe.dge_k is not None:
      stats = dge_statistics(functools.partial(qdot.dge_factor, recipe), recipe.dge_clamp)
      parts.insert(0, optax.masked(stats, quantized_weight_mask))
    if self.deoscillation:
      deosc = deoscillate(qdot.forward_weight_quantizer(recipe), period=self.deosc_period,
                          ratio=self.deosc_ratio, start_step=self.deosc_start)
      parts.append(optax.masked(deosc, quantized_weight_mask))
    return parts[0] if len(parts) == 1 else optax.chain(*parts)

  def optimizer_metrics(self, opt_state: Any) -> dict[str, jax.Array]:
    """``deosc/snapped`` (de-oscillation) and ``dge/<statistic>`` (a dge recipe:
    :mod:`numerics.optim.dge_statistics`), per step."""
    kinds = (DeoscillationState, DGEStatisticsState)
    states = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, kinds))
              if isinstance(s, kinds)]
    metrics = {}
    for s in states:
      if isinstance(s, DeoscillationState):
        metrics["deosc/snapped"] = s.snapped
      else:
        metrics.update({f"dge/{k}": v for k, v in s._asdict().items()})
    return metrics


def quantized_weight_mask(params: Any) -> Any:
  """True on the weights the recipe quantizes: the blocks' projection kernels and the
  expert weights; False on embeddings, norms, the router and the LM head."""

  def quantized(path, _):
    names = [tree_paths.key_name(k) for k in path]
    in_block = names[0].startswith("block_")
    return in_block and "router" not in names and names[-1] in ("kernel", "w_in", "w_out")

  return jax.tree_util.tree_map_with_path(quantized, params)


def train_and_evaluate(config: AltoConfig, options: RunOptions) -> dict[str, Any]:
  """Trains and evaluates one ALTO run; returns its summary (see
  experiments.common.trainers.lm_trainer)."""
  return lm_trainer.train_and_evaluate(config, options, experiment=EXPERIMENT)
