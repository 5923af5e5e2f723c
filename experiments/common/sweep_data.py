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
import os
from typing import Any

from experiments.common.results import read_results
from experiments.common.tensorboard_reader import read_scalars

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


def results_by_run(sweep_dir: str) -> dict[str, dict[str, Any]]:
  """``run_name -> results row`` of the manifest's runs (a later row wins)."""
  names = {m["run_name"] for m in read_manifest(sweep_dir)}
  rows = {}
  for row in read_results(os.path.join(sweep_dir, "results.jsonl")):
    if row.get("run_name") in names:
      rows[row["run_name"]] = row
  return rows


def completed_curves(sweep_dir: str, *, complete_tag: str, complete_len: int
                     ) -> tuple[dict[str, Any], dict[str, dict[int, dict[str, Curve]]]]:
  """Sweep info and ``arm -> seed -> tag -> [(step, value)]`` of the runs that logged
  ``complete_tag`` at least ``complete_len`` times (the completed ones)."""
  info = read_sweep_info(sweep_dir)
  runs: dict[str, dict[int, dict[str, Curve]]] = collections.defaultdict(dict)
  for m in read_manifest(sweep_dir):
    directory = run_dir(sweep_dir, m["run_name"])
    if os.path.isdir(directory):
      scalars = read_scalars(directory)
      if len(scalars.get(complete_tag, [])) >= complete_len:
        runs[m["arm"]][m["seed"]] = scalars
  return info, runs


def arm_overrides(info: dict[str, Any], arm: str) -> dict[str, Any]:
  """The config fields arm ``arm`` sets (from ``sweep.json``)."""
  return next(a["overrides"] for a in info["arms"] if a["name"] == arm)


def config_value(info: dict[str, Any], arm: str, field: str) -> Any:
  """A config field's value in arm ``arm``: its override, else the base config's."""
  return arm_overrides(info, arm).get(field, info["base"][field])
