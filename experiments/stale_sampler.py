"""GRPO on multi-digit addition with a lagging sampler (Pan, "Cool the Sampler").

    python -m experiments.stale_sampler                                # TIS, K = 8
    python -m experiments.stale_sampler --refresh_interval=32 --sampler_temperature=0.8
    python -m experiments.stale_sampler --is_method=none --workdir=runs/stale/uncorrected

A small decoder LM is first fine-tuned with supervision on the task (cached under
``--pretrain_dir`` by the hash of everything that defines it, so every arm and seed of a
sweep starts from the same policy). RL then runs ``num_updates`` GRPO updates. The
sampler is an explicit copy of the learner's weights (:mod:`numerics.rl.sampler_copy`,
in ``--sampler_dtype``), refreshed every ``refresh_interval`` updates; each update
draws fresh problems, samples a group per problem from the (stale) sampler at
``sampler_temperature`` (recording the tempered behaviour log-probs), and takes one
learner step on :func:`numerics.rl.policy_loss.grpo_loss`. The learner's policy, like
the reference and the importance weights, is at temperature 1 (decoupled cooling).

Correction arms: ``is_method=token_tis`` (w = min(pi / mu, C) on an on-policy ratio),
``none`` with ``ratio_against=learner`` (no correction: the stale samples are treated
as on-policy), ``none`` with ``ratio_against=sampler`` (PPO clip against the recorded
log-probs), ``masked_is``/``icepop``/``sequence_tis``.

The loop is shared with :mod:`experiments.fair_cast` and :mod:`experiments.mxfp8_rl`
through config hooks (``learner_model``, ``sampler_model``, ``optimizer``,
``exporter``, ``initial_master``, ``loss_params``, ``sync_monitor``), and checkpoints
with orbax every ``checkpoint_every`` updates (``--resume`` continues bit for bit:
problems, sampling keys and the export's random bits are functions of (seed, update)).

Harness checks (Pan, "Probe the Harness") run at every update and raise on failure:
the loss receives the sampler's recorded log-probs where the method names them; every
batch is drawn from ``(seed, update)`` and none repeats; the loss normaliser is the one
the config names (checked against an independent reduction on the first update).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags, logging

from experiments.common import arithmetic_task as task
from experiments.common import log_filters
from experiments.common import run_metadata
from experiments.common.checkpoint import Checkpointer, Snapshot
from experiments.common.config_flags import config_field, config_from_flags, define_flags
from experiments.common.results import finish_run
from experiments.common.run_options import RunOptions, resolve_run_options
from experiments.common.train_loop import restore_or_initialize
from experiments.common.tensorboard_writer import MetricWriter
from models import sampling
from models.transformer import DecoderLM, TransformerConfig, fp32_dot_general, next_token_loss
from numerics.rl import advantages as advantages_lib
from numerics.rl import importance
from numerics.rl import policy_loss
from numerics.rl import sampler_copy

EXPERIMENT = "stale_sampler"
RATIO_AGAINST = ("sampler", "learner")


@dataclasses.dataclass(frozen=True)
class StaleSamplerConfig:
  """Everything that defines a run's result (its flags; written to config.json)."""

  seed: int = config_field(0, "RL seed: problems, sampling and per-update keys.")
  digits: int = config_field(3, "Digits per addend.")
  d_model: int = config_field(64, "Model width.")
  num_layers: int = config_field(2, "Transformer blocks.")
  num_heads: int = config_field(4, "Attention heads.")
  d_ff: int = config_field(256, "Feed-forward hidden width.")
  pretrain_seed: int = config_field(0, "Seed of the supervised warm start (shared by arms).")
  pretrain_steps: int = config_field(1200, "Supervised steps before RL (3 digits: ~43% greedy accuracy).")
  pretrain_batch: int = config_field(64, "Supervised batch size.")
  pretrain_lr: float = config_field(3e-3, "Supervised AdamW learning rate.")
  pretrain_dir: str = config_field("runs/stale_sampler/pretrain",
                                   "Cache of warm-start weights (by config hash).")
  num_updates: int = config_field(96, "GRPO learner updates.")
  prompts_per_update: int = config_field(16, "Problems per update.")
  group_size: int = config_field(8, "Samples per problem (the GRPO group).")
  learning_rate: float = config_field(1e-4, "Learner Adam learning rate (constant).")
  refresh_interval: int = config_field(8, "Sync the sampler every K learner updates.")
  sampler_temperature: float = config_field(1.0, "Sampler temperature (cooling: < 1).")
  sampler_top_k: int = config_field(0, "Sampler top-k (0: off).")
  sampler_top_p: float = config_field(1.0, "Sampler nucleus top-p (1: off).")
  sampler_dtype: str = config_field("float32", "Sampler weight precision.",
                                    choices=("float32", "bfloat16"))
  is_method: str = config_field("token_tis", "Importance correction.",
                                choices=importance.METHODS)
  is_cap: float = config_field(2.0, "TIS truncation C.")
  is_lo: float = config_field(0.5, "Masked IS / IcePop lower bound.")
  is_hi: float = config_field(2.0, "Masked IS / IcePop upper bound.")
  ratio_against: str = config_field(
      "learner", "PPO ratio denominator: 'learner' (its own current log-probs: r = 1 "
      "in value, the IS weight is the correction) or 'sampler' (the recorded "
      "behaviour log-probs, r = pi / mu clipped).", choices=RATIO_AGAINST)
  clip_eps: float = config_field(0.2, "PPO clip epsilon.")
  normalization: str = config_field("token", "Loss normaliser.",
                                    choices=policy_loss.NORMALIZATIONS)
  log_every: int = config_field(1, "Write metrics every N updates.")
  eval_every: int = config_field(8, "Greedy accuracy on held-out problems every N.")
  eval_problems: int = config_field(256, "Held-out problems per evaluation.")
  checkpoint_every: int = config_field(0, "Checkpoint every N updates and at the end "
                                       "(0: never).")

  def __post_init__(self):
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
    if self.is_method != "none" and self.ratio_against == "sampler":
      raise ValueError("an IS weight with the ratio against the sampler corrects twice; "
                       "use ratio_against='learner'")
    sampling.processed_log_probs(jnp.zeros(2), self.sampler_temperature,
                                 self.sampler_top_k, self.sampler_top_p)

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


def make_model(config: StaleSamplerConfig) -> DecoderLM:
  length = task.prompt_length(config.digits) + task.answer_length(config.digits)
  return DecoderLM(TransformerConfig(
      vocab_size=task.VOCAB_SIZE, d_model=config.d_model, num_layers=config.num_layers,
      num_heads=config.num_heads, d_ff=config.d_ff, max_len=length),
      dot_general=fp32_dot_general, attention_dot_general=fp32_dot_general,
      head_dot_general=fp32_dot_general)


def _pretrain_fields(config: StaleSamplerConfig) -> dict[str, Any]:
  keys = ("digits", "d_model", "num_layers", "num_heads", "d_ff", "pretrain_seed",
          "pretrain_steps", "pretrain_batch", "pretrain_lr")
  return {k: getattr(config, k) for k in keys}


def warm_start(config: StaleSamplerConfig, model: DecoderLM) -> tuple[Any, dict[str, float]]:
  """The supervised warm-start params (cached) and their greedy accuracy."""
  fields = _pretrain_fields(config)
  digest = hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]
  path = os.path.join(config.pretrain_dir, f"{digest}.npz")
  key = jax.random.PRNGKey(config.pretrain_seed)
  length = task.prompt_length(config.digits) + task.answer_length(config.digits) - 1
  params = model.init(key, jnp.zeros((1, length), jnp.int32), key)["params"]
  leaves, treedef = jax.tree.flatten(params)
  if os.path.exists(path):
    with np.load(path) as f:
      return jax.tree.unflatten(treedef, [jnp.asarray(f[f"p{i}"]) for i in
                                          range(len(leaves))]), json.loads(str(f["info"]))
  optimizer = optax.adamw(config.pretrain_lr, weight_decay=0.0)

  @jax.jit
  def step(params, opt_state, batch):
    def loss_fn(p):
      logits = model.apply({"params": p}, batch["inputs"], key)
      return next_token_loss(logits, batch["targets"], batch["mask"])[0]
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state = optimizer.init(params)
  for i in range(config.pretrain_steps):
    batch = task.supervised_batch(seed=config.pretrain_seed + 10_000, position=i,
                                  batch_size=config.pretrain_batch, digits=config.digits)
    params, opt_state, loss = step(params, opt_state, batch)
  info = {"pretrain_loss": float(loss) if config.pretrain_steps else float("nan"),
          **greedy_accuracy(model, params, config, position=0)}
  os.makedirs(config.pretrain_dir, exist_ok=True)
  tmp = f"{path}.{os.getpid()}.tmp.npz"
  np.savez(tmp, info=json.dumps(info), **{f"p{i}": np.asarray(x) for i, x in
                                          enumerate(jax.tree.leaves(params))})
  os.replace(tmp, path)  # atomic: parallel arms may race to write the same cache
  return params, info


def greedy_accuracy(model: DecoderLM, params: Any, config: StaleSamplerConfig,
                    position: int) -> dict[str, float]:
  """Exact-match accuracy of greedy (top-1) decoding on held-out problems (a fixed
  set per ``position``, drawn from the warm-start seed so every arm sees the same)."""
  p = task.problems(seed=config.pretrain_seed + 20_000, position=position,
                    batch_size=config.eval_problems, digits=config.digits)
  out = _greedy(model, params, jnp.asarray(p["prompts"]),
                task.answer_length(config.digits))
  completions = np.asarray(out)[:, task.prompt_length(config.digits):]
  return {"greedy_accuracy": float(task.rewards(completions, p["answers"]).mean())}


@functools.partial(jax.jit, static_argnums=(0, 3))
def _greedy(model, params, prompts, num_new):
  apply = lambda prm, t, k: model.apply({"params": prm}, t, k)
  return sampling.sample(apply, params, prompts, num_new, jax.random.PRNGKey(0),
                         top_k=1).tokens


def batch_fingerprint(prompts: np.ndarray) -> str:
  return hashlib.sha1(np.ascontiguousarray(prompts).tobytes()).hexdigest()[:16]


def train_and_evaluate(config: StaleSamplerConfig, options: RunOptions, *,
                       experiment: str = EXPERIMENT) -> dict[str, Any]:
  """Runs the warm start and the RL updates; returns the run's summary.

  ``experiment`` names the run (its default workdir, metadata and results row) for the
  experiments that reuse this loop through the config hooks.
  """
  options = resolve_run_options(options, experiment)
  t0 = time.time()
  model = config.learner_model()
  apply = lambda prm, t, k: model.apply({"params": prm}, t, k)
  sampler_net = config.sampler_model()
  sampler_apply = lambda prm, t, k: sampler_net.apply(
      {"params": jax.tree.map(lambda x: x.astype(jnp.float32), prm)}, t, k)
  warm, warm_info = warm_start(config, make_model(config))
  exporter = config.exporter()
  monitor = config.sync_monitor()
  optimizer = config.optimizer()
  prompt_len = task.prompt_length(config.digits)
  num_new = task.answer_length(config.digits)
  key = jax.random.PRNGKey(config.seed)
  export_key = jax.random.fold_in(key, 1 << 30)  # the export's bits, apart from sampling's
  export_fn = jax.jit(exporter.export)

  def fresh() -> Snapshot:
    master = config.initial_master(warm)
    export_state = exporter.init(master)
    served, export_state = export_fn(master, export_state,
                                     jax.random.fold_in(export_key, 0))
    state = {"params": master, "opt_state": optimizer.init(master),
             "sampler": sampler_copy.SamplerCopy(served, jnp.zeros((), jnp.int32),
                                                 jnp.ones((), jnp.int32)),
             "export_state": export_state,
             "rewards": jnp.zeros((config.num_updates,), jnp.float32)}
    return Snapshot(state, key, 0, 0)

  @jax.jit
  def draw(sampler_params, prompts, key):
    return sampling.sample(sampler_apply, sampler_params, prompts, num_new, key,
                           **config.sampler_kwargs)

  def loss_fn(p, tokens, behaviour_logp, adv, mask, served):
    learner_logp = sampling.sequence_log_probs(apply, config.loss_params(p, served),
                                               tokens, prompt_len, jax.random.PRNGKey(0))
    proximal = (jax.lax.stop_gradient(learner_logp) if config.ratio_against == "learner"
                else None)
    loss, metrics = policy_loss.grpo_loss(
        learner_logp, behaviour_logp, adv, mask, is_method=config.is_method,
        is_cap=config.is_cap, is_lo=config.is_lo, is_hi=config.is_hi,
        clip_eps=config.clip_eps, normalization=config.normalization,
        norm_constant=float(mask.size), proximal_logp=proximal)
    return loss, metrics

  @jax.jit
  def update(p, opt_state, tokens, behaviour_logp, adv, mask, served):
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        p, tokens, behaviour_logp, adv, mask, served)
    updates, opt_state = optimizer.update(grads, opt_state, p)
    metrics["grad_norm"] = optax.tree.norm(grads)
    return optax.apply_updates(p, updates), opt_state, metrics

  checkpointer = (Checkpointer(os.path.join(os.path.abspath(options.workdir), "checkpoints"))
                  if config.checkpoint_every else None)
  start = restore_or_initialize(checkpointer, options.resume, fresh)
  state = start.state
  params, opt_state, sampler = state["params"], state["opt_state"], state["sampler"]
  export_state, rewards = state["export_state"], np.array(state["rewards"])
  writer = MetricWriter(options.workdir)
  if start.step == 0:
    run_metadata.write_run_metadata(options.workdir, config, options,
                                    {"experiment": experiment, "warm_start": warm_info})
    writer.write_hparams(dataclasses.asdict(config), trial_id=options.run_name)
    writer.write_scalars(0, {f"eval/{k}": v for k, v in
                             greedy_accuracy(model, params, config, 1).items()})
    if monitor is not None:
      writer.write_scalars(0, monitor.on_sync(0, params, None, sampler))
  # Harness check: the batch queue never repeats a batch (rebuilt for a resumed run).
  seen = {_update_fingerprint(config, u) for u in range(start.step)}
  final: dict[str, float] = {}
  completed, done = True, start.step
  for step in range(start.step, config.num_updates):
    t_update = time.perf_counter()
    if step > 0 and bool(sampler_copy.refresh_due(step, config.refresh_interval)):
      served, export_state = export_fn(params, export_state,
                                       jax.random.fold_in(export_key, step))
      previous, sampler = sampler, sampler_copy.SamplerCopy(
          served, jnp.asarray(step, jnp.int32), sampler.syncs + 1)
      sync_metrics = ({} if monitor is None
                      else monitor.on_sync(step, params, previous, sampler))
    else:
      sync_metrics = {}
    batch = task.grouped_prompts(seed=config.seed, position=step,
                                 num_prompts=config.prompts_per_update,
                                 group_size=config.group_size, digits=config.digits)
    fingerprint = batch_fingerprint(batch["prompts"][::config.group_size])
    if fingerprint in seen:
      raise RuntimeError(f"update {step}: batch {fingerprint} was already used")
    seen.add(fingerprint)
    samples = draw(sampler.params, jnp.asarray(batch["prompts"]),
                   jax.random.fold_in(key, step))
    completions = np.asarray(samples.tokens[:, prompt_len:])
    reward = task.rewards(completions, batch["answers"])
    mask = task.completion_mask(completions)
    adv = advantages_lib.group_advantages(jnp.asarray(reward), config.group_size)
    if step == start.step:
      check_harness(config, apply, sampler_apply, params, sampler, samples, adv, mask,
                    loss_fn, prompt_len)
    params, opt_state, metrics = update(params, opt_state, samples.tokens, samples.logp,
                                        adv, jnp.asarray(mask), sampler.params)
    metrics = jax.device_get(metrics)  # blocks: the update time below is complete
    update_s = time.perf_counter() - t_update
    rewards[step] = float(reward.mean())
    if (step + 1) % config.log_every == 0 or step + 1 == config.num_updates:
      scalars = {f"train/{k}": float(v) for k, v in metrics.items()}
      scalars.update({"train/reward": float(reward.mean()),
                      "rl/staleness": int(sampler_copy.staleness(sampler, step)),
                      "rl/cycle_step": step % config.refresh_interval,
                      "rl/sampler_version": int(sampler.version),
                      "rl/refreshed": float(step % config.refresh_interval == 0),
                      "perf/update_s": update_s, **sync_metrics})
      writer.write_scalars(step + 1, scalars)
      final = scalars
    if (step + 1) % config.eval_every == 0 or step + 1 == config.num_updates:
      ev = greedy_accuracy(model, params, config, position=1)
      writer.write_scalars(step + 1, {f"eval/{k}": v for k, v in ev.items()})
      final.update({f"eval/{k}": v for k, v in ev.items()})
      logging.info("update %d: reward %.3f greedy %.3f is_mean %.3f", step + 1,
                   reward.mean(), ev["greedy_accuracy"], final.get("train/is_mean", 0))
    done = step + 1
    last_one = done == config.num_updates
    stop = done == options.stop_at_step and not last_one
    if checkpointer is not None and (done % config.checkpoint_every == 0 or last_one
                                     or stop):
      checkpointer.save(Snapshot(
          {"params": params, "opt_state": opt_state, "sampler": sampler,
           "export_state": export_state, "rewards": jnp.asarray(rewards)},
          start.rng, done, done))
    if stop:
      logging.info("stopping after update %d (--stop_at_step)", done)
      completed = False
      break
  if checkpointer is not None:
    checkpointer.close()
  last = max(1, config.num_updates // 4)
  metrics_out = {**final, "reward/mean_over_training": float(np.mean(rewards[:done])),
                 "reward/last_quarter": float(np.mean(rewards[done - last:done])),
                 "warm_start/greedy_accuracy": warm_info["greedy_accuracy"]}
  summary = {"experiment": experiment, "run_name": options.run_name,
             "workdir": options.workdir, "completed": completed, "step": done,
             "config": dataclasses.asdict(config), "metrics": metrics_out,
             "first_batch": _update_fingerprint(config, 0),
             "wall_s": time.time() - t0, "git": run_metadata.git_state()}
  finish_run(writer, options.results_file, summary, completed=completed, step=done)
  return summary


def _update_fingerprint(config: StaleSamplerConfig, update: int) -> str:
  """The fingerprint of the problems drawn for ``update`` (one per group)."""
  return batch_fingerprint(task.problems(seed=config.seed, position=update,
                                         batch_size=config.prompts_per_update,
                                         digits=config.digits)["prompts"])


def check_harness(config, apply, sampler_apply, params, sampler, samples, adv, mask,
                  loss_fn, prompt_len) -> None:
  """Pan's harness checks on the first update; raise on a violation.

  1. The behaviour log-probs the loss receives are the sampler's own: recomputing them
     from the sampler's weights with its processing matches the recorded ones, and the
     loss changes when they are replaced by the learner's recomputation (so they are
     used) unless the method takes no behaviour term at all.
  2. The loss normaliser is the configured one: the loss equals an independent
     reduction of the per-token objective.

  Every recomputation is jitted like the sampler and the update are: XLA:CPU's
  op-by-op (eager) kernels differ from its fused ones by float32 ulps, which a bf16 or
  MXFP8 cast downstream can turn into log-prob differences of 0.1-1 (measured on the
  mxfp8 sampler of :mod:`experiments.mxfp8_rl`; 4e-7 between jitted programs).
  """
  key = jax.random.PRNGKey(0)
  recomputed = jax.jit(lambda prm, t: sampling.sequence_log_probs(
      sampler_apply, prm, t, prompt_len, key, **config.sampler_kwargs))(
          sampler.params, samples.tokens)
  m = jnp.asarray(mask)
  gap = float(jnp.max(jnp.abs(recomputed - samples.logp) * m))
  if gap > 1e-4:
    raise RuntimeError(f"recorded behaviour log-probs differ from the sampler's by {gap}")
  learner = jax.jit(lambda prm, t: sampling.sequence_log_probs(
      apply, config.loss_params(prm, sampler.params), t, prompt_len, key))(
          params, samples.tokens)
  loss_fn = jax.jit(loss_fn)
  loss_b, _ = loss_fn(params, samples.tokens, samples.logp, adv, m, sampler.params)
  loss_l, _ = loss_fn(params, samples.tokens, learner, adv, m, sampler.params)
  uses_behaviour = config.is_method != "none" or config.ratio_against == "sampler"
  mismatch = float(jnp.max(jnp.abs(learner - samples.logp) * m)) > 1e-3
  if (uses_behaviour and mismatch and bool(jnp.any(adv != 0))
      and float(loss_b) == float(loss_l)):
    raise RuntimeError("the loss does not depend on the recorded behaviour log-probs")
  # Normaliser: recompute with the per-token objective under the named reduction.
  # On an on-policy ratio (r = 1) the objective is -w A, w = min(pi / mu, C) for TIS.
  weight = {"none": jnp.ones_like(learner),
            "token_tis": jnp.minimum(jnp.exp(learner - samples.logp), config.is_cap)
            }.get(config.is_method)
  per_token = -adv[:, None] * (weight if weight is not None else 0.0)
  if config.ratio_against == "learner" and weight is not None:
    expected = {"token": jnp.sum(per_token * m) / jnp.maximum(jnp.sum(m), 1.0),
                "sequence": jnp.mean(jnp.sum(per_token * m, 1)
                                     / jnp.maximum(jnp.sum(m, 1), 1.0)),
                "constant": jnp.sum(per_token * m) / m.size}[config.normalization]
    if not np.isclose(float(loss_b), float(expected), rtol=1e-5, atol=1e-6):
      raise RuntimeError(f"loss {float(loss_b)} is not the {config.normalization!r}-"
                         f"normalised objective {float(expected)}")


def main_for(config_cls: type, experiment: str) -> Callable[[list[str]], None]:
  """The absl ``main`` of an experiment on this loop (its config class and name)."""

  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    log_filters.quiet_library_info()
    config = config_from_flags(config_cls)
    options = resolve_run_options(config_from_flags(RunOptions), experiment)
    summary = train_and_evaluate(config, options, experiment=experiment)
    print(json.dumps(summary["metrics"], indent=1, sort_keys=True))
    print(f"TensorBoard events: {summary['workdir']}")

  return main


main = main_for(StaleSamplerConfig, EXPERIMENT)


if __name__ == "__main__":
  define_flags(StaleSamplerConfig)
  define_flags(RunOptions)
  app.run(main)
