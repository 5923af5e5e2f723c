"""Statistics and REPORT.md from a synthetic sweep directory (no training)."""

import math

import numpy as np
import pytest
from scipy import stats

from experiments.common.evidence.results import append_result
from experiments.common.evidence.tensorboard_writer import MetricWriter
from experiments.lm.experiment import LMConfig
from launch.report import build_report, drawn_curves
from experiments.common.sweeps.sweep_spec import Arm, Sweep
from launch.manifest import expand, write_manifest


def test_report_from_synthetic_sweep(tmp_path):
  sweep = Sweep("toy", "experiments.lm", LMConfig(), (Arm("base", {"recipe": "fp32"}),
                                                      Arm("low", {"recipe": "bf16"})),
                seeds=(0, 1, 2), baseline="base", metrics=("eval/loss",))
  runs = expand(sweep, str(tmp_path))
  write_manifest(sweep, runs, str(tmp_path))
  for r in runs:
    if (r.arm, r.seed) == ("low", 2):
      continue  # a missing run
    final = 1.0 + r.seed * 0.1 + (0.05 if r.arm == "low" else 0.0)
    w = MetricWriter(r.workdir)
    for step in range(1, 11):
      w.write_scalars(step, {"train/loss": final + 1.0 / step})
    w.write_scalars(10, {"eval/loss": final})
    w.close()
    append_result(r.results_file, {"run_name": r.run_name, "metrics": {"eval/loss": final},
                                   "steps_per_s": 5.0, "wall_s": 2.0})
  path = build_report(str(tmp_path))
  text = open(path).read()
  assert "| `base` (baseline) | 3 | 1.1000 ± 0.1000 |" in text
  assert "| `low` | 2 | 1.1000 ± 0.0707 |" in text
  assert "| `low` | `eval/loss` | 0.0500" in text  # paired over the 2 common seeds
  assert "Missing runs" in text and "low-s2" in text
  for tag in ("train_loss", "eval_loss"):
    png = tmp_path / "plots" / f"{tag}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"](plots/{tag}.png)" in text
  # A hand-written FINDINGS.md in the sweep dir is appended and survives a rebuild.
  (tmp_path / "FINDINGS.md").write_text("## Findings\n\nlow is worse.\n")
  text = open(build_report(str(tmp_path))).read()
  assert text.rstrip().endswith("## Findings\n\nlow is worse.")
  assert text.count("## Findings") == 1


def test_calibration_runs_are_listed_but_kept_out_of_the_statistics(tmp_path):
  sweep = Sweep("toy", "experiments.lm", LMConfig(), (Arm("base", {"recipe": "fp32"}),),
                seeds=(0, 1), baseline="base", metrics=("eval/loss",), curves=(),
                calibration_seeds=(9,))
  runs = expand(sweep, str(tmp_path), calibration_runs=(9,))
  write_manifest(sweep, runs, str(tmp_path))
  for r in runs:  # the calibration run's value would move the mean from 1.5 to 34
    append_result(r.results_file, {"run_name": r.run_name,
                                   "metrics": {"eval/loss": 100.0 if r.calibration
                                               else 1.0 + r.seed}})
  text = open(build_report(str(tmp_path))).read()
  assert "| `base` (baseline) | 2 | 1.5000 ± 0.7071 |" in text
  assert "calibration seeds (never evaluated): [9]" in text
  assert "Runs on calibration seeds" in text and "| 9 (calibration) |" in text


def test_claims_table_verdicts_by_hand():
  from launch.report import claim_verdict  # pylint: disable=import-outside-toplevel
  base = {s: 1.0 for s in range(4)}
  lower = {s: 0.9 + 0.01 * s for s in range(4)}  # lower loss on every seed
  better = {"kind": "better"}
  assert claim_verdict(better, lower, base, higher_is_better=False)[1] == "held"
  assert claim_verdict(better, lower, base, higher_is_better=True)[1] == "opposite"
  noisy = {0: 1.2, 1: 0.8, 2: 1.1, 3: 0.9}
  assert claim_verdict(better, noisy, base, False)[1].startswith("not decided")
  same = {s: 1.0 + 0.001 * (-1) ** s for s in range(4)}
  eq = {"kind": "equivalent", "margin": 0.05}
  assert claim_verdict(eq, same, base, False)[1].startswith("held")
  assert claim_verdict(eq, noisy, base, False)[1].startswith("not decided")
  assert claim_verdict(eq, lower, base, False)[1] == "differs"
  assert claim_verdict(better, {0: 1.0}, {0: 2.0}, False)[1] == "not decided (1 paired seeds)"


def test_not_better_claim_by_hand():
  """Non-superiority, worked by hand: differences (arm - base, higher is better) of
  -0.02, 0, -0.01, +0.01 have mean -0.005 and sd 0.012910; the one-sided 95% bound is
  -0.005 + t_{0.95,3} 2.353363 * 0.012910 / 2 = +0.010191."""
  from launch.report import claim_verdict  # pylint: disable=import-outside-toplevel
  base = {s: 0.5 for s in range(4)}
  arm = {0: 0.48, 1: 0.5, 2: 0.49, 3: 0.51}
  cell, verdict = claim_verdict({"kind": "not_better", "margin": 0.02}, arm, base, True)
  assert verdict.startswith("held") and "0.0102" in cell
  # the same bound against a margin it reaches: no decision
  assert claim_verdict({"kind": "not_better", "margin": 0.01}, arm, base, True
                       )[1].startswith("not decided")
  gain = {s: 0.6 + 0.01 * s for s in range(4)}  # better on every seed
  assert claim_verdict({"kind": "not_better", "margin": 0.02}, gain, base, True
                       )[1] == "opposite"
  # lower is better: the gain is base - arm, so a lower arm is the "opposite"
  assert claim_verdict({"kind": "not_better", "margin": 0.02},
                       {s: 0.4 - 0.01 * s for s in range(4)}, base, False)[1] == "opposite"


def test_claim_counts_seeds_where_the_arm_is_better_in_the_metrics_direction():
  """Regression: the count was of positive differences, so an arm with a lower loss
  (or cost) on every seed read 'wins 0/n'."""
  from launch.report import claim_verdict
  claim = {"kind": "better", "margin": None}
  arm, base = {0: 1.0, 1: 2.0, 2: 3.0}, {0: 1.5, 1: 2.5, 2: 2.9}
  cell, _ = claim_verdict(claim, arm, base, higher_is_better=False)
  assert "arm better on 2/3" in cell
  cell, _ = claim_verdict(claim, arm, base, higher_is_better=True)
  assert "arm better on 1/3" in cell


def _synthetic_sweep(tmp_path, overrides=None):
  """A 2 x 2 sweep, every run with a results row and train/loss, eval/loss events."""
  sweep = Sweep("toy", "experiments.lm", LMConfig(), (Arm("base", {"recipe": "fp32"}),
                                                      Arm("low", {"recipe": "bf16"})),
                seeds=(0, 1), baseline="base", metrics=("eval/loss",))
  runs = expand(sweep, str(tmp_path), overrides)
  write_manifest(sweep, runs, str(tmp_path), overrides=overrides)
  for r in runs:
    w = MetricWriter(r.workdir)
    for step in range(1, 21):
      w.write_scalars(step, {"train/loss": 2.0 / step, "eval/loss": 1.0 / step})
    w.close()
    append_result(r.results_file, {"run_name": r.run_name, "metrics": {"eval/loss": 0.05}})
  return runs


def test_curves_over_fewer_runs_than_the_table_and_damaged_events_are_named(tmp_path):
  """Before: with a run's event files missing the report said 4 of 4 runs and averaged
  its curves over fewer, with no note; a damaged event file lost every record after
  the damage, silently (issue 35)."""
  import os  # pylint: disable=import-outside-toplevel
  runs = _synthetic_sweep(tmp_path)
  complete = open(build_report(str(tmp_path))).read()
  lost, damaged = runs[3], runs[1]
  for f in os.listdir(lost.workdir):
    os.remove(os.path.join(lost.workdir, f))
  [events] = [os.path.join(damaged.workdir, f) for f in os.listdir(damaged.workdir)]
  raw = bytearray(open(events, "rb").read())
  raw[len(raw) // 2] ^= 0xFF
  open(events, "wb").write(bytes(raw))
  text = open(build_report(str(tmp_path))).read()
  assert "- runs completed: 4 of 4" in text
  assert f"**Completed runs without events** (no event file in their run directory, so no " \
         f"curves): `{lost.run_name}`" in text
  name = os.path.relpath(events, tmp_path)
  assert f"**Damaged event files** " in text and f"`{name}: bytes " in text
  for tag in ("train/loss", "eval/loss"):
    assert (f"`{tag}` curves not over the table's runs: `low` is the mean of 1 run(s), "
            f"not the table's 2 (no `{tag}` events in `{lost.run_name}`).") in text
  # Only these lines are new: a complete sweep's report is as before.
  new = [l for l in text.splitlines() if l not in complete.splitlines()]
  assert len(new) == 4 and not any("Damaged" in l or "without events" in l or "not over" in l
                                   for l in complete.splitlines())


def test_overrides_are_recorded_and_in_the_reproduce_command(tmp_path):
  """Before: ``launch.sweep --override=num_steps=60`` left sweep.json saying the
  declared 1000 steps, and REPORT.md and its Reproduce command never mentioned it."""
  import json  # pylint: disable=import-outside-toplevel
  from experiments.common.sweeps.sweep_data import config_value  # pylint: disable=import-outside-toplevel
  _synthetic_sweep(tmp_path, {"num_steps": 600, "recipe": "fp8"})
  info = json.load(open(tmp_path / "sweep.json"))
  assert info["overrides"] == {"num_steps": 600, "recipe": "fp8"}
  assert info["base"]["num_steps"] == 600  # the config the runs started from
  assert config_value(info, "low", "recipe") == "fp8"  # over the arm's, as the runs had it
  text = open(build_report(str(tmp_path))).read()
  assert ("- overrides applied to every run over the declared sweep (`--override`): "
          "`num_steps=600`, `recipe=fp8`") in text
  assert (f"`python -m launch.sweep --sweep=toy --sweep_dir={tmp_path} "
          "--override=num_steps=600 --override=recipe=fp8` reruns it") in text


def test_time_series_pins_only_the_curves_that_draw_a_line():
  """A declared curve no run logged, or logged at one step only (a final evaluation),
  opens as an empty pinned card: the arm view's link leaves it out."""
  info = {"curves": ["eval/loss", "eval/final_only", "never_logged", "train/loss"]}
  scalars = {"a-s0": {"eval/loss": [(0, 2.0), (10, 1.0)], "eval/final_only": [(10, 1.0)]},
             "b-s0": {"eval/final_only": [(10, 1.5), (10, 1.4)],  # a rewrite, one step
                      "train/loss": [(5, 3.0), (6, 2.9)]}}
  assert drawn_curves(info, scalars) == ["eval/loss", "train/loss"]
