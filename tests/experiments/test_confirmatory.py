"""The confirmatory round's declarations (issue 36) and the side-by-side appendix.

Every confirmatory sweep runs on fresh seeds (none a pilot or calibration seed of any
other sweep of its paper, declared or recorded), runs only the arms its claims name, with the
pilot's configs, and names a pilot for every claim; the side-by-side appendix's fixed-n
verdicts are the claims table's on every committed pilot claim; a confirmatory sweep
run on made-up results builds a report that rebuilds byte for byte.
"""

import dataclasses
import importlib
import json
import math
import os
import re
import shutil

import pytest

from experiments.common.harness.repo_paths import REPO_DIR
from experiments.common.sweeps import confirmatory
from experiments.common.sweeps.sweep_data import evaluation_metrics
from launch import registry, sequential_runner
from launch.manifest import expand, write_manifest
from launch.report import build_report, claim_verdict

# The confirmatory rounds: <paper>_confirm, a later round <paper>_confirm2, ..., and a
# round of another pilot sweep of the paper, <paper>_<pilot>_confirm (mxfp8_rl_faults).
CONFIRM = tuple(n for n in registry.names() if re.fullmatch(r".*_confirm\d*", n))
PILOT_REPORTS = ("alto/report", "alto/report_negative", "fair_cast/report",
                 "kv_cache/report", "looped_rl/report", "optimizer_state/report",
                 "qlora/report", "stale_sampler/report", "mxfp8_rl/report",
                 "mxfp8_rl/report_faults", "temperon/report", "memoir/report",
                 "memoir/report/long")
# Arms whose config differs from the pilot arm they stand for, and how (declared).
CHANGED = {"mxfp4_rht_sr_1k": ("mxfp4_rht_sr", {"num_steps", "macro_block"}),
           "macro_block_1k": ("macro_block", {"num_steps", "macro_block"}),
           "dynamic_clip_1k": ("dynamic_clip", {"num_steps", "macro_block"}),
           "coupled_240": ("coupled", {"num_steps"}),
           "read_only_240": ("read_only", {"num_steps"})}


def _paper(sweep):
  return sweep.module.split(".")[1]


def _parts(name):
  """(pilot, round): ``("", "")`` for <paper>_confirm, ``("", "2")`` for
  <paper>_confirm2, ``("faults", "")`` for <paper>_faults_confirm."""
  rest = name[len(_paper(registry.get(name))) + 1:]
  pilot, round_ = re.fullmatch(r"(?:(\w+)_)?confirm(\d*)", rest).groups()
  return pilot or "", round_


def _round(name):
  """The report folder's suffix: ``""``, ``"2"``, ``"_faults"``."""
  pilot, round_ = _parts(name)
  return (f"_{pilot}" if pilot else "") + round_


def _pilots(name):
  sweep = registry.get(name)
  pilot, round_ = _parts(name)
  prefix = f"{pilot.upper()}_" if pilot else ""
  return getattr(importlib.import_module(f"experiments.{_paper(sweep)}.sweeps"),
                 f"{prefix}CONFIRM{round_}_PILOTS")


def test_every_paper_of_the_issue_has_a_confirmatory_sweep():
  assert {n for n in CONFIRM if not _round(n)} == {f"{p}_confirm" for p in (
      "stale_sampler", "mxfp8_rl", "memoir", "kv_cache", "temperon", "optimizer_state",
      "alto", "fair_cast", "looped_rl")}


@pytest.mark.parametrize("name", CONFIRM)
def test_seeds_are_fresh(name):
  sweep = registry.get(name)
  used = set()
  for other in registry.names():
    o = registry.get(other)
    if other != name and o.module == sweep.module:
      used |= set(o.seeds) | set(o.calibration_seeds)
  for d, _, files in os.walk(os.path.join(REPO_DIR, "experiments", _paper(sweep))):
    if "sweep.json" in files and "runs" not in d.split(os.sep):
      info = json.load(open(os.path.join(d, "sweep.json")))
      if info.get("name") == name:  # this sweep's own committed run
        continue
      used |= set(info["seeds"]) | set(info.get("calibration_seeds", []))
  assert not set(sweep.seeds) & used, sorted(set(sweep.seeds) & used)


@pytest.mark.parametrize("name", CONFIRM)
def test_arms_are_the_claims_arms_with_the_pilots_configs(name):
  sweep = registry.get(name)
  # Every other sweep of the module, by arm name: two sweeps may both name an arm
  # (kv_cache's cache arm "fp32" and kv_cache_weights' weight arm "fp32"), so an arm
  # matches when one of them has its config.
  pilots = {}
  for o in registry.names():
    if o != name and registry.get(o).module == sweep.module:
      for a in registry.get(o).arms:
        pilots.setdefault(a.name, []).append(a)
  assert sweep.report_dir == f"experiments/{_paper(sweep)}/report_confirm{_round(name)}"
  for arm in sweep.arms:
    if arm.name in CHANGED:
      pilot, changed = CHANGED[arm.name]
      config = dataclasses.replace(sweep.base, **arm.overrides)
      assert any(all(getattr(config, k) == v for k, v in p.overrides.items())
                 and set(arm.overrides) - set(p.overrides) == changed
                 for p in pilots[pilot]), arm.name
    else:
      assert dict(arm.overrides) in [dict(p.overrides) for p in pilots[arm.name]], arm.name
  if sweep.sequential is None:  # looped_rl: count claims
    return
  named = {a for c in sweep.claims for a in (c.arm, c.baseline)}
  assert named == {a.name for a in sweep.arms}
  assert set(_pilots(name)) == {c.text for c in sweep.claims}
  assert sweep.sequential.cap == len(sweep.seeds)


@pytest.mark.parametrize("name,arm,pilot", [
    ("alto_confirm", "mxfp4_rht_sr_1k", "mxfp4_rht_sr"),
    ("alto_confirm", "macro_block_1k", "macro_block"),
    ("alto_confirm2", "mxfp4_rht_sr_1k", "mxfp4_rht_sr"),
    ("alto_confirm2", "dynamic_clip_1k", "dynamic_clip")])
def test_alto_confirm_1k_arms_are_alto_negative_exactly(name, arm, pilot):
  confirm, negative = registry.get(name), registry.get("alto_negative")
  ours = dataclasses.replace(confirm.base, **next(
      a for a in confirm.arms if a.name == arm).overrides)
  theirs = dataclasses.replace(negative.base, **next(
      a for a in negative.arms if a.name == pilot).overrides)
  assert ours == theirs


@pytest.mark.parametrize("report", PILOT_REPORTS)
def test_fixed_verdict_is_the_claims_tables(report):
  info, runs = evaluation_metrics(os.path.join(REPO_DIR, "experiments", report))
  higher = set(info.get("higher_is_better", []))
  for c in info.get("claims", []):
    get = lambda a: {s: m[c["metric"]] for s, m in runs[a].items() if c["metric"] in m}
    ours = confirmatory.fixed_verdict(c["kind"], c.get("margin") or 0.0, get(c["arm"]),
                                      get(c["baseline"]), c["metric"] in higher)[1]
    assert ours == claim_verdict(c, get(c["arm"]), get(c["baseline"]),
                                 c["metric"] in higher)[1]


@pytest.mark.parametrize("name", [n for n in CONFIRM if n != "looped_rl_confirm"])
def test_declared_pilots_are_the_pilots_claims(name):
  """A pilot marked declared is a claim of that pilot sweep with the same comparison."""
  sweep = registry.get(name)
  for c in sweep.claims:
    pilot = _pilots(name)[c.text]
    info = json.load(open(os.path.join(REPO_DIR, pilot.report_dir, "sweep.json")))
    assert pilot.arm in {a["name"] for a in info["arms"]}
    assert pilot.baseline in {a["name"] for a in info["arms"]}
    if pilot.declared and pilot.step is None:
      match = [p for p in info["claims"] if p["arm"] == pilot.arm
               and p["baseline"] == pilot.baseline and p["metric"] == (pilot.metric or c.metric)]
      assert match and match[0]["kind"] == c.kind and (match[0]["margin"] or 0) == c.margin


def test_count_claims():
  claim = confirmatory.CountClaim("exact", "a", "m", "zero")
  assert confirmatory.count_verdict(claim, {1: 0.0, 2: 0.0}, 2) == (2, 2, "held")
  assert confirmatory.count_verdict(claim, {1: 0.0, 2: 1e-9}, 2)[2].startswith("not held")
  assert confirmatory.count_verdict(claim, {1: 0.0}, 2)[2].startswith("not decided")
  assert confirmatory.count_upper_bound(0, 10) == pytest.approx(1 - 0.05 ** 0.1)
  assert confirmatory.count_upper_bound(3, 3) == 1.0
  with pytest.raises(ValueError):
    confirmatory.CountClaim("x", "a", "m", "negative")


def test_a_confirmatory_report_on_made_up_results_rebuilds(tmp_path):
  """stale_sampler_confirm run on made-up results: looks, the side-by-side appendix
  (the committed pilot beside each claim), a byte-identical rebuild from a copy."""
  sweep = registry.get("stale_sampler_confirm")
  sweep_dir = str(tmp_path / "report_confirm")
  runs = expand(sweep, sweep_dir)
  write_manifest(sweep, [], sweep_dir)  # sweep.json, as launch.sweep writes it

  def value(arm, seed):  # the cooled arm is clearly worse on the minimum
    base = 0.5 + 0.05 * math.sin(seed)
    return {"tis_K64": base, "tis_T0.8_K64": base - 0.15 + 0.01 * math.cos(seed),
            "tis_K32": base + 0.1, "tis_T0.8_K128": base - 0.02 * math.sin(3 * seed),
            "tis_T0.6_K64": base - 0.2}[arm]

  def run_batch(scheduled):
    done = set()
    path = os.path.join(sweep_dir, "results.jsonl")
    if os.path.exists(path):
      done = {json.loads(l)["run_name"] for l in open(path)}
    with open(path, "a") as f:
      for r in scheduled:
        if r.run_name not in done:
          v = value(r.arm, r.seed)
          f.write(json.dumps({"run_name": r.run_name, "metrics": {
              m: v for m in sweep.metrics}}) + "\n")

  result = sequential_runner.run_sequential(
      sweep, sweep_dir, runs, run_batch, lambda s: write_manifest(sweep, s, sweep_dir),
      say=lambda _: None)
  assert result.done
  text = open(build_report(sweep_dir)).read()
  assert "## Pilot and confirmatory, side by side" in text
  assert "stale_sampler/report" in text and "## Sizing" in text
  assert "| 1. Cooling the sampler (T = 0.8) moves the cliff" in text
  copy = tmp_path / "copy"
  shutil.copytree(sweep_dir, copy)
  assert open(build_report(str(copy))).read() == text
