"""A sweep: a base config plus axes (ablation arms x seeds), expanded to one run per point.

Each run's flags list EVERY config field (not just the overrides), so a manifest line
reproduces its run even after the experiment's defaults change.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import sys
from typing import Any, Mapping, Sequence

from experiments.common.config_flags import config_to_flags, replace_checked


@dataclasses.dataclass(frozen=True)
class Arm:
  """One ablation arm: a name and the config fields it changes."""

  name: str
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Sweep:
  """An ablation: ``arms x seeds`` runs of ``module`` from ``base``.

  Attributes:
    name: the sweep's registry name.
    module: the experiment entry point, run as ``python -m <module>``.
    base: the experiment's config instance every run starts from.
    arms: the ablation arms; ``baseline`` names the one differences are taken against.
    seeds: each arm runs once per seed (set in the config field ``seed_field``).
    metrics: result metrics the report tabulates (lower is better unless listed in
      ``higher_is_better``); the first is the headline metric.
    curves: TensorBoard scalar tags the report plots.
    appendix: ``"module:function"``; ``function(sweep_dir) -> markdown`` is appended
      to the report (sweep-specific tables computed from the runs' events).
  """

  name: str
  module: str
  base: Any
  arms: tuple[Arm, ...]
  seeds: tuple[int, ...]
  baseline: str
  metrics: tuple[str, ...] = ("eval/loss",)
  higher_is_better: tuple[str, ...] = ()
  curves: tuple[str, ...] = ("train/loss", "eval/loss")
  seed_field: str = "seed"
  description: str = ""
  appendix: str = ""

  def __post_init__(self):
    names = [a.name for a in self.arms]
    if not names:
      raise ValueError(f"sweep {self.name!r} has no arms")
    if len(set(names)) != len(names):
      raise ValueError(f"sweep {self.name!r} has duplicate arm names: {names}")
    if self.baseline not in names:
      raise ValueError(f"baseline {self.baseline!r} is not one of the arms {names}")
    if self.appendix and self.appendix.count(":") != 1:
      raise ValueError(f"appendix must be 'module:function', got {self.appendix!r}")
    if not self.seeds or len(set(self.seeds)) != len(self.seeds):
      raise ValueError(f"sweep {self.name!r} needs distinct seeds, got {self.seeds}")
    for arm in self.arms:  # fail at declaration, not halfway through a launch
      replace_checked(self.base, {**arm.overrides, self.seed_field: self.seeds[0]})


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One manifest line."""

  index: int
  run_name: str
  arm: str
  seed: int
  workdir: str
  results_file: str
  config: dict[str, Any]
  command: tuple[str, ...]

  def shell_command(self) -> str:
    return " ".join(shlex.quote(c) for c in self.command)


def run_name(arm: str, seed: int, config: Mapping[str, Any]) -> str:
  """``<arm>-s<seed>-<hash of the full config>``: readable, unique per point, and new
  whenever anything in the config changes (so a rerun never resumes a different run)."""
  digest = hashlib.sha1(json.dumps(dict(config), sort_keys=True, default=str).encode())
  return f"{arm}-s{seed}-{digest.hexdigest()[:6]}"


def expand(sweep: Sweep, sweep_dir: str, extra_overrides: Mapping[str, Any] | None = None,
           python: str = sys.executable) -> list[RunSpec]:
  """The runs of ``sweep`` (arm-major, then seed), with workdirs under ``sweep_dir/runs``.

  ``extra_overrides`` apply to every run after the arm's (e.g. fewer steps for a check).
  """
  sweep_dir = os.path.abspath(sweep_dir)
  results_file = os.path.join(sweep_dir, "results.jsonl")
  extra = dict(extra_overrides or {})
  runs = []
  for arm in sweep.arms:
    for seed in sweep.seeds:
      overrides = {**arm.overrides, **extra, sweep.seed_field: seed}
      config = replace_checked(sweep.base, overrides)
      name = run_name(arm.name, seed, dataclasses.asdict(config))
      workdir = os.path.join(sweep_dir, "runs", name)
      command = (python, "-m", sweep.module, *config_to_flags(config),
                 f"--workdir={workdir}", f"--run_name={name}",
                 f"--results_file={results_file}", "--resume")
      runs.append(RunSpec(len(runs), name, arm.name, seed, workdir, results_file,
                          dataclasses.asdict(config), command))
  return runs


def write_manifest(sweep: Sweep, runs: Sequence[RunSpec], sweep_dir: str) -> str:
  """Writes ``manifest.jsonl`` (one run per line) and ``sweep.json``; returns the manifest."""
  from experiments.common.run_metadata import git_state  # pylint: disable=import-outside-toplevel
  os.makedirs(sweep_dir, exist_ok=True)
  path = os.path.join(sweep_dir, "manifest.jsonl")
  with open(path, "w") as f:
    for r in runs:
      f.write(json.dumps({**dataclasses.asdict(r), "command": list(r.command),
                          "shell": r.shell_command()}, sort_keys=True) + "\n")
  info = {"name": sweep.name, "module": sweep.module, "baseline": sweep.baseline,
          "arms": [{"name": a.name, "overrides": dict(a.overrides)} for a in sweep.arms],
          "seeds": list(sweep.seeds), "metrics": list(sweep.metrics),
          "higher_is_better": list(sweep.higher_is_better), "curves": list(sweep.curves),
          "seed_field": sweep.seed_field, "description": sweep.description,
          "appendix": sweep.appendix,
          "base": dataclasses.asdict(sweep.base), "git": git_state(), "num_runs": len(runs)}
  with open(os.path.join(sweep_dir, "sweep.json"), "w") as f:
    json.dump(info, f, indent=2, sort_keys=True)
  return path


def read_manifest(sweep_dir: str) -> list[dict[str, Any]]:
  path = os.path.join(sweep_dir, "manifest.jsonl")
  if not os.path.exists(path):
    raise FileNotFoundError(f"no manifest.jsonl in {sweep_dir}; run launch.sweep first")
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def read_sweep_info(sweep_dir: str) -> dict[str, Any]:
  path = os.path.join(sweep_dir, "sweep.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"no sweep.json in {sweep_dir}; run launch.sweep first")
  with open(path) as f:
    return json.load(f)


def swept_hparams(sweep: Sweep, runs: Sequence[RunSpec]) -> dict[str, list[Any]]:
  """Config fields whose value differs between runs -> the values they take."""
  values: dict[str, list[Any]] = {}
  for r in runs:
    for k, v in r.config.items():
      values.setdefault(k, [])
      if v not in values[k]:
        values[k].append(v)
  return {k: v for k, v in values.items() if len(v) > 1}

