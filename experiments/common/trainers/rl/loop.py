"""The RL run on the shared train loop: sampler sync, rollouts and the GRPO update.

One update of :func:`train_and_evaluate` is one step of
:func:`experiments.common.harness.train_loop.run_loop` (so checkpoint/resume, preemption,
logging and progress are the supervised experiments'):

1. every ``refresh_interval`` updates the sampler is re-synced: the config's
   ``exporter`` turns the learner's weights into the served copy (a
   :class:`numerics.rl.sampler_copy.SamplerCopy` at the learner's step) and the
   ``sync_monitor`` runs its host-side checks and metrics on it;
2. fresh problems (a pure function of ``(seed, update)``) are sampled in groups from
   the sampler's copy at the sampler's temperature, recording the behaviour log-probs;
3. one learner step on :func:`numerics.rl.policy_loss.grpo_loss` with group
   advantages, the configured importance correction and normaliser.

The first update of a process runs Pan's harness checks
(:mod:`experiments.common.trainers.rl.harness_checks`). Sampling keys and the export's random
bits are functions of ``(seed, update)`` (the sampling keys also of
``sampling_stream``: :func:`rollout_keys`), so ``--resume`` continues bit for bit.

Logged per update: ``train/*`` (loss terms, IS and mismatch statistics, reward),
``rl/*`` (staleness, cycle step, sampler version, refresh), ``perf/update_s`` and the
monitor's tags; ``eval/greedy_accuracy`` every ``eval_every`` updates and at update 0.
"""

from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.common.data import arithmetic_task as task
from experiments.common.harness.checkpoint import Snapshot
from experiments.common.evidence.results import loop_metrics, run_summary
from experiments.common.trainers.rl import harness_checks
from experiments.common.trainers.rl.config import RLConfig, make_model
from experiments.common.trainers.rl.warm_start import greedy_accuracy, warm_start
from experiments.common.harness import run as run_lib
from experiments.common.harness.run_options import RunOptions, resolve_run_options
from experiments.common.evidence.tensorboard_reader import read_scalars
from experiments.common.harness.train_loop import run_loop
from lowprec.models import sampling
from lowprec.numerics.rl import advantages as advantages_lib
from lowprec.numerics.rl import policy_loss
from lowprec.numerics.rl import sampler_copy

# The held-out problems of the learner's evaluation (a fixed set, the same for every arm).
EVAL_POSITION = 1


def rollout_keys(seed: int, stream: int) -> Callable[[int], jax.Array]:
  """``update -> key`` of the rollout sampling: a function of (seed, stream, update).

  Stream 0 is the historical ``fold_in(PRNGKey(seed), update)``; another stream folds
  ``(1 << 29) + stream`` into the seed's key first, so two arms of a sweep with
  different streams draw independent samples although they see the same problems.
  """
  base = jax.random.PRNGKey(seed)
  if stream:
    base = jax.random.fold_in(base, (1 << 29) + stream)
  return lambda update: jax.random.fold_in(base, update)


def accuracy_summary(curve: list[tuple[int, float]], done: int) -> dict[str, float]:
  """The learner's greedy accuracy over the run, from its evaluations ``[(update,
  value), ...]`` (update 0 is the warm start's): ``accuracy/mean_over_training`` and
  ``accuracy/min`` over the evaluations after update 0, ``accuracy/last_quarter`` over
  those in the last quarter of the ``done`` updates (at least the final one). NaN when
  there is no evaluation after update 0."""
  after = [(u, v) for u, v in curve if 0 < u <= done]
  if not after:
    nan = float("nan")
    return {"accuracy/mean_over_training": nan, "accuracy/min": nan,
            "accuracy/last_quarter": nan}
  values = np.asarray([v for _, v in after], np.float64)
  tail = [v for u, v in after if u > done - max(1, done // 4)] or [after[-1][1]]
  return {"accuracy/mean_over_training": float(values.mean()),
          "accuracy/min": float(values.min()),
          "accuracy/last_quarter": float(np.mean(tail))}


def learner_step_fns(config: RLConfig, apply: Callable[..., Any],
                     optimizer: optax.GradientTransformation
                     ) -> tuple[Callable[..., Any], Callable[..., Any]]:
  """``(loss_fn, learner_update)`` of one GRPO learner step under ``config``.

  ``loss_fn(params, tokens, behaviour_logp, adv, mask, served) -> (loss, metrics)``
  computes the learner's log-probs on ``config.loss_params(params, served)``;
  ``learner_update(params, opt_state, tokens, behaviour_logp, adv, mask, served) ->
  (params, opt_state, metrics)`` is its jitted gradient step (also what
  :mod:`experiments.fair_cast.bench_export` times).
  """
  prompt_len = task.prompt_length(config.digits)
  correction = config.correction()

  def loss_fn(p, tokens, behaviour_logp, adv, mask, served):
    learner_logp = sampling.sequence_log_probs(apply, config.loss_params(p, served),
                                               tokens, prompt_len, jax.random.PRNGKey(0))
    proximal = (jax.lax.stop_gradient(learner_logp) if config.ratio_against == "learner"
                else None)
    return policy_loss.grpo_loss(
        learner_logp, behaviour_logp, adv, mask, correction=correction,
        clip_eps=config.clip_eps,
        normalization=policy_loss.normalization(config.normalization,
                                                constant=float(mask.size)),
        proximal_logp=proximal)

  @jax.jit
  def learner_update(p, opt_state, tokens, behaviour_logp, adv, mask, served):
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        p, tokens, behaviour_logp, adv, mask, served)
    updates, opt_state = optimizer.update(grads, opt_state, p)
    metrics["grad_norm"] = optax.tree.norm(grads)
    return optax.apply_updates(p, updates), opt_state, metrics

  return loss_fn, learner_update


class RLState(NamedTuple):
  """The loop's checkpointed state: the learner (``params``, ``opt_state``), the sampler's
  copy, the export's state (e.g. an error-feedback residual) and the per-update mean
  reward (float32[num_updates], filled as updates run)."""

  params: Any
  opt_state: Any
  sampler: sampler_copy.SamplerCopy
  export_state: Any
  rewards: jax.Array


def train_and_evaluate(config: RLConfig, options: RunOptions, *, experiment: str
                       ) -> dict[str, Any]:
  """Runs the warm start and ``config.num_updates`` GRPO updates; returns the summary.

  ``experiment`` names the run (its default workdir, metadata and results row).
  """
  options = resolve_run_options(options, experiment, config)
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
  rollout_key = rollout_keys(config.seed, config.sampling_stream)
  export_fn = jax.jit(exporter.export)

  def fresh() -> Snapshot:
    master = config.initial_master(warm)
    export_state = exporter.init(master)
    served, export_state = export_fn(master, export_state,
                                     jax.random.fold_in(export_key, 0))
    state = RLState(master, optimizer.init(master),
                    sampler_copy.initial_copy(served, lambda p: p, 0), export_state,
                    jnp.zeros((config.num_updates,), jnp.float32))
    return Snapshot(state, key, 0, 0)

  @jax.jit
  def draw(sampler_params, prompts, key):
    return sampling.sample(sampler_apply, sampler_params, prompts, num_new, key,
                           **config.sampler_kwargs)

  loss_fn, learner_update = learner_step_fns(config, apply, optimizer)

  with run_lib.open_run(experiment, config, options) as run:
    start = run.restore(fresh, metadata={"warm_start": warm_info})
    writer = run.writer
    if start.step == 0:
      if monitor is not None:
        writer.write_scalars(0, monitor.on_sync(0, start.state.params, None,
                                                start.state.sampler))
    # Harness check: the batch queue never repeats a batch (rebuilt for a resumed run).
    seen = {harness_checks.update_fingerprint(config, u) for u in range(start.step)}

    def batch_at(update: int) -> dict[str, Any]:
      batch = task.grouped_prompts(seed=config.seed, position=update,
                                   num_prompts=config.prompts_per_update,
                                   group_size=config.group_size, digits=config.digits)
      return {**batch, "update": update}

    def rl_step(state: RLState, batch: dict[str, Any], step_key: jax.Array
                ) -> tuple[RLState, dict[str, Any]]:
      del step_key  # every key is a function of (seed, update): see the module docstring
      update = batch["update"]
      t_update = time.perf_counter()
      sampler, export_state, sync_metrics = state.sampler, state.export_state, {}
      if bool(sampler_copy.refresh_needed(sampler, update, config.refresh_interval)):
        served, export_state = export_fn(state.params, export_state,
                                         jax.random.fold_in(export_key, update))
        previous, sampler = sampler, sampler_copy.SamplerCopy(
            served, jnp.asarray(update, jnp.int32), sampler.syncs + 1)
        if monitor is not None:
          sync_metrics = monitor.on_sync(update, state.params, previous, sampler)
      fingerprint = harness_checks.batch_fingerprint(batch["prompts"][::config.group_size])
      if fingerprint in seen:
        raise RuntimeError(f"update {update}: batch {fingerprint} was already used")
      seen.add(fingerprint)
      samples = draw(sampler.params, jnp.asarray(batch["prompts"]), rollout_key(update))
      completions = np.asarray(samples.tokens[:, prompt_len:])
      reward = task.rewards(completions, batch["answers"])
      mask = task.completion_mask(completions)
      adv = advantages_lib.group_advantages(jnp.asarray(reward), config.group_size)
      if update == start.step:
        harness_checks.check_harness(config, apply, sampler_apply, state.params, sampler,
                                     samples, adv, mask, loss_fn, prompt_len)
      params, opt_state, metrics = learner_update(
          state.params, state.opt_state, samples.tokens, samples.logp, adv,
          jnp.asarray(mask), sampler.params)
      metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}  # blocks
      metrics.update({
          "reward": float(reward.mean()),
          "rl/staleness": int(sampler_copy.staleness(sampler, update)),
          "rl/cycle_step": update % config.refresh_interval,
          "rl/sampler_version": int(sampler.version),
          "rl/refreshed": float(update % config.refresh_interval == 0),
          "perf/update_s": time.perf_counter() - t_update, **sync_metrics})
      rewards = state.rewards.at[update].set(float(reward.mean()))
      return RLState(params, opt_state, sampler, export_state, rewards), metrics

    def evaluate(state: RLState) -> dict[str, float]:
      return greedy_accuracy(model, state.params, config, position=EVAL_POSITION)

    # No blow-up threshold: a policy-gradient surrogate has no scale to compare against;
    # a checkpoint is unhealthy only when its loss is not finite.
    result = run_loop(start=start, train_step=rl_step, batch_at=batch_at,
                      settings=run.settings(config.num_updates), writer=writer,
                      checkpointer=run.checkpointer, evaluate=evaluate)
    done = result.snapshot.step
    rewards = np.asarray(result.snapshot.state.rewards)
    last = max(1, config.num_updates // 4)
    writer.flush()  # the accuracy curve is read back from the events (a resumed run's too)
    scalars = read_scalars(options.workdir)
    curve = scalars.get("eval/greedy_accuracy", [])
    metrics = {**loop_metrics(result),
               "reward/mean_over_training": float(np.mean(rewards[:done])),
               "reward/last_quarter": float(np.mean(rewards[max(done - last, 0):done])),
               **accuracy_summary(curve, done),
               "warm_start/greedy_accuracy": warm_info["greedy_accuracy"],
               "warm_start/pretrain_steps": float(warm_info.get("pretrain_steps_used",
                                                                float("nan")))}
    metrics.update(config.summary_metrics(scalars, done))
    summary = run_summary(experiment, options, config, result, start_time=t0,
                          num_params=sum(x.size for x in jax.tree.leaves(warm)),
                          resumed_from_step=start.step, metrics=metrics,
                          first_batch=harness_checks.update_fingerprint(config, 0))
    return run.finish(summary, completed=result.completed, step=done)
