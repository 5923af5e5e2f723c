"""The committed evidence reopens from a clean clone.

The reports built under the evidence rules (``REPORTS``): each REPORT.md and its arm
view (``arms/``) rebuild from the committed files alone, identical to the committed
ones; the per-seed runs' one HParams experiment summary offers every run's seed and
swept values, and holds no ``.`` run; every run's events and
HParams are committed, every HParams metric column and every metric a claim reads is in
every run's events (read with TensorBoard's own reader, as its HParams view does), and
no committed report file names a path of the machine that wrote it.
"""

import dataclasses
import importlib
import json
import os
import re
import shutil

import pytest

from experiments.common.evidence.tensorboard_reader import (event_files, read_hparams_experiment,
                                                            read_hparams_session, read_scalars)
from experiments.common.evidence.tensorboard_writer import shown_hparam
from experiments.common.harness.repo_paths import REPO_DIR
from launch import event_metrics, tensorboard_views
from launch.report import build_report

# experiments/<these> : every sweep report built under the evidence rules
REPORTS = ("lm/report", "alto/report", "alto/report_negative", "alto/report_confirm",
           "alto/report_confirm2", "alto/report_untested",
           "fair_cast/report",
           "looped_rl/report", "kv_cache/report", "optimizer_state/report", "qlora/report",
           "stale_sampler/report", "mxfp8_rl/report", "mxfp8_rl/report_faults",
           "temperon/report", "temperon/report_confirm", "temperon/report_confirm2",
           "memoir/report", "memoir/report/long", "memoir/report_confirm",
           "kv_cache/report_confirm",
           "stale_sampler/report_confirm", "mxfp8_rl/report_confirm",
           "mxfp8_rl/report_confirm_faults",
           "optimizer_state/report_confirm", "fair_cast/report_confirm",
           "looped_rl/report_confirm", "memoir/report_energy", "kv_cache/report_weights",
           "scale_rules/report", "mxfp4_backward/report",
           "nvfp4_recipe/report")
_SKIP = shutil.ignore_patterns("checkpoints", "launch.log", ".lock", "plots")


@pytest.mark.parametrize("paper", REPORTS)
def test_report_rebuilds_identically_from_its_committed_data(tmp_path, paper):
  report = os.path.join(REPO_DIR, "experiments", *paper.split("/"))
  copy = tmp_path / "report"
  shutil.copytree(report, copy, ignore=_SKIP)  # what a clean clone has (no plots)
  committed = open(os.path.join(report, "REPORT.md")).read()
  committed_view = _files(os.path.join(report, tensorboard_views.ARMS_DIR))
  rebuilt = open(build_report(str(copy))).read()
  assert rebuilt == committed
  # The arm view rebuilds byte for byte, one run per arm, within what Scalars selects.
  assert _files(str(copy / tensorboard_views.ARMS_DIR)) == committed_view
  assert 1 <= len(os.listdir(copy / tensorboard_views.ARMS_DIR)) <= 40
  info = json.load(open(copy / "sweep.json"))
  assert info["git"]["dirty"] is False and len(info["git"]["commit"]) == 40
  manifest = [json.loads(l) for l in open(copy / "manifest.jsonl")]
  # One HParams experiment summary, in the first run (no `.` run at the top of runs/),
  # whose filters offer every run's value of every column: every seed, every arm's.
  assert not event_files(str(copy / "runs"))
  experiment = read_hparams_experiment(str(copy / "runs" / manifest[0]["run_name"]))
  assert experiment["metrics"] == info["metrics"]
  rows = {r["run_name"]: r for r in map(json.loads, open(copy / "results.jsonl"))
          if isinstance(r, dict) and "run_name" in r}
  for m in manifest:
    run = copy / "runs" / m["run_name"]
    scalars = read_scalars(str(run))  # every run's curves are committed
    assert scalars, m["run_name"]
    if "eval/loss" in scalars and m["run_name"] in rows:  # the events reach the end
      assert scalars["eval/loss"][-1][0] == rows[m["run_name"]]["step"], m["run_name"]
    session = read_hparams_session(str(run))
    assert session["trial_id"] == m["run_name"] and session["status"] == "STATUS_SUCCESS"
    for name, domain in experiment["hparams"].items():
      assert session["hparams"][name] in domain, (m["run_name"], name)
      assert shown_hparam(m["config"][name]) == session["hparams"][name]
  # Each HParams column (a declared metric) is filled from every run's events.
  assert event_metrics.missing(str(copy)) == {}


def _files(root):
  """``relative path -> bytes`` of every file under ``root``."""
  return {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
          for d, _, files in os.walk(root) for f in files}


# experiments/<these> : benchmark reports decided by rounds (a JSON and its REPORT.md)
BENCHMARK_REPORTS = {"qlora/report_confirm": "experiments.qlora.bench_confirm",
                     "optimizer_state/report_memory":
                         "experiments.optimizer_state.memory_budget",
                     "looped_rl/report_bench": "experiments.looped_rl.bench_confirm"}


@pytest.mark.parametrize("paper", sorted(BENCHMARK_REPORTS))
def test_benchmark_report_rebuilds_identically_from_its_committed_json(tmp_path, paper):
  report = os.path.join(REPO_DIR, "experiments", *paper.split("/"))
  copy = tmp_path / "report"
  shutil.copytree(report, copy, ignore=_SKIP)
  committed = open(os.path.join(report, "REPORT.md")).read()
  module = importlib.import_module(BENCHMARK_REPORTS[paper])
  assert open(module.build_report(str(copy))).read() == committed
  record = json.load(open(copy / module.JSON_FILE))
  assert record["git"]["dirty"] is False and len(record["git"]["commit"]) == 40


def test_committed_report_files_name_no_machine_path():
  machine_path = re.compile(r"""(^|[\s"'`(=])/(work|root|home|tmp)/""", re.MULTILINE)
  for d, _, files in os.walk(os.path.join(REPO_DIR, "experiments")):
    parts = d.split(os.sep)
    if not any(p.startswith("report") for p in parts) or "checkpoints" in parts:
      continue
    for f in files:
      if f.endswith((".md", ".json", ".jsonl")):
        text = open(os.path.join(d, f)).read()
        assert REPO_DIR not in text, os.path.join(d, f)
        match = machine_path.search(text)
        assert match is None, (os.path.join(d, f), text[match.start():match.end() + 30])


def test_declarations_are_the_ones_their_committed_reports_recorded():
  """A registered sweep's seeds, calibration seeds, arms and claims at HEAD are the ones
  its committed report ran under (sweep.json), so the declaration reads true."""
  from launch import registry  # pylint: disable=import-outside-toplevel
  for name in registry.names():
    sweep = registry.get(name)
    path = os.path.join(REPO_DIR, sweep.report_dir, "sweep.json")
    if not sweep.report_dir or not os.path.exists(path):
      continue
    info = json.load(open(path))
    assert list(sweep.seeds) == info["seeds"], name
    assert list(sweep.calibration_seeds) == info.get("calibration_seeds", []), name
    assert [{"name": a.name, "overrides": dict(a.overrides)} for a in sweep.arms] == \
        info["arms"], name
    if "claims" in info:  # reports from before claims were declared have none
      assert [dataclasses.asdict(c) for c in sweep.claims] == info["claims"], name
