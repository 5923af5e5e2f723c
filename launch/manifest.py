"""A declared sweep expanded to one run per (arm, seed), and its manifest on disk.

Each run's flags list EVERY config field (not just the overrides), so a manifest line
reproduces its run even after the experiment's defaults change. Commands are written as
``python -m <module> ...`` with paths relative to the repository root (where a sweep
directory lies inside it) and run from the root, so a committed manifest names no path
of the machine that wrote it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
from typing import Any, Mapping, Sequence

from experiments.common.harness.config_flags import config_to_flags, replace_checked
from experiments.common.harness.repo_paths import repo_relative
from experiments.common.harness.run_metadata import git_state
from experiments.common.sweeps.sweep_spec import Sweep


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One manifest line. ``workdir`` and ``results_file`` are as the command passes them
  (relative to the repository root when inside it); readers of a sweep directory locate
  a run by its name (:func:`experiments.common.sweeps.sweep_data.run_dir`)."""

  index: int
  run_name: str
  arm: str
  seed: int
  workdir: str
  results_file: str
  config: dict[str, Any]
  command: tuple[str, ...]
  calibration: bool = False  # a run on a calibration seed: kept out of the statistics

  def shell_command(self) -> str:
    return " ".join(shlex.quote(c) for c in self.command)


def run_name(arm: str, seed: int, config: Mapping[str, Any]) -> str:
  """``<arm>-s<seed>-<hash of the full config>``: readable, unique per point, and new
  whenever anything in the config changes (so a rerun never resumes a different run)."""
  digest = hashlib.sha1(json.dumps(dict(config), sort_keys=True, default=str).encode())
  return f"{arm}-s{seed}-{digest.hexdigest()[:6]}"


def expand(sweep: Sweep, sweep_dir: str, extra_overrides: Mapping[str, Any] | None = None,
           *, seeds: Sequence[int] | None = None, calibration_runs: Sequence[int] = ()
           ) -> list[RunSpec]:
  """The runs of ``sweep`` (arm-major, then seed), with workdirs under ``sweep_dir/runs``.

  ``extra_overrides`` apply to every run after the arm's (e.g. fewer steps for a check).
  ``seeds``: a subset of the evaluation seeds to run (default all).
  ``calibration_runs``: calibration seeds of the sweep to run too, after each arm's
  evaluation seeds (marked ``calibration``). Commands start with ``python``; a runner
  substitutes its own interpreter.
  """
  seeds = tuple(sweep.seeds if seeds is None else seeds)
  unknown = sorted(set(calibration_runs) - set(sweep.calibration_seeds))
  if unknown or not set(seeds) <= set(sweep.seeds):
    raise ValueError(f"seeds {list(seeds)} / calibration runs {list(calibration_runs)} are "
                     f"not the sweep {sweep.name!r}'s (evaluation {list(sweep.seeds)}, "
                     f"calibration {list(sweep.calibration_seeds)})")
  sweep_dir = repo_relative(sweep_dir)
  results_file = os.path.join(sweep_dir, "results.jsonl")
  extra = dict(extra_overrides or {})
  runs = []
  for arm in sweep.arms:
    for seed in (*seeds, *calibration_runs):
      overrides = {**arm.overrides, **extra, sweep.seed_field: seed}
      config = replace_checked(sweep.base, overrides)
      name = run_name(arm.name, seed, dataclasses.asdict(config))
      workdir = os.path.join(sweep_dir, "runs", name)
      command = ("python", "-m", sweep.module, *config_to_flags(config),
                 f"--workdir={workdir}", f"--run_name={name}",
                 f"--results_file={results_file}", "--resume")
      runs.append(RunSpec(len(runs), name, arm.name, seed, workdir, results_file,
                          dataclasses.asdict(config), command,
                          calibration=seed in calibration_runs))
  return runs


def write_manifest(sweep: Sweep, runs: Sequence[RunSpec], sweep_dir: str, *,
                   overrides: Mapping[str, Any] | None = None) -> str:
  """Writes ``manifest.jsonl`` (one run per line) and ``sweep.json``; returns the manifest.

  ``overrides``: the values every run took over its arm's (``launch.sweep
  --override``, as passed to :func:`expand`). ``sweep.json`` records them, and its
  ``base`` is the declared base with them applied: the config the runs started from.
  """
  overrides = dict(overrides or {})
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
          "appendix": sweep.appendix, "calibration_seeds": list(sweep.calibration_seeds),
          "report_dir": sweep.report_dir, "sweep_dir": repo_relative(sweep_dir),
          "claims": [dataclasses.asdict(c) for c in sweep.claims],
          "base": dataclasses.asdict(replace_checked(sweep.base, overrides)),
          "overrides": overrides, "git": git_state(), "num_runs": len(runs)}
  if sweep.sequential is not None:  # only then: fixed sweeps' sweep.json stay as they were
    info["sequential"] = dataclasses.asdict(sweep.sequential)
  with open(os.path.join(sweep_dir, "sweep.json"), "w") as f:
    json.dump(info, f, indent=2, sort_keys=True)
  return path


def swept_hparams(sweep: Sweep, runs: Sequence[RunSpec]) -> dict[str, list[Any]]:
  """Config fields whose value differs between runs -> the values they take."""
  return swept_values([r.config for r in runs])


def swept_values(configs: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
  """Fields whose value differs between ``configs`` -> the values they take, in order."""
  values: dict[str, list[Any]] = {}
  for config in configs:
    for k, v in config.items():
      values.setdefault(k, [])
      if v not in values[k]:
        values[k].append(v)
  return {k: v for k, v in values.items() if len(v) > 1}

