"""Statistics and REPORT.md from a synthetic sweep directory (no training)."""

import math

import numpy as np
import pytest
from scipy import stats

from experiments.common.results import append_result
from experiments.common.tensorboard_writer import MetricWriter
from experiments.lm import LMConfig
from launch.ablation_stats import format_spread, paired_difference, summarize
from launch.report import build_report
from launch.sweep_spec import Arm, Sweep, expand, write_manifest


def test_paired_difference_by_hand():
  base = {0: 1.0, 1: 2.0, 2: 3.0, 3: 9.0}
  arm = {0: 2.0, 1: 4.0, 2: 6.0}  # seed 3 missing: pairs only seeds 0-2
  d = paired_difference(arm, base)
  assert d.n == 3 and d.seeds == (0, 1, 2) and d.mean == pytest.approx(2.0)
  half = 4.302652729911275 * 1.0 / math.sqrt(3)  # t_{0.975, 2} * sd / sqrt(n)
  assert d.ci_low == pytest.approx(2.0 - half) and d.ci_high == pytest.approx(2.0 + half)
  one = paired_difference({0: 1.0}, {0: 0.5})
  assert one.n == 1 and one.mean == 0.5 and math.isnan(one.ci_low)
  assert paired_difference({}, {}).n == 0


def test_paired_matches_scipy_ttest():
  rng = np.random.default_rng(0)
  base = rng.normal(size=6)
  arm = base + 0.3 + 0.1 * rng.normal(size=6)
  d = paired_difference(dict(enumerate(arm)), dict(enumerate(base)))
  res = stats.ttest_rel(arm, base)
  ci = res.confidence_interval(0.95)
  assert d.ci_low == pytest.approx(ci.low) and d.ci_high == pytest.approx(ci.high)


def test_summarize():
  s = summarize([1.0, 2.0, 3.0])
  assert s.mean == 2.0 and s.std == 1.0 and s.n == 3
  assert math.isnan(summarize([1.0]).std)
  with pytest.raises(ValueError):
    summarize([1.0, float("nan")])


def test_format_spread():
  assert format_spread([1.0, 2.0, 3.0], 2) == "2.00 ± 1.00"
  assert format_spread([5.0], 1) == "5.0"
  # Non-finite and missing values are left out; scale multiplies before formatting.
  assert format_spread([1.0, float("nan"), None, 3.0], 1, 100.0) == "200.0 ± 141.4"
  assert format_spread([]) == "n/a" and format_spread([], empty="") == ""


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
