"""The RL run's configuration and the hooks an experiment on the shared loop overrides.

GRPO on multi-digit addition (:mod:`experiments.common.data.arithmetic_task`) from a
supervised warm start, with the sampler as an explicit, versioned copy of the learner's
weights (:mod:`numerics.rl.sampler_copy`) refreshed every ``refresh_interval`` updates.
:class:`RLConfig` holds every field; its hooks (``learner_model``, ``sampler_model``,
``optimizer``, ``exporter``, ``initial_master``, ``loss_params``, ``sync_monitor``,
``summary_metrics``) are what Pan's, Fair Cast's and MXFP8 RL's configs change.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from experiments.common.data import arithmetic_task as task
from experiments.common.harness.config_flags import SEED_DOMAIN, check_fields, config_field
from experiments.common.harness.train_loop import periodic_field
from lowprec.models import sampling
from lowprec.models.transformer import DecoderLM, TransformerConfig
from lowprec.numerics.rl import importance
from lowprec.numerics.rl import policy_loss
from lowprec.numerics.rl import sampler_copy

RATIO_AGAINST = ("sampler", "learner")


@dataclasses.dataclass(frozen=True)
class RLConfig:
  """Everything that defines an RL run's result (its flags; written to config.json).

  The methods after the fields are hooks that the experiments on this loop override
  (:mod:`experiments.fair_cast`, :mod:`experiments.mxfp8_rl`); the loop calls nothing
  else of the config.
  """

  seed: int = config_field(0, "RL seed: problems, sampling and per-update keys.",
                           domain=SEED_DOMAIN)
  digits: int = config_field(3, "Digits per addend.", domain="[1, 9]")
  d_model: int = config_field(64, "Model width.", domain="[1, inf)")
  num_layers: int = config_field(2, "Transformer blocks.", domain="[1, inf)")
  num_heads: int = config_field(4, "Attention heads.", domain="[1, inf)")
  d_ff: int = config_field(256, "Feed-forward hidden width.", domain="[1, inf)")
  pretrain_seed: int = config_field(0, "Seed of the supervised warm start (shared by arms).",
                                    domain=SEED_DOMAIN)
  warm_start_per_seed: bool = config_field(
      False, "Seed the warm start (and its held-out evaluation problems) with the run's "
      "seed, so each seed starts from its own policy; pretrain_seed must then stay 0.")
  pretrain_steps: int = config_field(
      1200, "Supervised steps before RL (3 digits: ~43% greedy accuracy).",
      domain="[0, inf)")
  pretrain_target_accuracy: float = config_field(
      0.0, "Stop the warm start once its greedy accuracy on its own held-out problems "
      "reaches this (0: always pretrain_steps).", domain="[0, 1]")
  pretrain_check_every: int = config_field(
      50, "Steps between the warm start's accuracy checks (with a target).",
      domain="[1, inf)")
  pretrain_batch: int = config_field(64, "Supervised batch size.", domain="[1, inf)")
  pretrain_lr: float = config_field(3e-3, "Supervised AdamW learning rate.", domain="(0, inf)")
  pretrain_dir: str = config_field("runs/stale_sampler/pretrain",
                                   "Cache of warm-start weights (by config hash).")
  num_updates: int = config_field(96, "GRPO learner updates.", domain="[1, inf)")
  prompts_per_update: int = config_field(16, "Problems per update.", domain="[1, inf)")
  group_size: int = config_field(8, "Samples per problem (the GRPO group).", domain="[2, inf)")
  learning_rate: float = config_field(1e-4, "Learner Adam learning rate (constant).",
                                      domain="(0, inf)")
  refresh_interval: int = config_field(8, "Sync the sampler every K learner updates.",
                                       domain="[1, inf)")
  sampling_stream: int = config_field(
      0, "Stream of the rollout keys: runs with the same (seed, update) but different "
      "streams draw independent samples (same problems, same warm start).",
      domain="[0, inf)")
  sampler_temperature: float = config_field(1.0, "Sampler temperature (cooling: < 1).",
                                            domain="(0, inf)")
  sampler_top_k: int = config_field(0, "Sampler top-k (0: off).", domain="[0, inf)")
  sampler_top_p: float = config_field(1.0, "Sampler nucleus top-p (1: off).", domain="(0, 1]")
  sampler_dtype: str = config_field("float32", "Sampler weight precision.",
                                    choices=("float32", "bfloat16"))
  is_method: str = config_field("token_tis", "Importance correction.",
                                choices=importance.METHODS)
  is_cap: float = config_field(2.0, "TIS truncation C.", domain="(0, inf)")
  is_lo: float = config_field(0.5, "Masked IS / IcePop lower bound.", domain="[0, inf)")
  is_hi: float = config_field(2.0, "Masked IS / IcePop upper bound.", domain="(0, inf)")
  ratio_against: str = config_field(
      "learner", "PPO ratio denominator: 'learner' (its own current log-probs: r = 1 "
      "in value, the IS weight is the correction) or 'sampler' (the recorded "
      "behaviour log-probs, r = pi / mu clipped).", choices=RATIO_AGAINST)
  clip_eps: float = config_field(0.2, "PPO clip epsilon.", domain="(0, inf)")
  normalization: str = config_field("token", "Loss normaliser.",
                                    choices=policy_loss.NORMALIZATIONS)
  log_every: int = periodic_field("log_every", 1, unit="update", domain="[1, inf)")
  eval_every: int = periodic_field("eval_every", 8, unit="update", domain="[1, inf)")
  eval_problems: int = config_field(256, "Held-out problems per evaluation.", domain="[1, inf)")
  checkpoint_every: int = periodic_field("checkpoint_every", 0, unit="update")
  progress_every_s: float = periodic_field("progress_every_s", 10.0)

  def __post_init__(self):
    check_fields(self)  # every field in its declared domain
    for name in ("num_updates", "prompts_per_update", "refresh_interval", "eval_problems",
                 "pretrain_batch", "log_every", "eval_every"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
    if self.checkpoint_every < 0:
      raise ValueError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
    if self.group_size < 2:
      raise ValueError(f"group_size must be >= 2 (GRPO), got {self.group_size}")
    if self.pretrain_steps < 0:
      raise ValueError(f"pretrain_steps must be >= 0, got {self.pretrain_steps}")
    if self.warm_start_per_seed and self.pretrain_seed != 0:
      raise ValueError(f"pretrain_seed={self.pretrain_seed} conflicts with "
                       "warm_start_per_seed=True (the warm start's seed is the run's seed)")
    self.correction()  # an unknown method or out-of-range numbers fail here
    if self.is_method != "none" and self.ratio_against == "sampler":
      raise ValueError("an IS weight with the ratio against the sampler corrects twice; "
                       "use ratio_against='learner'")
    sampling.processed_log_probs(jnp.zeros(2), self.sampler_temperature,
                                 self.sampler_top_k, self.sampler_top_p)

  def correction(self) -> importance.Correction:
    """The importance-sampling correction ``is_method`` names, with its numbers."""
    return importance.correction(self.is_method, cap=self.is_cap, lo=self.is_lo,
                                 hi=self.is_hi)

  @property
  def warm_start_seed(self) -> int:
    """The seed of the warm start and of its held-out evaluation problems."""
    return self.seed if self.warm_start_per_seed else self.pretrain_seed

  @property
  def sampler_kwargs(self) -> dict[str, Any]:
    return dict(temperature=self.sampler_temperature, top_k=self.sampler_top_k,
                top_p=self.sampler_top_p)

  # Hooks: subclasses (fair_cast, mxfp8_rl) override these; the loop calls nothing else.

  def learner_model(self) -> DecoderLM:
    """The model the learner trains and evaluates (float32 GEMMs)."""
    return make_model(self)

  def sampler_model(self) -> DecoderLM:
    """The model the sampler runs on its served weights (upcast to float32 first)."""
    return make_model(self)

  def optimizer(self) -> optax.GradientTransformation:
    return optax.adam(self.learning_rate)

  def exporter(self) -> "Exporter":
    """How a sync turns the learner's weights into the sampler's served copy."""
    return cast_exporter(self.sampler_dtype)

  def initial_master(self, params: Any) -> Any:
    """The learner's weights at update 0, from the warm start's."""
    return params

  def loss_params(self, master: Any, served: Any) -> Any:
    """The weights the policy loss is computed on (gradients reach ``master``)."""
    del served
    return master

  def sync_monitor(self) -> "SyncMonitor | None":
    """Host-side checks and metrics run at every sync (None: nothing beyond the loop's)."""
    return None

  def summary_metrics(self, scalars: dict[str, list[tuple[int, float]]], done: int
                      ) -> dict[str, float]:
    """Extra results-row metrics from the run's logged curves (``tag -> [(update,
    value)]``, read back from its events, so a resumed run's too) after ``done``
    updates; the claims of a sweep are decided on results-row metrics."""
    del scalars, done
    return {}


def curve_mean(curve: list[tuple[int, float]], after: float = 0) -> float:
  """Mean of a logged curve's values at steps ``> after`` (NaN when there are none)."""
  values = [v for step, v in curve if step > after]
  return sum(values) / len(values) if values else float("nan")


class Exporter(NamedTuple):
  """Learner weights -> served copy at a sync.

  ``init(master) -> state`` (a pytree of arrays, checkpointed with the run);
  ``export(master, state, key) -> (served, state)``, jit-compatible, with ``key`` a
  function of (seed, update) so a resumed run exports the same bits.
  """

  init: Callable[[Any], Any]
  export: Callable[[Any, Any, jax.Array], tuple[Any, Any]]


def stateless_exporter(export: sampler_copy.Export) -> Exporter:
  """An :class:`Exporter` for a plain ``params -> served`` function (no state, no key)."""
  return Exporter(init=lambda master: (),
                  export=lambda master, state, key: (export(master), state))


def cast_exporter(dtype: Any) -> Exporter:
  """A stateless export that casts every floating leaf to ``dtype`` (nearest even)."""
  return stateless_exporter(sampler_copy.cast_export(dtype))


class SyncMonitor(NamedTuple):
  """Host-side work at every sync, e.g. weight-sync checks that raise on failure.

  ``on_sync(update, master, previous, current) -> {tag: float}``: ``previous`` is the
  sampler copy before the sync (None at the first), ``current`` after it. Its state
  lives on the host and restarts when a run is resumed.
  """

  on_sync: Callable[[int, Any, Any, Any], dict[str, float]]


def make_model(config: RLConfig) -> DecoderLM:
  length = task.prompt_length(config.digits) + task.answer_length(config.digits)
  return DecoderLM(TransformerConfig(
      vocab_size=task.VOCAB_SIZE, d_model=config.d_model, num_layers=config.num_layers,
      num_heads=config.num_heads, d_ff=config.d_ff, max_len=length))
