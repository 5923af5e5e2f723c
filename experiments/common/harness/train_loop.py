"""The shared train loop: a jitted ``train_step(state, batch, key) -> (state, metrics)``,
periodic eval, TensorBoard logging, progress lines, checkpoint/resume and preemption;
the periodic settings' config fields (:func:`periodic_field`).

Exact resume: the loop's state is (train state, PRNG key, data position, step) and each
step's batch is a pure function of the data position, so a run restored from a checkpoint
replays the uninterrupted run bit for bit.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from experiments.common.evidence.tensorboard_writer import MetricWriter
from experiments.common.harness import config_flags
from experiments.common.harness import run_metadata
from experiments.common.harness.checkpoint import Checkpointer, Snapshot
from experiments.common.harness.preemption import PreemptionWatcher
from experiments.common.harness.progress import ProgressReporter

Batch = Mapping[str, Any]
Metrics = dict[str, jax.Array]
# loss_fn(params, quant_state, batch, key) -> (loss, aux): see make_train_step.
LossFn = Callable[[Any, Any, Batch, jax.Array], tuple[jax.Array, Metrics]]
TrainStep = Callable[["TrainState", Batch, jax.Array], tuple["TrainState", Metrics]]


class TrainState(NamedTuple):
  """What a train step updates: a step counter (int32 scalar), the params, the optimizer
  state and the quantization state.

  ``quant_state`` holds the model's variable collections besides ``params`` that the
  step carries (``{OVERWRITE: ...}``: delayed-scaling histories and backward telemetry
  probes, see :mod:`lowprec.models.quantization`), ``{}`` for a model that carries none.
  The optimizer never sees it; each step replaces it by its gradient.
  """

  step: jax.Array
  params: Any
  opt_state: Any
  quant_state: Any = {}  # a shared empty default: never mutated, states are replaced


def init_train_state(params: Any, optimizer: optax.GradientTransformation,
                     quant_state: Any = None) -> TrainState:
  """A step-0 TrainState (``quant_state``: the model's other collections, default none)."""
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=optimizer.init(params),
                    quant_state={} if quant_state is None else quant_state)


def without_quant_state(loss_fn: Callable[[Any, Batch, jax.Array],
                                          tuple[jax.Array, Metrics]]) -> LossFn:
  """``loss_fn(params, batch, key)`` of a model that carries no quantization state, as a
  :data:`LossFn`."""
  return lambda params, quant_state, batch, key: loss_fn(params, batch, key)


def make_train_step(loss_fn: LossFn, optimizer: optax.GradientTransformation,
                    state_metrics: Callable[[Any], Metrics] | None = None, *,
                    quant_metrics: Callable[[Any], Metrics] | None = None) -> TrainStep:
  """The jitted ``train_step(state, batch, key) -> (state, metrics)``.

  ``loss_fn(params, quant_state, batch, key) -> (scalar loss, aux metrics)``
  (:func:`without_quant_state` adapts one that takes no state). The optimizer updates
  ``params``; ``quant_state`` is replaced by its gradient, which is its next value (Flax's
  ``_overwrite_with_gradient`` convention). The returned metrics are a flat dict of
  scalars: ``loss``, ``grad_norm``, ``param_norm``, ``update_norm`` (of the params),
  plus aux, plus ``quant_metrics(next quant_state)`` and
  ``state_metrics(new_opt_state)`` when given (e.g. telemetry, a transform's counters).
  ``state`` is donated, so do not reuse the one passed in.
  """

  def train_step(state: TrainState, batch: Batch, key: jax.Array
                 ) -> tuple[TrainState, Metrics]:
    (loss, aux), (grads, quant_state) = jax.value_and_grad(
        loss_fn, argnums=(0, 1), has_aux=True)(state.params, state.quant_state, batch, key)
    extra = {} if quant_metrics is None else quant_metrics(quant_state)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads),
               "param_norm": optax.tree.norm(params),
               "update_norm": optax.tree.norm(updates), **aux, **extra}
    if state_metrics is not None:
      metrics.update(state_metrics(opt_state))
    return TrainState(state.step + 1, params, opt_state, quant_state), metrics

  return jax.jit(train_step, donate_argnums=(0,))


@dataclasses.dataclass(frozen=True)
class LoopSettings:
  """How often the loop does what (0 disables a periodic action; the end always runs)."""

  num_steps: int
  log_every: int = 50
  eval_every: int = 200
  checkpoint_every: int = 200
  histogram_every: int = 200
  progress_every_s: float = 10.0
  stop_at_step: int = 0
  # A checkpoint whose last train loss is not finite or above this is *unhealthy*; the
  # checkpointer always keeps the newest healthy one (see experiments.common.harness.checkpoint).
  max_healthy_loss: float = math.inf
  # False: write train metrics at the log_every steps (and the last) only, that step's
  # values, to keep committed events small; every step is still checked for a finite loss.
  every_step_scalars: bool = True

  def __post_init__(self):
    if self.num_steps < 1:
      raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
    if not self.max_healthy_loss > 0:
      raise ValueError(f"max_healthy_loss must be > 0, got {self.max_healthy_loss}")
    for name in ("log_every", "eval_every", "checkpoint_every", "histogram_every",
                 "stop_at_step"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


# The loop's periodic settings. A config declares each with periodic_field (one flag per
# field, as every config field), and experiments.common.harness.run.Run.settings reads them.
PERIODIC = ("log_every", "eval_every", "checkpoint_every", "histogram_every",
            "progress_every_s")
_LOOP_SETTING = "loop_setting"  # the field metadata key periodic_field marks
# name -> (its help's sentence, the fixed points its action also runs at)
_PERIODIC_HELP = {
    "log_every": ("Write train metrics every N {unit}s and at the end", "at the end"),
    "eval_every": ("Evaluate every N {unit}s, at {unit} 0 and at the end",
                   "at {unit} 0 and at the end"),
    "checkpoint_every": ("Checkpoint every N {unit}s and at the end", "at the end"),
    "histogram_every": ("Weight / quantization-error histograms every N {unit}s, at "
                        "{unit} 0 and at the end", "at {unit} 0 and at the end"),
}


def periodic_field(name: str, default: float, *, unit: str = "step",
                   domain: str | None = None) -> Any:
  """The config field of the loop setting ``name`` (one of :data:`PERIODIC`): this
  paper's ``default``, with the help text and domain every experiment shares (a step
  count in ``[0, inf)``, 0 leaving the action to its fixed points; ``progress_every_s``:
  seconds in ``(0, inf)``). ``unit`` is what the paper's loop calls a step
  (``"update"`` for RL); ``domain`` replaces the shared one where the paper needs the
  action periodically, e.g. ``"[1, inf)"``."""
  if name not in PERIODIC:
    raise ValueError(f"{name!r} is not a loop setting; expected one of {PERIODIC}")
  if name == "progress_every_s":
    text, domain = "Seconds between progress log lines.", domain or "(0, inf)"
  else:
    domain = domain or "[0, inf)"
    sentence, fixed = (t.format(unit=unit) for t in _PERIODIC_HELP[name])
    text = sentence + (f" (0: only {fixed})." if config_flags.in_domain(0, domain)
                       else ".")
  field = config_flags.config_field(default, text, domain=domain)
  return dataclasses.field(default=field.default,
                           metadata={**field.metadata, _LOOP_SETTING: name})


def periodic_settings(config: Any) -> dict[str, Any]:
  """``{name: value}`` of the loop settings ``config`` (a dataclass instance) declares
  with :func:`periodic_field`."""
  out = {}
  for f in dataclasses.fields(config):
    name = f.metadata.get(_LOOP_SETTING)
    if name is not None and name != f.name:
      raise TypeError(f"{type(config).__name__}.{f.name} is declared as "
                      f"periodic_field({name!r})")
    if name is not None:
      out[name] = getattr(config, f.name)
  return out


class LoopResult(NamedTuple):
  """Where the loop ended. ``completed`` is False after a stop/preemption."""

  snapshot: Snapshot
  completed: bool
  train_metrics: dict[str, float]
  eval_metrics: dict[str, float]
  steps_per_s: float
  wall_s: float


# Step metrics under these namespaces keep their tag (``rl/staleness``,
# ``perf/update_s``, ``sync/k3``); every other metric is logged as ``train/<name>``.
SHARED_NAMESPACES = ("perf", "rl", "export", "sync", "numerics")


def train_tag(name: str) -> str:
  """The TensorBoard tag of a step metric (see :data:`SHARED_NAMESPACES`)."""
  return name if name.split("/", 1)[0] in SHARED_NAMESPACES and "/" in name \
      else f"train/{name}"


def _due(step: int, every: int) -> bool:
  return every > 0 and step % every == 0


def restore_or_initialize(checkpointer: Checkpointer | None, resume: bool,
                          init: Callable[[], Snapshot], *, resume_step: int | None = None
                          ) -> Snapshot:
  """The snapshot to start from: the newest intact checkpoint if resuming, else ``init()``.

  A damaged or incomplete newest checkpoint is skipped with a warning naming it
  (:meth:`Checkpointer.restore_latest_intact`) and deleted, so the run saves that step
  afresh. ``resume_step`` resumes from that step instead (e.g. the last healthy
  checkpoint before a divergence); the newer checkpoints of the abandoned trajectory
  are deleted.

  Raises:
    FileExistsError: checkpoints exist but ``resume`` is False (refuse to overwrite).
    CheckpointError: no intact checkpoint (at or below ``resume_step``).
  """
  fresh = init()
  if checkpointer is None:
    return fresh
  latest = checkpointer.latest_step()
  if latest is None:
    if resume:
      logging.warning("--resume: nothing to resume, no checkpoint in %s; training from "
                      "step 0", checkpointer.directory)
    return fresh
  if not resume:
    raise FileExistsError(
        f"{os.path.dirname(checkpointer.directory)} already holds a run (latest "
        f"checkpoint: step {latest}). To continue an interrupted run pass --resume; to "
        "train a new one choose another --workdir.")
  if resume_step is not None and resume_step < 0:
    resume_step = None  # the run options' "-1: the newest"
  if resume_step is not None and resume_step not in checkpointer.all_steps():
    raise ValueError(f"--resume_step={resume_step}: no such checkpoint in "
                     f"{checkpointer.directory} (steps: {checkpointer.all_steps()})")
  snapshot = checkpointer.restore_latest_intact(fresh.state, fresh.rng, resume_step)
  newer = [s for s in checkpointer.all_steps() if s > snapshot.step]
  if newer:
    # Either an abandoned trajectory (--resume_step) or steps that failed to restore
    # (warned above); a damaged one left in place would never be saved again (a save
    # keeps a step that exists), so the run would end on it.
    logging.warning("resuming from step %d: deleting the newer checkpoints %s (%s)",
                    snapshot.step, newer, "--resume_step" if resume_step is not None
                    else "damaged")
    checkpointer.delete_after(snapshot.step)
  if not snapshot.record.get("healthy", True):
    healthy = [s for s in checkpointer.all_steps() if s < snapshot.step]
    logging.warning(
        "checkpoint step %d is unhealthy (loss %s): resuming from it continues the "
        "divergence. Resume from an earlier step instead with --resume --resume_step=N "
        "(steps kept: %s).", snapshot.step, snapshot.record.get("loss"), healthy)
  logging.info("resumed from step %d (data position %d) in %s", snapshot.step,
               snapshot.data_position, checkpointer.directory)
  return snapshot


def _segments(record: Mapping[str, Any], step: int, here: dict[str, Any]
              ) -> list[dict[str, Any]]:
  """The run's segments so far (from a resumed checkpoint's record) and this one."""
  segments = [dict(s) for s in record.get("segments", [])]
  if step > 0 and not segments:  # checkpointed before segments were recorded
    segments.append({"step": 0, "commit": "unknown", "dirty": None})
  if segments:
    last = segments[-1]
    if (last.get("commit"), last.get("dirty")) != (here.get("commit"), here.get("dirty")):
      logging.warning(
          "resuming at step %d from commit %s%s, but the steps from %d ran from commit "
          "%s%s: the run now spans commits, and a change between them (a recipe "
          "default, say) alters what its steps compute. Its results row lists each "
          "segment and the sweep report names the run.", step, here.get("commit"),
          " (dirty)" if here.get("dirty") else "", last.get("step", 0),
          last.get("commit"), " (dirty)" if last.get("dirty") else "")
  return segments + [{"step": int(step), "commit": here.get("commit"),
                      "dirty": here.get("dirty")}]


def run_loop(*, start: Snapshot, train_step: TrainStep, batch_at: Callable[[int], Batch],
             settings: LoopSettings, writer: MetricWriter,
             checkpointer: Checkpointer | None = None,
             evaluate: Callable[[Any], dict[str, float]] | None = None,
             inspect: Callable[[Any], tuple[dict[str, np.ndarray], dict[str, float]]]
             | None = None, provenance: Mapping[str, Any] | None = None) -> LoopResult:
  """Trains from ``start`` to ``settings.num_steps``.

  Args:
    start: the snapshot to continue from (step 0 for a fresh run).
    train_step: from :func:`make_train_step`.
    batch_at: data position -> device-ready batch (placed/sharded by the caller).
    settings: the periodic schedule.
    writer: metric writer (a disabled one on non-zero processes).
    checkpointer: None disables checkpoints.
    evaluate: train state -> ``{name: float}`` eval metrics, logged under ``eval/``.
    inspect: train state -> (histograms, scalars) logged as given (weights,
      quantization error), every ``histogram_every`` steps and at the end.
    provenance: the code this process runs, ``{"commit", "dirty"}`` (default:
      :func:`experiments.common.harness.run_metadata.git_state`). Each process's part of the
      run is a *segment*, recorded (start step, commit, dirty) in the checkpoints and
      the final snapshot's record; resuming from other code than the last segment ran
      warns, as a change in between (a recipe default, say) alters what the steps do.

  Every process of a multi-process job must call this (the jitted computations are SPMD).
  """
  if start.step > settings.num_steps:
    raise ValueError(f"checkpoint step {start.step} is beyond num_steps="
                     f"{settings.num_steps}")
  loop = _Loop(start, settings, writer, checkpointer, evaluate, inspect,
               dict(run_metadata.git_state() if provenance is None else provenance))
  completed = True
  with PreemptionWatcher() as preemption:
    if loop.step == 0:
      loop.run_eval()
      loop.run_inspect()
    while loop.step < settings.num_steps:
      loop.train_one(train_step, batch_at)
      if not loop.periodic(preemption):
        completed = False
        break
    if loop.step == start.step == settings.num_steps and not loop.last_eval:
      loop.run_eval()  # resumed at the final step from a checkpoint without an eval record
  loop.flush_metrics()
  writer.flush()
  wall = time.perf_counter() - loop.t_start
  return LoopResult(snapshot=Snapshot(loop.state, loop.rng, loop.step, loop.position,
                                      loop.record()),
                    completed=completed, train_metrics=loop.last_train,
                    eval_metrics=loop.last_eval, steps_per_s=loop.steps_per_s(),
                    wall_s=wall)


class _Loop:
  """The training loop's state between steps (train state, key, step, data position,
  the last metrics, timing) and its periodic actions: log, evaluate, inspect,
  checkpoint (:func:`run_loop` drives it)."""

  def __init__(self, start: Snapshot, settings: LoopSettings, writer: MetricWriter,
               checkpointer: Checkpointer | None,
               evaluate: Callable[[Any], dict[str, float]] | None,
               inspect: Callable[[Any], tuple[dict[str, np.ndarray], dict[str, float]]]
               | None, provenance: dict[str, Any]):
    self.state, self.rng = start.state, start.rng
    self.step, self.position = start.step, start.data_position
    self.settings, self.writer, self.checkpointer = settings, writer, checkpointer
    self.evaluate, self.inspect = evaluate, inspect
    self.progress = ProgressReporter(settings.num_steps, every_s=settings.progress_every_s)
    self.pending: list[tuple[int, Metrics]] = []
    # A resumed run starts from what the checkpoint recorded, so its results row carries
    # the whole run's metrics and speed even when it resumes at the final step.
    record = start.record or {}
    self.last_train: dict[str, float] = dict(record.get("train_metrics", {}))
    self.last_eval: dict[str, float] = dict(record.get("eval_metrics", {}))
    self.timed = record.get("timing", {"steps": 0, "seconds": 0.0})
    self.segments = _segments(record, self.step, provenance)
    self.t_start = time.perf_counter()
    self.first_step_s: float | None = None
    if self.step > 0:
      # Readers drop what the interrupted process logged past this run's checkpoint
      # (TensorBoard's restart convention); the steps up to it stay.
      writer.mark_restart(self.step + 1)

  def steps_per_s(self) -> float:
    """Over every timed step of the run so far, this process's and earlier ones'."""
    now = self.progress.timed(self.step)
    steps, seconds = self.timed["steps"] + now[0], self.timed["seconds"] + now[1]
    return steps / seconds if steps > 0 and seconds > 0 else math.nan

  def flush_metrics(self) -> None:
    """Fetches the pending steps' metrics, writes them, and stops on a non-finite loss."""
    if not self.pending:
      return
    settings = self.settings
    fetched = jax.device_get([m for _, m in self.pending])
    for (s, _), m in zip(self.pending, fetched):
      self.last_train = {k: float(v) for k, v in m.items()}
      if (settings.every_step_scalars or s == settings.num_steps
          or _due(s, settings.log_every)):
        self.writer.write_scalars(s, {train_tag(k): v for k, v in self.last_train.items()})
      if not np.isfinite(self.last_train["loss"]):
        self.writer.flush()
        raise FloatingPointError(f"non-finite train loss {self.last_train['loss']} at "
                                 f"step {s}")
    self.pending.clear()

  def run_eval(self) -> None:
    if self.evaluate is None:
      return
    self.last_eval = {k: float(v) for k, v in self.evaluate(self.state).items()}
    self.writer.write_scalars(self.step, {f"eval/{k}": v for k, v in self.last_eval.items()})
    logging.info("eval step %d | %s", self.step,
                 " | ".join(f"{k} {v:.4f}" for k, v in sorted(self.last_eval.items())))

  def run_inspect(self) -> None:
    if self.inspect is None:
      return
    histograms, scalars = self.inspect(self.state)
    self.writer.write_histograms(self.step, histograms)
    self.writer.write_scalars(self.step, scalars)

  def record(self) -> dict[str, Any]:
    """What a checkpoint and the final snapshot record besides the arrays."""
    loss = self.last_train.get("loss", math.nan)
    now = self.progress.timed(self.step)
    return {"train_metrics": self.last_train, "eval_metrics": self.last_eval,
            "segments": self.segments,
            "timing": {"steps": self.timed["steps"] + now[0],
                       "seconds": self.timed["seconds"] + now[1]},
            "loss": loss if math.isfinite(loss) else None,
            "healthy": bool(not self.last_train or (
                math.isfinite(loss) and loss <= self.settings.max_healthy_loss))}

  def save(self) -> None:
    if self.checkpointer is not None:
      self.checkpointer.save(Snapshot(self.state, self.rng, self.step, self.position,
                                      self.record()))

  def train_one(self, train_step: TrainStep, batch_at: Callable[[int], Batch]) -> None:
    """One step: the batch at the data position, a fresh key, the metrics queued (the
    first step's time written once it is done)."""
    batch = batch_at(self.position)
    self.rng, step_key = jax.random.split(self.rng)
    self.state, metrics = train_step(self.state, batch, step_key)
    self.step += 1
    self.position += 1
    self.pending.append((self.step, metrics))
    if self.first_step_s is None:
      jax.block_until_ready(metrics)
      self.first_step_s = time.perf_counter() - self.t_start
      self.writer.write_scalars(self.step, {"perf/first_step_s": self.first_step_s})
      self.progress.start(self.step)

  def periodic(self, preemption: PreemptionWatcher) -> bool:
    """The actions due after this step (the last step runs all of them); False when the
    loop stops early (``stop_at_step`` or a preemption), after a checkpoint."""
    settings, step = self.settings, self.step
    last = step == settings.num_steps
    if last or _due(step, settings.log_every):
      self.flush_metrics()
      rate = self.progress.steps_per_s(step)
      if rate == rate:
        self.writer.write_scalars(step, {"perf/steps_per_s": rate})
      self.progress.maybe_log(step, self.last_train["loss"], force=last)
    if last or _due(step, settings.eval_every):
      self.run_eval()
    if last or _due(step, settings.histogram_every):
      self.run_inspect()
    stop = step == settings.stop_at_step or preemption.requested(step)
    if last or stop or _due(step, settings.checkpoint_every):
      self.flush_metrics()
      self.save()
    if stop and not last:
      logging.warning("stopping at step %d of %d (%s); resume with --resume", step,
                      settings.num_steps, "stop_at_step" if step == settings.stop_at_step
                      else "preemption")
      return False
    return True
