"""ScaleRLT in miniature: GRPO on a looped LM, learner log-probs dense or replayed.

    python -m experiments.looped_rl --recipe=bf16 --learner_logp=dense
    python -m experiments.looped_rl --recipe=bf16 --learner_logp=replay

The policy is a :class:`models.looped.LoopedLM` (one shared block applied up to
``max_loops`` times, Ouro's exit gate with ``threshold``), warm-started with
supervision on 3-digit addition (:mod:`experiments.looped_rl.warm_start`, one base per
``seed``). Every update:

1. the rollout engine samples ``group_size`` answers to each of ``prompts_per_update``
   fresh problems on the *deferred* path (:func:`models.looped.rollout`: a prefill,
   then one token per step with per-loop KV caches stored as ``rollout_kv``), with
   the model's projections in ``recipe``, recording each token's log-prob (the
   behaviour log-probs) and each position's depth;
2. the learner recomputes the log-probs of the same tokens in the same recipe, either
   ``dense`` (:func:`models.looped.dense_log_probs`: one whole-sequence pass at the
   recorded depths) or ``replay`` (ScaleRLT's hybrid,
   ``sg(deferred replay) + dense - sg(dense)`` = :func:`models.looped.replay_log_probs`:
   the rollout's values bit for bit, the dense pass's gradient);
3. one Adam step on the GRPO loss (:func:`numerics.rl.policy_loss.grpo_loss`, no
   importance weight, PPO ratio ``r = exp(learner - behaviour)`` clipped at
   ``1 +- clip_eps``, group advantages, token-mean normaliser). The learner is
   on-policy (the rollout used the current weights), so ``r`` is 1 in exact
   arithmetic: whatever differs from 1 is the numerics of the two paths.

Both arms compute both log-probs and log the same diagnostics: ``train/max_abs_log_ratio``
and ``train/ratio_not_one_frac`` of the ratio the loss used, ``train/ppo_clip_frac``,
the dense-vs-deferred mismatch (``train/dense_mismatch_k3``,
``train/dense_max_abs_dlogp``) and whether the replay equalled the rollout bit for bit
(``train/replay_exact``; a replay arm raises if it ever does not). Summaries:
``reward/mean_over_training``, ``reward/last_quarter``, ``ratio/clip_frac_mean``,
``ratio/max_abs_log_ratio`` and ``ratio/not_one_frac_mean`` over all updates,
``mismatch/dense_k3_mean`` and ``mismatch/dense_max_abs_dlogp``.
``eval/greedy_accuracy``: greedy decoding on the deferred path (the arm's recipe and
cache) on fixed held-out problems.

Keys: the rollout of update ``u`` uses ``fold_in(PRNGKey(seed), u)`` (the replay reuses
it); the dense pass ``PRNGKey(0)`` (the recipes here are deterministic). Problems are
a pure function of ``(seed, update)``, so ``--resume`` continues bit for bit.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.common.data import arithmetic_task as task
from experiments.common.trainers import recipe_flag
from experiments.common.harness.checkpoint import Snapshot
from experiments.common.harness.config_flags import SEED_DOMAIN, check_fields, config_field
from experiments.common.evidence.results import loop_metrics, run_summary
from experiments.common.trainers.rl import harness_checks
from experiments.common.harness import run as run_lib
from experiments.common.harness.run_options import RunOptions, resolve_run_options
from experiments.common.harness.train_loop import periodic_field, run_loop
from experiments.looped_rl import warm_start as warm_start_lib
from lowprec.models import looped, quantization
from lowprec.models.transformer import TransformerConfig
from lowprec.numerics import kv_quant
from lowprec.numerics.rl import advantages as advantages_lib
from lowprec.numerics.rl import importance
from lowprec.numerics.rl import policy_loss
from lowprec.numerics.rl.mismatch import mismatch_kl

EXPERIMENT = "looped_rl"
RECIPES = ("fp32", "bf16", "mxfp8")
LEARNER_LOGPS = ("dense", "replay")
# The rollout's cache formats: fp32/bf16 elements, or MXFP8 (e4m3, E8M0 scale per 16
# elements along the head dim: the head dim is 16).
ROLLOUT_KV = {"fp32": kv_quant.KVQuantSpec(), "bf16": kv_quant.KVQuantSpec("bf16"),
              "mxfp8": kv_quant.KVQuantSpec("e4m3", "block", block_size=16)}
EVAL_STREAM = 20_000


@dataclasses.dataclass(frozen=True)
class LoopedRLConfig:
  """Everything that defines a run's result (its flags; written to config.json)."""

  seed: int = config_field(0, "Seed of the warm start (one base per seed), the problems "
                           "and the rollout keys.", domain=SEED_DOMAIN)
  recipe: str = config_field("fp32", "Precision of the projections (rollout and learner "
                             "alike); attention products and head stay bf16 unless fp32.",
                             choices=RECIPES)
  rollout_kv: str = config_field("fp32", "How the rollout's KV caches store keys and "
                                 "values.", choices=tuple(ROLLOUT_KV))
  learner_logp: str = config_field("dense", "The learner's log-probs: the dense pass, or "
                                   "ScaleRLT's replay (hybrid).", choices=LEARNER_LOGPS)
  digits: int = config_field(3, "Digits per addend.", domain="[1, 9]")
  d_model: int = config_field(64, "Model width.", domain="[1, inf)")
  num_layers: int = config_field(1, "Blocks in the shared stack.", domain="[1, inf)")
  num_heads: int = config_field(4, "Attention heads.", domain="[1, inf)")
  d_ff: int = config_field(256, "Feed-forward hidden width.", domain="[1, inf)")
  max_loops: int = config_field(3, "Applications of the shared stack (R).",
                                domain="[1, inf)")
  threshold: float = config_field(0.5, "Exit once the exit CDF reaches this.",
                                  domain="(0, 1]")
  pretrain_steps: int = config_field(1200, "Supervised warm-start steps.", domain="[0, inf)")
  pretrain_batch: int = config_field(64, "Warm-start batch size.", domain="[1, inf)")
  pretrain_lr: float = config_field(3e-3, "Warm-start AdamW learning rate.",
                                    domain="(0, inf)")
  pretrain_dir: str = config_field("runs/looped_rl/pretrain",
                                   "Cache of warm-start weights (by config hash).")
  num_updates: int = config_field(64, "GRPO updates.", domain="[1, inf)")
  prompts_per_update: int = config_field(16, "Problems per update.", domain="[1, inf)")
  group_size: int = config_field(8, "Samples per problem (the GRPO group).",
                                 domain="[2, inf)")
  learning_rate: float = config_field(3e-4, "Adam learning rate (constant).",
                                      domain="(0, inf)")
  temperature: float = config_field(1.0, "Rollout temperature (the learner's "
                                    "log-probs use the same).", domain="(0, inf)")
  clip_eps: float = config_field(0.2, "PPO clip epsilon.", domain="(0, 1)")
  log_every: int = periodic_field("log_every", 1, unit="update", domain="[1, inf)")
  eval_every: int = periodic_field("eval_every", 16, unit="update", domain="[1, inf)")
  eval_problems: int = config_field(256, "Held-out problems per evaluation.",
                                    domain="[1, inf)")
  checkpoint_every: int = periodic_field("checkpoint_every", 0, unit="update")
  progress_every_s: float = periodic_field("progress_every_s", 10.0)

  def __post_init__(self):
    check_fields(self)
    if self.d_model % self.num_heads:
      raise ValueError(f"d_model={self.d_model} is not divisible by num_heads="
                       f"{self.num_heads}")
    spec = ROLLOUT_KV[self.rollout_kv]
    if spec.is_mx and (self.d_model // self.num_heads) % spec.mx_block:
      raise ValueError(f"rollout_kv={self.rollout_kv!r} needs a head dim divisible by "
                       f"{spec.mx_block}, got {self.d_model // self.num_heads}")

  @property
  def kv_spec(self) -> kv_quant.KVQuantSpec:
    return ROLLOUT_KV[self.rollout_kv]

  def model(self, recipe: str | None = None) -> looped.LoopedLM:
    """The looped LM quantized by ``recipe`` (default: the run's) with
    :func:`experiments.common.trainers.recipe_flag.looped_rules`."""
    length = task.prompt_length(self.digits) + task.answer_length(self.digits)
    plain = looped.LoopedLM(
        TransformerConfig(vocab_size=task.VOCAB_SIZE, d_model=self.d_model,
                          num_layers=self.num_layers, num_heads=self.num_heads,
                          d_ff=self.d_ff, max_len=length),
        looped.LoopConfig(self.max_loops, "threshold", self.threshold))
    return quantization.quantize_model(
        plain, recipe_flag.looped_rules(self.recipe if recipe is None else recipe))

  def warm_start_fields(self) -> dict[str, Any]:
    keys = ("digits", "d_model", "num_layers", "num_heads", "d_ff", "max_loops",
            "threshold", "seed", "pretrain_steps", "pretrain_batch", "pretrain_lr")
    return {k: getattr(self, k) for k in keys}


class LoopedRLState(NamedTuple):
  """The checkpointed state: the learner and per-update summaries (float32[num_updates],
  filled as updates run)."""

  params: Any
  opt_state: Any
  rewards: jax.Array
  clip_fracs: jax.Array
  max_abs_log_ratios: jax.Array
  not_one_fracs: jax.Array
  dense_k3s: jax.Array
  dense_max_dlogps: jax.Array


def learner_log_probs(config: LoopedRLConfig, model: looped.LoopedLM, params: Any,
                      tokens: jax.Array, depth: jax.Array, rollout_key: jax.Array
                      ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(the loss's log-probs, the deferred replay's, the dense pass's), each [B, N].

  ``replay`` arms use :func:`models.looped.hybrid` of the two, which is
  :func:`models.looped.replay_log_probs` written out so both values can be logged.
  """
  prompt_len = task.prompt_length(config.digits)
  replay = looped.deferred_log_probs(model, jax.lax.stop_gradient(params), tokens,
                                     prompt_len, depth, rollout_key,
                                     key_spec=config.kv_spec,
                                     temperature=config.temperature)
  dense = looped.dense_log_probs(model, params, tokens, prompt_len, depth,
                                 jax.random.PRNGKey(0), temperature=config.temperature)
  used = looped.hybrid(replay, dense) if config.learner_logp == "replay" else dense
  return used, jax.lax.stop_gradient(replay), jax.lax.stop_gradient(dense)


def train_and_evaluate(config: LoopedRLConfig, options: RunOptions) -> dict[str, Any]:
  """The warm start, then ``num_updates`` GRPO updates; returns the run's summary."""
  options = resolve_run_options(options, EXPERIMENT, config)
  t0 = time.time()
  model = config.model()
  warm, warm_path = warm_start_lib.warm_start(
      config.model("fp32"), config.warm_start_fields(), seed=config.seed,
      steps=config.pretrain_steps, batch=config.pretrain_batch, lr=config.pretrain_lr,
      digits=config.digits, cache_dir=config.pretrain_dir)
  optimizer = optax.adam(config.learning_rate)
  prompt_len, num_new = task.prompt_length(config.digits), task.answer_length(config.digits)
  key = jax.random.PRNGKey(config.seed)
  n = config.num_updates

  eval_set = task.problems(seed=EVAL_STREAM + config.seed, position=1,
                           batch_size=config.eval_problems, digits=config.digits)

  @jax.jit
  def greedy(params):
    return looped.rollout(model, params, jnp.asarray(eval_set["prompts"]), num_new,
                          jax.random.PRNGKey(0), key_spec=config.kv_spec, top_k=1).tokens

  def evaluate(params) -> dict[str, float]:
    out = np.asarray(greedy(params))[:, prompt_len:]
    return {"greedy_accuracy": float(task.rewards(out, eval_set["answers"]).mean())}

  warm_info = evaluate(warm)

  @jax.jit
  def draw(params, prompts, rollout_key):
    return looped.rollout(model, params, prompts, num_new, rollout_key,
                          key_spec=config.kv_spec, temperature=config.temperature)

  def loss_fn(p, tokens, depth, behaviour, adv, mask, rollout_key):
    used, replay, dense = learner_log_probs(config, model, p, tokens, depth, rollout_key)
    loss, metrics = policy_loss.grpo_loss(
        used, behaviour, adv, mask, correction=importance.NoCorrection(),
        clip_eps=config.clip_eps, normalization=policy_loss.TokenMean())
    log_ratio = jnp.where(mask > 0, jax.lax.stop_gradient(used) - behaviour, 0.0)
    dense_mm = mismatch_kl(dense, behaviour, mask)
    metrics.update(
        max_abs_log_ratio=jnp.max(jnp.abs(log_ratio)),
        ratio_not_one_frac=jnp.sum((log_ratio != 0) * mask) / jnp.maximum(jnp.sum(mask), 1),
        dense_mismatch_k3=dense_mm["k3"], dense_max_abs_dlogp=dense_mm["max_abs_delta_logp"],
        replay_exact=jnp.all(jnp.where(mask > 0, replay == behaviour, True)).astype(
            jnp.float32))
    return loss, metrics

  @jax.jit
  def learner_update(p, opt_state, tokens, depth, behaviour, adv, mask, rollout_key):
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        p, tokens, depth, behaviour, adv, mask, rollout_key)
    updates, opt_state = optimizer.update(grads, opt_state, p)
    metrics["grad_norm"] = optax.tree.norm(grads)
    return optax.apply_updates(p, updates), opt_state, metrics

  def fresh() -> Snapshot:
    zeros = jnp.zeros((n,), jnp.float32)
    return Snapshot(LoopedRLState(warm, optimizer.init(warm), *([zeros] * 6)), key, 0, 0)

  with run_lib.open_run(EXPERIMENT, config, options) as run:
    start = run.restore(fresh, metadata={"warm_start": warm_info,
                                         "warm_start_file": warm_path})
    seen = {harness_checks.batch_fingerprint(
        task.problems(seed=config.seed, position=u, batch_size=config.prompts_per_update,
                      digits=config.digits)["prompts"]) for u in range(start.step)}

    def batch_at(update: int) -> dict[str, Any]:
      batch = task.grouped_prompts(seed=config.seed, position=update,
                                   num_prompts=config.prompts_per_update,
                                   group_size=config.group_size, digits=config.digits)
      return {**batch, "update": update}

    def rl_step(state: LoopedRLState, batch: dict[str, Any], step_key: jax.Array):
      del step_key  # every key is a function of (seed, update)
      update = batch["update"]
      t_update = time.perf_counter()
      fingerprint = harness_checks.batch_fingerprint(batch["prompts"][::config.group_size])
      if fingerprint in seen:
        raise RuntimeError(f"update {update}: batch {fingerprint} was already used")
      seen.add(fingerprint)
      rollout_key = jax.random.fold_in(key, update)
      ro = draw(state.params, jnp.asarray(batch["prompts"]), rollout_key)
      completions = np.asarray(ro.tokens[:, prompt_len:])
      reward = task.rewards(completions, batch["answers"])
      mask = jnp.asarray(task.completion_mask(completions))
      adv = advantages_lib.group_advantages(jnp.asarray(reward), config.group_size)
      params, opt_state, metrics = learner_update(
          state.params, state.opt_state, ro.tokens, ro.depth, ro.logp, adv, mask,
          rollout_key)
      if config.learner_logp == "replay" and float(metrics["replay_exact"]) != 1.0:
        raise RuntimeError(f"update {update}: the replayed log-probs differ from the "
                           "rollout's (the replay must be bit for bit)")
      fed = np.asarray(ro.depth[:, :-1])
      metrics = {**metrics, "reward": float(reward.mean()),
                 "depth_mean": float(fed.mean()),
                 "perf/update_s": time.perf_counter() - t_update}
      put = lambda arr, v: arr.at[update].set(v)
      new = LoopedRLState(
          params, opt_state, put(state.rewards, float(reward.mean())),
          put(state.clip_fracs, metrics["ppo_clip_frac"]),
          put(state.max_abs_log_ratios, metrics["max_abs_log_ratio"]),
          put(state.not_one_fracs, metrics["ratio_not_one_frac"]),
          put(state.dense_k3s, metrics["dense_mismatch_k3"]),
          put(state.dense_max_dlogps, metrics["dense_max_abs_dlogp"]))
      return new, metrics

    result = run_loop(start=start, train_step=rl_step, batch_at=batch_at,
                      settings=run.settings(n), writer=run.writer,
                      checkpointer=run.checkpointer,
                      evaluate=lambda state: evaluate(state.params))
    done = result.snapshot.step
    s = jax.device_get(result.snapshot.state)
    last = max(1, n // 4)
    metrics = {**loop_metrics(result),
               "reward/mean_over_training": float(np.mean(s.rewards[:done])),
               "reward/last_quarter": float(np.mean(s.rewards[max(done - last, 0):done])),
               "ratio/clip_frac_mean": float(np.mean(s.clip_fracs[:done])),
               "ratio/max_abs_log_ratio": float(np.max(s.max_abs_log_ratios[:done])),
               "ratio/not_one_frac_mean": float(np.mean(s.not_one_fracs[:done])),
               "mismatch/dense_k3_mean": float(np.mean(s.dense_k3s[:done])),
               "mismatch/dense_max_abs_dlogp": float(np.max(s.dense_max_dlogps[:done])),
               "warm_start/greedy_accuracy": warm_info["greedy_accuracy"]}
    summary = run_summary(EXPERIMENT, options, config, result, start_time=t0,
                          num_params=sum(x.size for x in jax.tree.leaves(warm)),
                          resumed_from_step=start.step, metrics=metrics)
    return run.finish(summary, completed=result.completed, step=done)
