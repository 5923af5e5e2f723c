"""Fair Cast in miniature: what the sampler serves versus what the learner trains.

    python -m experiments.fair_cast                                    # nearest export
    python -m experiments.fair_cast --export_rounding=stochastic
    python -m experiments.fair_cast --export_rounding=error_feedback --loss_on_served

GRPO on 3-digit addition (the shared RL loop of
:mod:`experiments.common.trainers.rl.loop`) with float32 master weights and a sampler that serves a bf16 (``--export_format``) copy, exported
from the masters at every update (``refresh_interval`` 1) with
:func:`numerics.export.export`: ``nearest`` (round half to even: updates smaller than
half an ulp never reach the sampler), ``stochastic`` (unbiased) or ``error_feedback``
(the residual is part of the checkpointed training state). ``--loss_on_served``
computes the learner's loss on the served copy with a straight-through gradient to the
masters (:func:`numerics.export.straight_through`), so learner and sampler log-probs
agree. ``--master_on_grid`` (default) starts the masters on the served grid, as an RL
run that starts from a bf16 checkpoint does.

Logged at every sync, under ``export/``:

* ``unchanged_fraction``: served elements bit-identical to the previous export;
* ``lag_steps`` (global and per tensor, every ``lag_every`` updates): the effective
  lag ``k* = argmin_k ||served_t - master_{t-k}||_2`` over the last ``lag_history``
  updates -- how many updates old the master is that the served copy looks like (0: up
  to date; the cap ``lag_history`` means "at least that");
* ``visible_displacement``: ``||served_t - served_0|| / ||master_t - master_0||``, the
  share of the masters' movement since the start that the sampler sees;
* ``ulp_mean``/``ulp_max``: ``|master - served|`` in ulps of the served grid;
  ``relative_drift``: ``||served - master|| / ||master||``;
* ``master_step_rms``: root-mean-square master change per update (to compare Adam
  and SGD with momentum at the learning rates swept).

The per-update wall time is ``perf/update_s``: the export, this monitor's metrics (the
same work for every export rounding; the lag k* only every ``lag_every`` updates),
sampling and the update.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.common.harness.config_flags import config_field
from experiments.common.harness.run_options import RunOptions
from experiments.common.trainers.rl import config as rl_config
from experiments.common.trainers.rl import loop
from lowprec.numerics import export as export_lib
from lowprec.numerics import tree_paths

EXPERIMENT = "fair_cast"
OPTIMIZERS = ("adam", "sgdm")


@dataclasses.dataclass(frozen=True)
class FairCastConfig(rl_config.RLConfig):
  """The RL run of :class:`StaleSamplerConfig` with a float32 master and a served copy."""

  refresh_interval: int = config_field(1, "Export to the sampler every K updates.",
                                       domain="[1, inf)")
  learning_rate: float = config_field(1e-5, "Learner learning rate (constant).",
                                      domain="(0, inf)")
  export_format: str = config_field("bf16", "Served element format (numerics.formats).")
  export_rounding: str = config_field("nearest", "Export rounding.",
                                      choices=export_lib.EXPORT_ROUNDINGS)
  loss_on_served: bool = config_field(
      False, "Compute the loss on the served copy (straight-through to the masters).")
  optimizer_kind: str = config_field("adam", "adam, or SGD with momentum (sgdm).",
                                     choices=OPTIMIZERS)
  momentum: float = config_field(0.9, "SGD momentum (optimizer_kind=sgdm).", domain="[0, 1)")
  master_on_grid: bool = config_field(
      True, "Start the float32 masters on the served grid (as from a bf16 checkpoint).")
  lag_history: int = config_field(256, "Updates of master history for the lag k*.",
                                  domain="[1, inf)")
  lag_every: int = config_field(8, "Compute the lag k* every N updates.", domain="[1, inf)")

  def __post_init__(self):
    super().__post_init__()
    self.export_spec  # pylint: disable=pointless-statement  (validates the format)
    if self.sampler_dtype != "float32":
      raise ValueError("fair_cast serves --export_format; leave --sampler_dtype at "
                       "float32")
    if self.loss_on_served and self.refresh_interval != 1:
      raise ValueError("loss_on_served computes the loss on the sampler's copy, which is "
                       "the export of the current masters only with refresh_interval=1")
    if self.lag_history < 1 or self.lag_every < 1:
      raise ValueError("lag_history and lag_every must be >= 1")
    if self.optimizer_kind not in OPTIMIZERS:
      raise ValueError(f"optimizer_kind must be one of {OPTIMIZERS}, got "
                       f"{self.optimizer_kind!r}")
    if not 0.0 <= self.momentum < 1.0:
      raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")

  @property
  def export_spec(self) -> export_lib.ExportSpec:
    return export_lib.ExportSpec(self.export_format,
                                 export_lib.parse_rounding(self.export_rounding))

  def optimizer(self) -> optax.GradientTransformation:
    if self.optimizer_kind == "sgdm":
      return optax.sgd(self.learning_rate, momentum=self.momentum)
    return optax.adam(self.learning_rate)

  def exporter(self) -> rl_config.Exporter:
    spec = self.export_spec
    stochastic = spec.rounding.needs_key
    return rl_config.Exporter(
        init=lambda master: export_lib.init_export_state(master, spec),
        export=lambda master, state, key: export_lib.export(
            master, spec, state, key=key if stochastic else None))

  def initial_master(self, params: Any) -> Any:
    if not self.master_on_grid:
      return params
    nearest = export_lib.make_export(export_lib.ExportSpec(self.export_format))
    return jax.tree.map(lambda x: x.astype(jnp.float32), nearest(params))

  def loss_params(self, master: Any, served: Any) -> Any:
    return export_lib.straight_through(master, served) if self.loss_on_served else master

  def sync_monitor(self) -> rl_config.SyncMonitor:
    return ExportMonitor(self).monitor()

  def summary_metrics(self, scalars: dict[str, list[tuple[int, float]]], done: int
                      ) -> dict[str, float]:
    """The export's effect as results-row metrics (what the sweep's claims compare):

    * ``export/lag_second_half``: the effective lag k* (updates), mean over its
      measurements in the second half of the ``done`` updates (where it has built up);
    * ``export/lag_capped_fraction``: the share of those measurements at the most the
      history could show (``min(update, lag_history)`` syncs): a k* there means "at
      least that";
    * ``export/unchanged_mean``: the fraction of served elements bit-identical to the
      previous export, mean over training;
    * ``mismatch/k3_mean_over_training``: the sampler-learner k3 on the sampled tokens.
    """
    lag = [(s, v) for s, v in scalars.get("export/lag_steps", []) if s > done / 2]
    # A sync's metrics are logged at step update + 1; at update u the history holds the
    # masters of updates 0..u (at most lag_history + 1 of them).
    cap = lambda step: min(step - 1, self.lag_history) * self.refresh_interval
    return {
        "export/lag_second_half": rl_config.curve_mean(lag),
        "export/lag_capped_fraction": (sum(v >= cap(s) for s, v in lag) / len(lag)
                                       if lag else float("nan")),
        "export/unchanged_mean": rl_config.curve_mean(
            scalars.get("export/unchanged_fraction", [])),
        "mismatch/k3_mean_over_training": rl_config.curve_mean(
            scalars.get("train/mismatch_k3", []))}


def _squared_distance(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
  """Sum over tensors of ``||a[n] - b[n]||^2`` (flattened float32 leaves)."""
  return sum(float(np.sum((a[n] - b[n]) ** 2)) for n in a)


class ExportMonitor:
  """Host-side export metrics at every sync (see the module docstring)."""

  def __init__(self, config: FairCastConfig):
    self.config = config
    self.spec = config.export_spec
    self.history: list[dict[str, np.ndarray]] = []  # masters at the last syncs
    self.first: tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None = None

  def monitor(self) -> rl_config.SyncMonitor:
    return rl_config.SyncMonitor(on_sync=self.on_sync)

  @staticmethod
  def _flat(tree: Any) -> dict[str, np.ndarray]:
    return {n: np.asarray(leaf, np.float32).ravel()
            for n, leaf in tree_paths.named_leaves(tree).items()}

  def on_sync(self, update: int, master: Any, previous: Any, current: Any
              ) -> dict[str, float]:
    m, s = self._flat(master), self._flat(current.params)
    out = {"export/relative_drift":
           float(export_lib.relative_drift(master, current.params)[export_lib.GLOBAL])}
    ulp = export_lib.ulp_distance(master, current.params, self.spec)[export_lib.GLOBAL]
    out.update({"export/ulp_mean": float(ulp["mean"]), "export/ulp_max": float(ulp["max"])})
    if previous is not None:
      out["export/unchanged_fraction"] = float(export_lib.unchanged_fraction(
          previous.params, current.params)[export_lib.GLOBAL])
    if self.first is None:
      self.first = (m, s)
    m0, s0 = self.first
    moved = _squared_distance(m, m0)
    if moved > 0:
      out["export/visible_displacement"] = float(np.sqrt(_squared_distance(s, s0) / moved))
    if self.history:
      n_el = sum(v.size for v in m.values())
      out["export/master_step_rms"] = float(np.sqrt(
          _squared_distance(m, self.history[-1]) / n_el))
    self.history.append(m)
    del self.history[:-(self.config.lag_history + 1)]
    if update % (self.config.lag_every * self.config.refresh_interval) == 0 and update:
      out.update(self._lags(s))
    return out

  def _lags(self, served: dict[str, np.ndarray]) -> dict[str, float]:
    """k* per tensor and over all tensors, in updates (history is newest last)."""
    k_interval = self.config.refresh_interval
    per_k_total = np.zeros(len(self.history))
    out = {}
    for n, s in served.items():
      past = np.stack([h[n] for h in reversed(self.history)])  # [k, n]: k syncs ago
      dist = np.sum((past - s[None, :]) ** 2, axis=1)
      per_k_total += dist
      out[f"export/lag_steps/{n}"] = float(np.argmin(dist) * k_interval)
    out["export/lag_steps"] = float(np.argmin(per_k_total) * k_interval)
    return out


def train_and_evaluate(config: FairCastConfig, options: RunOptions) -> dict[str, Any]:
  """One fair_cast run (the shared RL loop under this experiment's name)."""
  return loop.train_and_evaluate(config, options, experiment=EXPERIMENT)
