"""Memoir in miniature: coupled vs read-only pondering on associative recall.

    python -m experiments.memoir --mode=read_only   # ~30 s on one CPU core (~8 s cached)
    python -m experiments.memoir --mode=coupled --num_steps=960 --workdir=runs/memoir/c960

The model and its design notes (what is the paper's, what is ours) are in
``models/memoir.py``; the task in ``experiments/memoir/recall_task.py``; the sweeps in
``experiments/memoir/sweeps.py``. ``--mode=no_write`` is the control without write heads
(pass ``--d_hidden=346`` to match the coupled arm's parameters, as the sweep does). Writes TensorBoard events (``train/*``, ``eval/recall``,
``eval/energy_margin``), ``config.json``, an orbax checkpoint at the end (and every
``checkpoint_every`` steps) and, when the run completes, one row in ``--results_file``.

The script enables JAX's persistent compilation cache, as every experiment script does
(``$JAX_COMPILATION_CACHE_DIR``, default ``~/.cache/lowprec/jax_cache_memoir``). The task
defaults (8 pairs, shared 0.3, query noise 0.1, lr 1e-3) were picked from four
single-seed calibration runs so that 240 steps fall near the sharp rise in recall
(chance -> ~0.95 between steps 120 and 240 in a 960-step schedule), i.e. where a
learning-speed difference can show.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import jax
import numpy as np
import optax
from absl import logging

from experiments.memoir import recall_task
from experiments.common.harness.checkpoint import Snapshot
from experiments.common.harness.config_flags import SEED_DOMAIN, check_fields, config_field
from experiments.common.evidence.results import run_summary
from experiments.common.harness import run as run_lib
from experiments.common.harness.run_options import RunOptions, resolve_run_options
from experiments.common.harness.train_loop import (TrainState, init_train_state, make_train_step,
                                                   periodic_field, run_loop, without_quant_state)
from lowprec.models import memoir as memoir_lib

EXPERIMENT = "memoir"


@dataclasses.dataclass(frozen=True)
class MemoirExperimentConfig:
  """Everything that defines a Memoir run's result (its flags; written to config.json)."""

  mode: str = config_field("read_only", "Pondering mode: coupled rewrites the fast memory "
                           "it reads; read_only keeps it fixed.", choices=memoir_lib.MODES)
  halting: str = config_field("ponder", "ponder: learned PonderNet halting; fixed: always "
                              "max_steps.", choices=memoir_lib.HALTINGS)
  seed: int = config_field(0, "Seed of parameter init, data and per-step keys.",
                           domain=SEED_DOMAIN)
  num_pairs: int = config_field(8, "Key-value pairs written per sample.", domain="[1, inf)")
  key_dim: int = config_field(32, "Dimension of the task's keys.", domain="[1, inf)")
  num_values: int = config_field(16, "Distinct value ids (recall chance is 1/num_values).",
                                 domain="[2, inf)")
  num_groups: int = config_field(3, "Prototype directions keys share within a sample.",
                                 domain="[1, inf)")
  shared: float = config_field(0.3, "Squared weight of the shared prototype in each key.",
                               domain="[0, 1)")
  query_noise: float = config_field(0.1, "Norm of the Gaussian noise added to the query.",
                                    domain="[0, inf)")
  d_latent: int = config_field(64, "Pondering latent width.", domain="[1, inf)")
  d_mem: int = config_field(32, "Fast memory is d_mem x d_mem.", domain="[1, inf)")
  d_hidden: int = config_field(320, "Hidden width of the pondering core.", domain="[1, inf)")
  d_pred: int = config_field(128, "Hidden width of the energy predictor.", domain="[1, inf)")
  max_steps: int = config_field(4, "Pondering iterations N.", domain="[1, inf)")
  prior_lambda: float = config_field(0.3, "Halting prior Geometric(prior_lambda).",
                                     domain="(0, 1)")
  kl_weight: float = config_field(0.01, "Weight of KL(halting || prior).", domain="[0, inf)")
  energy_weight: float = config_field(0.1, "Weight of the energy hinge loss.",
                                      domain="[0, inf)")
  energy_margin: float = config_field(1.0, "Hinge margin between E(neg) and E(pos).",
                                      domain="[0, inf)")
  batch_size: int = config_field(64, "Samples per step.", domain="[2, inf)")
  num_steps: int = config_field(240, "Training steps.", domain="[1, inf)")
  schedule_steps: int = config_field(0, "Length of the warmup + cosine schedule (0: "
                                     "num_steps). Larger than num_steps stops that "
                                     "schedule early: a short budget on the long run's "
                                     "schedule.", domain="[0, inf)")
  learning_rate: float = config_field(1e-3, "Peak AdamW learning rate.", domain="(0, inf)")
  warmup_fraction: float = config_field(0.05, "Warmup as a fraction of the schedule, then "
                                        "cosine decay to 10% (so budgets share a shape).",
                                        domain="[0, 1)")
  weight_decay: float = config_field(0.01, "AdamW decoupled weight decay.", domain="[0, inf)")
  grad_clip: float = config_field(1.0, "Clip the global gradient norm (0: off).",
                                  domain="[0, inf)")
  eval_every: int = periodic_field("eval_every", 40)
  eval_batches: int = config_field(8, "Fixed evaluation batches of batch_size samples.",
                                   domain="[1, inf)")
  log_every: int = periodic_field("log_every", 10)
  checkpoint_every: int = periodic_field("checkpoint_every", 0)
  progress_every_s: float = periodic_field("progress_every_s", 10.0)

  def __post_init__(self):
    check_fields(self)  # every field in its declared domain
    for name in ("batch_size", "num_steps", "eval_batches"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
    if self.batch_size < 2:
      raise ValueError("batch_size must be >= 2 (the energy's negatives come from the batch)")
    if self.schedule_steps and self.schedule_steps < self.num_steps:
      raise ValueError(f"schedule_steps={self.schedule_steps} is shorter than num_steps="
                       f"{self.num_steps}: the run would train past its schedule's end "
                       "(0 means the schedule spans num_steps)")
    if not 0.0 <= self.warmup_fraction < 1.0:
      raise ValueError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction}")

  def task(self) -> recall_task.RecallTaskSpec:
    return recall_task.RecallTaskSpec(
        num_pairs=self.num_pairs, key_dim=self.key_dim, num_values=self.num_values,
        num_groups=self.num_groups, shared=self.shared, query_noise=self.query_noise)

  def model(self) -> memoir_lib.MemoirConfig:
    return memoir_lib.MemoirConfig(
        key_dim=self.key_dim, num_values=self.num_values, d_latent=self.d_latent,
        d_mem=self.d_mem, d_hidden=self.d_hidden, d_pred=self.d_pred,
        max_steps=self.max_steps, mode=self.mode, halting=self.halting,
        prior_lambda=self.prior_lambda, kl_weight=self.kl_weight,
        energy_weight=self.energy_weight, energy_margin=self.energy_margin)


def make_optimizer(config: MemoirExperimentConfig) -> optax.GradientTransformation:
  """AdamW, linear warmup + cosine decay to 10% over ``schedule_steps`` (default
  ``num_steps``), optional global-norm clipping."""
  length = config.schedule_steps or config.num_steps
  warmup = max(int(round(config.warmup_fraction * length)), 1)
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, config.learning_rate, warmup, max(length, warmup + 1),
      end_value=0.1 * config.learning_rate)
  adam = optax.adamw(schedule, weight_decay=config.weight_decay)
  return optax.chain(optax.clip_by_global_norm(config.grad_clip), adam) \
      if config.grad_clip > 0 else adam


def _model_inputs(batch):
  return batch["keys"], batch["values"], batch["query"]


def train_and_evaluate(config: MemoirExperimentConfig, options: RunOptions) -> dict[str, Any]:
  """Trains and evaluates one Memoir run; returns its summary (metrics and paths)."""
  options = resolve_run_options(options, EXPERIMENT, config)
  task = config.task()
  model_config = config.model()
  model = memoir_lib.Memoir(model_config)
  optimizer = make_optimizer(config)

  def loss_fn(params, batch, key):
    del key  # the model is deterministic given the batch
    outputs = model.apply({"params": params}, *_model_inputs(batch))
    return memoir_lib.memoir_loss(model_config, outputs, batch["target"])

  example = recall_task.recall_batch(seed=config.seed, position=0, batch_size=2, spec=task)

  @jax.jit
  def init(key):
    init_key, loop_key = jax.random.split(key)
    params = model.init(init_key, *_model_inputs(example))["params"]
    return init_train_state(params, optimizer), loop_key

  def fresh() -> Snapshot:
    state, rng = init(jax.random.PRNGKey(config.seed))
    return Snapshot(state=state, rng=rng, step=0, data_position=0)

  @jax.jit
  def eval_step(params, batch):
    return loss_fn(params, batch, None)[1]

  # The evaluation set depends on the seed only, so both arms see the same queries.
  eval_data = [jax.device_put(b) for b in recall_task.eval_batches(
      seed=config.seed, num_batches=config.eval_batches, batch_size=config.batch_size,
      spec=task)]

  def evaluate(state: TrainState) -> dict[str, float]:
    results = jax.device_get([eval_step(state.params, b) for b in eval_data])
    names = ("recall", "energy_margin", "e_pos", "e_neg", "ce", "expected_depth",
             "memory_drift")
    return {n: float(np.mean([r[n] for r in results])) for n in names}

  def batch_at(position: int):
    return jax.device_put(recall_task.recall_batch(
        seed=config.seed, position=position, batch_size=config.batch_size, spec=task))

  with run_lib.open_run(EXPERIMENT, config, options) as run:
    macs = memoir_lib.forward_macs(model_config, config.num_pairs)
    start = run.restore(fresh, metadata=lambda s: {
        "num_params": memoir_lib.count_params(s.state.params),
        "forward_macs_per_sample": macs})
    n_params = memoir_lib.count_params(start.state.params)
    logging.info("memoir %s: %d parameters, %d forward MACs/sample", config.mode, n_params,
                 macs)
    settings = run.settings(config.num_steps, every_step_scalars=False,
                            # 3x the loss of a uniform guess of the value class
                            max_healthy_loss=3 * math.log(config.num_values))
    t0 = time.time()
    train_step = make_train_step(without_quant_state(loss_fn), optimizer)
    result = run_loop(start=start, train_step=train_step,
                      batch_at=batch_at, settings=settings, writer=run.writer,
                      checkpointer=run.checkpointer, evaluate=evaluate)
    summary = run_summary(EXPERIMENT, options, config, result, start_time=t0,
                          num_params=n_params, resumed_from_step=start.step,
                          forward_macs_per_sample=macs)
    run.finish(summary, completed=result.completed, step=result.snapshot.step)
  return summary

