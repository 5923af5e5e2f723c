"""Temperon in miniature: a cheap SGD explorer handed off to a SAM-Muon refiner, on digits.

    python -m experiments.temperon                                   # Temperon, ~1 min
    python -m experiments.temperon --explorer=sgd_sam --refiner=none # full-time SAM+SGD
    python -m experiments.temperon --workdir=runs/temperon/x --resume

One run trains a small ResNet (models.resnet, GroupNorm) on scikit-learn's bundled 8x8
digits (no download). The optimizer is ``explorer`` for the whole run (``refiner=none``)
or, with a refiner, ``handoff(explorer, refiner, round(handoff_fraction * num_steps),
transfer)`` from numerics.optim: one jitted step, no retrace at the switch. Each phase
has its own schedule over its own horizon: the explorer's is SGDR warm restarts
(``n_cycles`` cycles, lengths 1:t_mult:t_mult^2...) or one cosine; the refiner's is one
cosine with a linear re-entry warm-up; SAM's rho ramps linearly from 0 over
``rho_ramp_steps`` from the step its phase starts.

Writes TensorBoard events (train/eval scalars, ``perf/step_s``, ``train/phase``, HParams),
``config.json``, orbax checkpoints under ``<workdir>/checkpoints`` and, when complete, one
results row with the final test accuracy/error, steps and calibrated seconds to each
target accuracy, gradient evaluations per step and measured seconds per step per phase.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from experiments.common.evidence import curves
from experiments.common.data import digits
from experiments.common.harness.checkpoint import Snapshot
from experiments.common.harness.config_flags import SEED_DOMAIN, check_fields, config_field
from experiments.common.evidence.results import loop_metrics, run_summary
from experiments.common.harness import run as run_lib
from experiments.common.harness.run_options import RunOptions, resolve_run_options
from experiments.common.evidence.tensorboard_reader import read_scalars
from experiments.common.harness.train_loop import (TrainState, init_train_state, periodic_field,
                                                   run_loop)
from lowprec.models.resnet import ResNet, ResNetConfig, classification_loss
from lowprec.numerics import optim

EXPERIMENT = "temperon"
PHASE_KINDS = ("sgd", "sgd_sam", "muon_sam")


@dataclasses.dataclass(frozen=True)
class TemperonConfig:
  """Everything that defines a run's result (its flags; written to config.json)."""

  seed: int = config_field(0, "Seed of parameter init and data order (the split is fixed).",
                           domain=SEED_DOMAIN)
  num_steps: int = config_field(600, "Total training steps (the budget).", domain="[1, inf)")
  batch_size: int = config_field(64, "Batch size.", domain="[1, inf)")
  train_examples: int = config_field(0, "Use only the first N training images (0: all).",
                                     domain="[0, inf)")
  label_noise: float = config_field(0.0, "Fraction of the training labels replaced by "
                                    "another class drawn uniformly (which ones and by "
                                    "what: a function of the seed).", domain="[0, 1)")
  test_set: str = config_field("split", "split: the fixed 359-image test split; rest: "
                               "every image not trained on (1797 - train_examples).",
                               choices=("split", "rest"))
  width: int = config_field(16, "ResNet width (channels of the first stage).",
                            domain="[1, inf)")
  num_stages: int = config_field(2, "ResNet stages (width doubles, stride 2, per stage).",
                                 domain="[1, inf)")
  blocks_per_stage: int = config_field(1, "BasicBlocks per stage.", domain="[1, inf)")
  explorer: str = config_field("sgd", "Optimizer of the first phase (the whole run if "
                               "refiner=none).", choices=PHASE_KINDS)
  refiner: str = config_field("muon_sam", "Optimizer after the handoff (none: no handoff).",
                              choices=("none",) + PHASE_KINDS)
  handoff_fraction: float = config_field(0.43, "Fraction of num_steps run by the explorer.",
                                         domain="(0, 1)")
  sam_steps: str = config_field(
      "all", "Which steps of a one-phase (refiner=none) SAM run take the SAM pass: all; "
      "late: from round(handoff_fraction * num_steps) on (late-phase SAM); periodic: "
      "num_steps - round(handoff_fraction * num_steps) of them spread uniformly (the "
      "same SAM-step budget as the handoff).", choices=("all", "late", "periodic"))
  explorer_schedule: str = config_field("restarts", "Explorer LR schedule.",
                                        choices=("restarts", "cosine"))
  n_cycles: int = config_field(4, "Warm-restart cycles of the explorer schedule.",
                               domain="[1, inf)")
  t_mult: float = config_field(2.0, "Cycle length ratio (1:2:4:8 with 4 cycles).",
                               domain="[1, inf)")
  warmup_steps: int = config_field(20, "Linear warm-up at the very start.", domain="[0, inf)")
  rewarmup_steps: int = config_field(20, "Linear LR re-entry warm-up of the refiner.",
                                     domain="[0, inf)")
  transfer: str = config_field("momentum", "State transfer at the handoff.",
                               choices=("momentum", "none"))
  sgd_lr: float = config_field(0.1, "SGD peak learning rate.", domain="(0, inf)")
  sgd_weight_decay: float = config_field(5e-4, "SGD (coupled, torch-style) weight decay.",
                                         domain="[0, inf)")
  sgd_rho: float = config_field(0.2, "SAM radius around SGD.", domain="[0, inf)")
  muon_lr: float = config_field(0.01, "Muon peak learning rate.", domain="(0, inf)")
  muon_weight_decay: float = config_field(0.2, "Muon decoupled weight decay (p *= 1-lr*wd).",
                                          domain="[0, inf)")
  muon_rho: float = config_field(0.05, "SAM radius around Muon.", domain="[0, inf)")
  muon_params: str = config_field("all_matrices", "Which leaves get Muon (the rest "
                                  "momentum-SGD at Muon's lr): all ndim>=2 (Temperon) or "
                                  "hidden matrices only.", choices=("all_matrices", "hidden"))
  ns_dtype: str = config_field("bf16", "Newton-Schulz dtype.", choices=("bf16", "fp32"))
  momentum: float = config_field(0.9, "Momentum of SGD and Muon (Nesterov).", domain="[0, 1)")
  rho_ramp_steps: int = config_field(40, "SAM rho ramps linearly from 0 over this many "
                                     "steps from the start of its phase.", domain="[0, inf)")
  grad_clip: float = config_field(2.0, "Clip the global gradient norm (0: off).",
                                  domain="[0, inf)")
  targets: str = config_field("0.95,0.97,0.98", "Comma-separated test accuracies to time.")
  eval_every: int = periodic_field("eval_every", 20, domain="[1, inf)")
  log_every: int = periodic_field("log_every", 10)
  checkpoint_every: int = periodic_field("checkpoint_every", 0)
  progress_every_s: float = periodic_field("progress_every_s", 10.0)

  def __post_init__(self):
    check_fields(self)  # every field in its declared domain
    for name in ("num_steps", "batch_size", "width", "num_stages", "blocks_per_stage",
                 "n_cycles", "eval_every"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
    if self.refiner != "none" and not 0 < self.switch_step() < self.num_steps:
      raise ValueError(f"handoff_fraction {self.handoff_fraction} leaves an empty phase "
                       f"with num_steps={self.num_steps}")
    if self.sam_steps != "all" and (self.refiner != "none"
                                    or not self.explorer.endswith("_sam")):
      raise ValueError(f"sam_steps={self.sam_steps!r} needs a one-phase SAM run "
                       f"(refiner=none, explorer *_sam), got explorer={self.explorer!r}, "
                       f"refiner={self.refiner!r}")
    if self.sam_steps != "all" and not 0 < self.sam_start() < self.num_steps:
      raise ValueError(f"handoff_fraction {self.handoff_fraction} leaves no SAM steps or "
                       f"no plain ones with num_steps={self.num_steps}")
    for t in self.target_list():
      if not 0.0 < t <= 1.0:
        raise ValueError(f"targets must be in (0, 1], got {t}")

  def switch_step(self) -> int:
    """The first step of the refiner (num_steps if there is none)."""
    if self.refiner == "none":
      return self.num_steps
    return int(round(self.handoff_fraction * self.num_steps))

  def sam_start(self) -> int:
    """round(handoff_fraction * num_steps): the handoff's step, whatever the refiner."""
    return int(round(self.handoff_fraction * self.num_steps))

  def sam_active(self, step):
    """Whether step ``step`` (0-based; a Python int or a traced int32) of a one-phase
    SAM run takes the SAM pass under ``sam_steps``."""
    if self.sam_steps == "late":
      return step >= self.sam_start()
    if self.sam_steps == "periodic":  # k of n steps, evenly: step i iff floor moves
      k, n = self.num_steps - self.sam_start(), self.num_steps
      return (step + 1) * k // n > step * k // n
    return step >= 0

  def target_list(self) -> tuple[float, ...]:
    return tuple(float(t) for t in self.targets.split(",") if t.strip())

  def grad_evals(self, step: int) -> int:
    """Gradient evaluations of step ``step`` (0-based): SAM's two, else one."""
    kind = self.explorer if step < self.switch_step() else self.refiner
    return 2 if kind.endswith("_sam") and bool(self.sam_active(step)) else 1


def make_phase(config: TemperonConfig, kind: str, horizon: int, schedule: str,
               warmup: int) -> optax.GradientTransformation:
  """One phase's optimizer: its LR schedule counts the phase's own steps."""
  sched = optim.warm_restarts_schedule if schedule == "restarts" else optim.cosine_schedule
  kwargs = {"n_cycles": config.n_cycles, "t_mult": config.t_mult} \
      if schedule == "restarts" else {}
  clip = [optax.clip_by_global_norm(config.grad_clip)] if config.grad_clip > 0 else []
  if kind.startswith("sgd"):
    lr = sched(config.sgd_lr, horizon, warmup_steps=warmup, **kwargs)
    # torch-style SGD: decay enters the gradient before momentum, as in the paper's explorer
    base = optax.chain(*clip, optax.add_decayed_weights(config.sgd_weight_decay),
                       optax.trace(config.momentum, nesterov=True),
                       optax.scale_by_learning_rate(lr))
    rho = config.sgd_rho
  else:
    lr = sched(config.muon_lr, horizon, warmup_steps=warmup, **kwargs)
    labels = (optim.all_matrices_labels if config.muon_params == "all_matrices"
              else optim.default_param_labels)
    base = optax.chain(*clip, optim.muon(lr, momentum=config.momentum,
                                         weight_decay=config.muon_weight_decay,
                                         ns_dtype=config.ns_dtype, label_fn=labels))
    rho = config.muon_rho
  if not kind.endswith("_sam"):
    return base
  if config.sam_steps == "all":
    return optim.sam(base, optax.linear_schedule(0.0, rho, max(config.rho_ramp_steps, 1)))
  # one phase: SAM's count is the run's step; the late phase ramps rho from its start
  begin = config.sam_start() if config.sam_steps == "late" else 0
  return optim.sam(base, optax.linear_schedule(0.0, rho, max(config.rho_ramp_steps, 1),
                                               transition_begin=begin),
                   active=config.sam_active)


def make_optimizer(config: TemperonConfig) -> optax.GradientTransformationExtraArgs:
  """The whole run's optimizer (``update`` takes ``grad_fn=`` for SAM's second pass)."""
  if config.refiner == "none":
    return optax.with_extra_args_support(make_phase(
        config, config.explorer, config.num_steps, config.explorer_schedule,
        config.warmup_steps))
  switch = config.switch_step()
  first = make_phase(config, config.explorer, switch, config.explorer_schedule,
                     config.warmup_steps)
  second = make_phase(config, config.refiner, config.num_steps - switch, "cosine",
                      config.rewarmup_steps)
  return optim.handoff(first, second, switch, transfer=config.transfer)


def hparams_of(config: TemperonConfig) -> dict[str, Any]:
  return dataclasses.asdict(config)


def steps_to_targets(curve: list[tuple[int, float]], targets: tuple[float, ...]
                     ) -> dict[float, float]:
  """First evaluated step whose accuracy reaches each target (NaN: never).

  Not interpolated: the paper counts epochs to a target at evaluation points. The
  1e-6 slack keeps a target such as 0.97 reachable by an accuracy k/n that rounds to
  it in float32."""
  out = {}
  for t in targets:
    s = curves.steps_to_target(curve, t - 1e-6, higher_is_better=True, interpolate=False)
    out[t] = math.nan if s is None else s
  return out


def step_kind(config: TemperonConfig, step: int) -> tuple[int, int]:
  """(phase, gradient evaluations) of a step: the steps that cost the same."""
  return int(step >= config.switch_step()), config.grad_evals(step)


def calibrated_seconds(config: TemperonConfig, steps: float,
                       kind_s: dict[tuple[int, int], float]) -> float:
  """Seconds to run ``steps`` steps at each step kind's median measured s/step (the
  paper's epochs-to-target x calibrated s/epoch, per step; kinds: :func:`step_kind`)."""
  if not math.isfinite(steps):
    return math.nan
  return float(sum(kind_s.get(step_kind(config, s), math.nan) for s in range(int(steps))))


def task_data(config: TemperonConfig
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(train images, train labels, test images, test labels) of a run.

  One fixed shuffle of the 1797 digits (every run trains on the same first
  ``train_examples`` training images); ``label_noise`` then relabels
  ``round(label_noise * n)`` of them, chosen with the seed, to a uniformly drawn other
  class; the test set is the fixed split or every image not trained on."""
  splits = digits.load_digits_splits(seed=0)
  n = config.train_examples or len(splits.train_labels)
  train_images, train_labels = splits.train_images[:n], splits.train_labels[:n].copy()
  test_images, test_labels = splits.test_images, splits.test_labels
  if config.test_set == "rest":
    test_images = np.concatenate([test_images, splits.train_images[n:]])
    test_labels = np.concatenate([test_labels, splits.train_labels[n:]])
  if config.label_noise:
    rng = np.random.default_rng([config.seed, 0x1abe1])
    flip = rng.permutation(n)[:int(round(config.label_noise * n))]
    train_labels[flip] = (train_labels[flip] + rng.integers(1, 10, size=len(flip))) % 10
  return train_images, train_labels, test_images, test_labels


def make_train_step(config: TemperonConfig):
  """``(init, step)``: ``init(key) -> (TrainState, loop key)``, ``step(state, batch, key)
  -> (state, metrics)`` jitted with the state donated, and ``loss_fn`` behind them."""
  model = ResNet(ResNetConfig(width=config.width, num_stages=config.num_stages,
                              blocks_per_stage=config.blocks_per_stage))
  optimizer = make_optimizer(config)

  def loss_fn(params, batch):
    logits = model.apply({"params": params}, batch["images"])
    return classification_loss(logits, batch["labels"])

  def train_step(state: TrainState, batch, key):
    del key  # the model is deterministic
    (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
    grad_fn = jax.grad(lambda p: loss_fn(p, batch)[0])  # SAM's second pass, same batch
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params,
                                          grad_fn=grad_fn)
    params = optax.apply_updates(state.params, updates)
    metrics = {"loss": loss, "accuracy": accuracy, "grad_norm": optax.tree.norm(grads),
               "param_norm": optax.tree.norm(params), "update_norm": optax.tree.norm(updates),
               "phase": (state.step >= config.switch_step()).astype(jnp.float32)}
    return TrainState(state.step + 1, params, opt_state), metrics

  @jax.jit
  def init(key):
    init_key, loop_key = jax.random.split(key)
    params = model.init(init_key, jnp.zeros((1, 8, 8, 1), jnp.float32))["params"]
    return init_train_state(params, optimizer), loop_key

  return init, jax.jit(train_step, donate_argnums=(0,)), loss_fn


def train_and_evaluate(config: TemperonConfig, options: RunOptions) -> dict[str, Any]:
  """Trains and evaluates one run; returns its summary (metrics and paths)."""
  options = resolve_run_options(options, EXPERIMENT, config)
  train_images, train_labels, test_images, test_labels = task_data(config)
  init, jitted_step, loss_fn = make_train_step(config)
  step_times: list[tuple[int, float]] = []

  def timed_step(state, batch, key):
    # Blocking each step costs nothing measurable at this size and gives per-phase s/step.
    step = len(step_times) + start.step
    t = time.perf_counter()
    out = jitted_step(state, batch, key)
    jax.block_until_ready(out[1]["loss"])
    step_times.append((step, time.perf_counter() - t))
    return out

  def fresh() -> Snapshot:
    state, rng = init(jax.random.PRNGKey(config.seed))
    return Snapshot(state=state, rng=rng, step=0, data_position=0)

  test_batch = {"images": jnp.asarray(test_images), "labels": jnp.asarray(test_labels)}
  eval_fn = jax.jit(loss_fn)

  def evaluate(state: TrainState) -> dict[str, float]:
    loss, accuracy = jax.device_get(eval_fn(state.params, test_batch))
    return {"loss": float(loss), "accuracy": float(accuracy), "error": 1.0 - float(accuracy)}

  def batch_at(position: int):
    return digits.train_batch(train_images, train_labels, seed=config.seed,
                              position=position, batch_size=config.batch_size)

  with run_lib.open_run(EXPERIMENT, config, options, hparams=hparams_of(config)) as run:
    start = run.restore(fresh)
    writer = run.writer
    n_params = sum(x.size for x in jax.tree.leaves(start.state.params))
    logging.info("model: %d parameters; explorer %s -> refiner %s at step %d of %d",
                 n_params, config.explorer, config.refiner, config.switch_step(),
                 config.num_steps)

    settings = run.settings(config.num_steps, every_step_scalars=False,
                            # 3x the loss of a uniform guess of the 10 digits
                            max_healthy_loss=3 * math.log(10))
    t0 = time.time()
    result = run_loop(start=start, train_step=timed_step, batch_at=batch_at,
                      settings=settings, writer=writer, checkpointer=run.checkpointer,
                      evaluate=evaluate)

    # Median s/step per step kind (phase, gradient evaluations), leaving out each
    # kind's first step in this process (it compiles).
    by_kind: dict[tuple[int, int], list[float]] = {}
    for s, dt in step_times:
      by_kind.setdefault(step_kind(config, s), []).append(dt)
    kind_s = {k: float(np.median(ts[1:] or ts)) for k, ts in by_kind.items()}
    for s, dt in step_times[1:]:
      if config.log_every and s % config.log_every == 0:  # 0: train metrics at the end only
        writer.write_scalars(s + 1, {"perf/step_s": dt})
    writer.flush()

    metrics = loop_metrics(result)
    curve = read_scalars(options.workdir).get("eval/accuracy", [])
    evals = sum(config.grad_evals(s) for s in range(config.num_steps))
    metrics["cost/grad_evals_per_step"] = evals / config.num_steps
    for phase in (0, 1):
      metrics[f"cost/phase{phase}_s_per_step"] = float(np.mean(
          [kind_s.get(step_kind(config, s), math.nan) for s in range(config.num_steps)
           if step_kind(config, s)[0] == phase] or [math.nan]))
    metrics["cost/total_s"] = calibrated_seconds(config, config.num_steps, kind_s)
    for t, s in steps_to_targets(curve, config.target_list()).items():
      metrics[f"steps_to/{t:g}"] = s
      metrics[f"grad_evals_to/{t:g}"] = (sum(config.grad_evals(i) for i in range(int(s)))
                                         if math.isfinite(s) else math.nan)
      metrics[f"time_to/{t:g}"] = calibrated_seconds(config, s, kind_s)
      metrics[f"reached/{t:g}"] = float(math.isfinite(s))
    summary = run_summary(EXPERIMENT, options, config, result, start_time=t0,
                          num_params=n_params, resumed_from_step=start.step,
                          metrics=metrics)
    return run.finish(summary, completed=result.completed, step=result.snapshot.step)
