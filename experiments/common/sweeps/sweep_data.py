"""Reading a sweep directory back: its declaration, runs, results rows and curves.

A sweep directory (written by ``launch.sweep``) holds ``sweep.json`` (the declaration
and the git state it ran from), ``manifest.jsonl`` (one run per line),
``results.jsonl`` (one row per completed run) and ``runs/<run_name>/`` (each run's
TensorBoard events and config record). Everything here locates a run by its name under
the directory it is given, never by a path recorded inside the files, so a copied or
freshly cloned report reads the same.
"""

from __future__ import annotations

import collections
import json
import math
import os
from typing import Any, NamedTuple

from experiments.common.evidence.results import read_results
from experiments.common.evidence.tensorboard_reader import read_scalars

Curve = list[tuple[int, float]]


def read_manifest(sweep_dir: str) -> list[dict[str, Any]]:
  """The manifest's runs, in order (``run_name``, ``arm``, ``seed``, ``config``, ...)."""
  path = os.path.join(sweep_dir, "manifest.jsonl")
  if not os.path.exists(path):
    raise FileNotFoundError(f"no manifest.jsonl in {sweep_dir}; run launch.sweep first")
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def read_sweep_info(sweep_dir: str) -> dict[str, Any]:
  """``sweep.json``: the declaration (arms, seeds, metrics, base config) and git state."""
  path = os.path.join(sweep_dir, "sweep.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"no sweep.json in {sweep_dir}; run launch.sweep first")
  with open(path) as f:
    return json.load(f)


def run_dir(sweep_dir: str, run_name: str) -> str:
  """Where run ``run_name`` of the sweep in ``sweep_dir`` writes its events."""
  return os.path.join(sweep_dir, "runs", run_name)


class SweepResults(NamedTuple):
  """The results rows of a sweep directory, one per run, and what was odd about them.

  ``rows``: ``run_name -> row`` of the manifest's runs, the newest complete row of each
  (rows are keyed by run name; a row not marked complete counts only when no complete
  one exists). ``duplicates``: ``run_name -> number of rows`` where there was more than
  one. ``problems``: ``file:line: reason`` of every line that is not a results row.
  """

  rows: dict[str, dict[str, Any]]
  duplicates: dict[str, int]
  problems: list[str]


def read_sweep_results(sweep_dir: str) -> SweepResults:
  """Every run's results row (see :class:`SweepResults`), tolerating damaged lines."""
  names = {m["run_name"] for m in read_manifest(sweep_dir)}
  problems: list[str] = []
  by_run: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
  for row in read_results(os.path.join(sweep_dir, "results.jsonl"), problems):
    if row.get("run_name") in names:
      by_run[row["run_name"]].append(row)
  rows = {}
  for name, candidates in by_run.items():
    complete = [r for r in candidates if r.get("completed", True)]
    rows[name] = (complete or candidates)[-1]
  duplicates = {n: len(c) for n, c in by_run.items() if len(c) > 1}
  return SweepResults(rows, duplicates, problems)


def results_by_run(sweep_dir: str) -> dict[str, dict[str, Any]]:
  """``run_name -> results row`` of the manifest's runs (:func:`read_sweep_results`)."""
  return read_sweep_results(sweep_dir).rows


def evaluation_metrics(sweep_dir: str
                       ) -> tuple[dict[str, Any], dict[str, dict[int, dict[str, float]]]]:
  """Sweep info and ``arm -> seed -> {metric: value}`` from the results rows of the
  evaluation runs (calibration runs left out; non-finite and non-numeric values
  dropped). Every declared arm has an entry, empty when none of its runs reported."""
  info = read_sweep_info(sweep_dir)
  manifest = {m["run_name"]: m for m in read_manifest(sweep_dir)}
  runs: dict[str, dict[int, dict[str, float]]] = {a["name"]: {} for a in info["arms"]}
  for name, row in results_by_run(sweep_dir).items():
    m = manifest.get(name)
    if m is None or m.get("calibration"):
      continue
    runs[m["arm"]][m["seed"]] = {k: v for k, v in (row.get("metrics") or {}).items()
                                 if isinstance(v, (int, float)) and math.isfinite(v)}
  return info, runs


def completed_curves(sweep_dir: str, *, complete_tag: str, complete_len: int = 0,
                     complete_step: int | None = None
                     ) -> tuple[dict[str, Any], dict[str, dict[int, dict[str, Curve]]]]:
  """Sweep info and ``arm -> seed -> tag -> [(step, value)]`` of the completed runs:
  those that logged ``complete_tag`` at least ``complete_len`` times and, with
  ``complete_step``, at that step or later (a rule that still holds after
  :mod:`launch.thin_events` drops steps)."""
  info = read_sweep_info(sweep_dir)
  runs: dict[str, dict[int, dict[str, Curve]]] = collections.defaultdict(dict)
  for m in read_manifest(sweep_dir):
    directory = run_dir(sweep_dir, m["run_name"])
    if os.path.isdir(directory):
      scalars = read_scalars(directory)
      curve = scalars.get(complete_tag, [])
      if len(curve) >= complete_len and (complete_step is None
                                         or (curve and curve[-1][0] >= complete_step)):
        runs[m["arm"]][m["seed"]] = scalars
  return info, runs


def arm_overrides(info: dict[str, Any], arm: str) -> dict[str, Any]:
  """The config fields arm ``arm`` sets (from ``sweep.json``)."""
  return next(a["overrides"] for a in info["arms"] if a["name"] == arm)


def config_value(info: dict[str, Any], arm: str, field: str) -> Any:
  """A config field's value in arm ``arm``: the sweep's ``--override`` of it, else the
  arm's override, else the base config's."""
  overrides = info.get("overrides") or {}
  if field in overrides:
    return overrides[field]
  return arm_overrides(info, arm).get(field, info["base"][field])
