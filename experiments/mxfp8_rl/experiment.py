"""MXFP8 RL in miniature: learner and sampler each in a recipe, checked at every sync.

    python -m experiments.mxfp8_rl --learner_recipe=mxfp8 --sampler_recipe=mxfp8
    python -m experiments.mxfp8_rl --learner_recipe=bf16 --sampler_recipe=mxfp8

GRPO on 3-digit addition (the shared RL loop of :mod:`experiments.common.rl.loop`). The learner
trains float32 masters under ``learner_recipe`` (its projections quantized, as
:func:`experiments.common.recipe_flag.model_rules`: the attention products
and the LM head stay bf16). At every sync the weights are exported the way a serving
engine loads them for ``sampler_recipe``: the block projections' kernels quantized on
the fly (MXFP8: 1 x 32 blocks along the contraction axis, E8M0 scales, RCEIL, the axis
zero-padded to a multiple of 32 -- :func:`numerics.rl.serving.served_mx_weight`;
stored as bf16, which holds every MXFP8 value exactly), the layers named by
``keep_bf16`` in bf16 and those named by ``keep_fp32`` (embeddings, norms) in float32.

Every sync runs the seven checks of :func:`numerics.rl.weight_sync.run_sync_checks`
(coverage, layer plan, bit-exact export, version, probe-batch log-prob parity within
the recipe pair's tolerance, finite values and MX scales, padding invariance) and
raises on the first failure; their metrics are logged under ``sync/``. The models'
``max_len`` is 32 (the warm start's position table zero-extended), so the padding check
can pad the probe sequences to the MX block.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from experiments.common import arithmetic_task as task
from experiments.common import recipe_flag
from experiments.common.config_flags import config_field
from experiments.common.rl import config as rl_config
from experiments.common.rl import loop
from experiments.common.run_options import RunOptions
from models import sampling
from models.transformer import DecoderLM, TransformerConfig
from numerics import tree_paths
from numerics.blockscale import MX_BLOCK
from numerics.rl import parity_tolerances
from numerics.rl import serving
from numerics.rl import weight_sync

EXPERIMENT = "mxfp8_rl"
RECIPES = ("bf16", "mxfp8")
MAX_LEN = MX_BLOCK
SERVED_DTYPES = {"mxfp8": jnp.bfloat16, "bf16": jnp.bfloat16, "fp32": jnp.float32}


def _patterns(text: str) -> tuple[str, ...]:
  return tuple(p.strip() for p in text.split(",") if p.strip())


@dataclasses.dataclass(frozen=True)
class MXFP8RLConfig(rl_config.RLConfig):
  """The RL run of :class:`StaleSamplerConfig` with a recipe on each side."""

  refresh_interval: int = config_field(1, "Sync the sampler every K updates.",
                                       domain="[1, inf)")
  learning_rate: float = config_field(3e-4, "Learner Adam learning rate (constant).",
                                      domain="(0, inf)")
  learner_recipe: str = config_field("mxfp8", "Learner training recipe.", choices=RECIPES)
  sampler_recipe: str = config_field("mxfp8", "Sampler serving recipe.", choices=RECIPES)
  keep_bf16: str = config_field("head/*", "Comma list of globs served in bf16.")
  keep_fp32: str = config_field("embed/*,pos_embed,*norm*",
                                "Comma list of globs served in float32.")
  sampler_keep_bf16: str = config_field(
      "", "The bf16 list as the sampler resolves it (empty: keep_bf16); a different "
      "list is the fused-name failure the layer-plan check catches.")
  probe_problems: int = config_field(16, "Problems in the fixed parity probe batch.",
                                     domain="[1, inf)")
  padding_atol: float = config_field(
      0.1, "Padding check: largest change of a real position's logit when the probe "
      "is padded to the MX block. Not 0: XLA:CPU compiles the longer sequence into "
      "GEMMs with another accumulation order, and bf16 and mxfp8 samplers moved "
      "logits by up to 0.0125 that way (measured in the mxfp8_rl sweep); a scale over "
      "pad tokens moves them by far more.", domain="[0, inf)")
  cross_k3_tolerance: float = config_field(
      0.5, "Parity check: largest probe k3 between different recipes (10x NeMo-RL's "
      "MXFP8 gate of 0.05, which the bf16-learner / mxfp8-sampler pair crossed here).",
                                           domain="(0, inf)")
  cross_max_dlogp_tolerance: float = config_field(
      5.0, "Parity check: largest probe max |delta logp| between different recipes.",
                                                  domain="(0, inf)")

  def __post_init__(self):
    super().__post_init__()
    if self.sampler_dtype != "float32":
      raise ValueError("mxfp8_rl serves --sampler_recipe; leave --sampler_dtype at float32")
    for name in ("learner_recipe", "sampler_recipe"):
      if getattr(self, name) not in RECIPES:
        raise ValueError(f"{name} must be one of {RECIPES}, got {getattr(self, name)!r}")
    if (self.learner_recipe, self.sampler_recipe) not in parity_tolerances.PARITY_TOLERANCES:
      raise ValueError(f"no parity tolerance for {self.pair}")
    if not (self.cross_k3_tolerance > 0 and self.cross_max_dlogp_tolerance > 0):
      raise ValueError("parity tolerances must be > 0")
    if self.padding_atol < 0:
      raise ValueError(f"padding_atol must be >= 0, got {self.padding_atol}")
    if self.probe_problems < 1:
      raise ValueError(f"probe_problems must be >= 1, got {self.probe_problems}")
    if task.prompt_length(self.digits) + task.answer_length(self.digits) > MAX_LEN:
      raise ValueError(f"digits={self.digits} makes sequences longer than {MAX_LEN}")

  @property
  def pair(self) -> tuple[str, str]:
    return (self.learner_recipe, self.sampler_recipe)

  @property
  def parity_tolerances(self) -> dict[tuple[str, str], parity_tolerances.Tolerance]:
    """weight_sync's table with this run's cross-recipe tolerances.

    Its cross-recipe entries were measured on a random-init model; on the trained
    warm start, bf16 learner / mxfp8 sampler probe log-probs differed by k3 0.003 to
    0.054 and max |delta logp| up to 1.6 within 35 updates (measured), so the cross
    pairs use a looser gate here, meant for gross failures (wrong weights); it cannot
    catch a few updates of staleness, which is as large as the precision gap.
    Same-recipe pairs stay exact: any difference there is a sync bug.
    """
    cross = parity_tolerances.Tolerance(self.cross_k3_tolerance, self.cross_max_dlogp_tolerance)
    return {pair: (tol if pair[0] == pair[1] else cross)
            for pair, tol in parity_tolerances.PARITY_TOLERANCES.items()}

  def _model(self, recipe: str) -> DecoderLM:
    return recipe_flag.quantized_model(DecoderLM(TransformerConfig(
        vocab_size=task.VOCAB_SIZE, d_model=self.d_model, num_layers=self.num_layers,
        num_heads=self.num_heads, d_ff=self.d_ff, max_len=MAX_LEN)), recipe)

  def learner_model(self) -> DecoderLM:
    return self._model(self.learner_recipe)

  def sampler_model(self) -> DecoderLM:
    return self._model(self.sampler_recipe)

  def initial_master(self, params: Any) -> Any:
    pos = params["pos_embed"]  # zero rows past the warm start's length: never read
    return {**params, "pos_embed": jnp.pad(pos, ((0, MAX_LEN - pos.shape[0]), (0, 0)))}

  def served_plan(self, params: Any, keep_bf16: str | None = None) -> dict[str, str]:
    """``{path: recipe}`` of the served copy (:func:`serving.resolve_layer_plan`)."""
    return serving.resolve_layer_plan(
        params, self.sampler_recipe, _patterns(self.keep_bf16 if keep_bf16 is None
                                               else keep_bf16),
        keep_fp32=_patterns(self.keep_fp32))

  def serve(self, params: Any) -> Any:
    """The served copy of ``params`` under :meth:`served_plan` (jit-compatible)."""
    plan = self.served_plan(params)

    def one(path, w):
      recipe = plan[tree_paths.path_name(path)]
      if recipe == "mxfp8":
        return serving.served_mx_weight(w, axis=0).astype(jnp.bfloat16)
      return w.astype(SERVED_DTYPES[recipe])

    return jax.tree_util.tree_map_with_path(one, params)

  def exporter(self) -> rl_config.Exporter:
    return rl_config.stateless_exporter(self.serve)

  def sync_monitor(self) -> rl_config.SyncMonitor:
    return SyncChecks(self).monitor()


class SyncChecks:
  """Runs :func:`weight_sync.run_sync_checks` at every sync on a fixed probe batch."""

  def __init__(self, config: MXFP8RLConfig):
    self.config = config
    learner, sampler = config.learner_model(), config.sampler_model()
    key = jax.random.PRNGKey(0)
    self.prompt_len = task.prompt_length(config.digits)
    batch = task.supervised_batch(seed=config.warm_start_seed + 30_000, position=0,
                                  batch_size=config.probe_problems, digits=config.digits)
    # The probe: prompts followed by their right answers (teacher-forced).
    self.tokens = jnp.concatenate([batch["inputs"], batch["targets"][:, -1:]], axis=1)
    self.mask = jnp.ones((config.probe_problems, self.tokens.shape[1] - self.prompt_len))
    to32 = lambda p: jax.tree.map(lambda x: x.astype(jnp.float32), p)
    self.learner_logp = jax.jit(lambda p: sampling.sequence_log_probs(
        lambda q, t, k: learner.apply({"params": q}, t, k), p, self.tokens,
        self.prompt_len, key))
    self.sampler_logp = jax.jit(lambda s: sampling.sequence_log_probs(
        lambda q, t, k: sampler.apply({"params": to32(q)}, t, k), s, self.tokens,
        self.prompt_len, key))
    self.logits = jax.jit(lambda s, t: sampler.apply({"params": to32(s)}, t, key))
    self.export = jax.jit(config.serve)

  def monitor(self) -> rl_config.SyncMonitor:
    return rl_config.SyncMonitor(on_sync=self.on_sync)

  def on_sync(self, update: int, master: Any, previous: Any, current: Any
              ) -> dict[str, float]:
    c = self.config
    sampler_keep = c.sampler_keep_bf16 or c.keep_bf16
    return weight_sync.run_sync_checks(
        master, previous, current, update, export=self.export,
        learner_plan=c.served_plan(master), served_plan=c.served_plan(master, sampler_keep),
        expected_dtypes=SERVED_DTYPES, learner_logp_fn=self.learner_logp,
        sampler_logp_fn=self.sampler_logp, mask=self.mask, pair=c.pair,
        logits_fn=self.logits, probe_tokens=self.tokens[:, :-1],
        tolerances=c.parity_tolerances, padding_atol=c.padding_atol)


def train_and_evaluate(config: MXFP8RLConfig, options: RunOptions) -> dict[str, Any]:
  """One mxfp8_rl run (the shared RL loop under this experiment's name)."""
  return loop.train_and_evaluate(config, options, experiment=EXPERIMENT)
