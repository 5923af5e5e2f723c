"""The stale_sampler sweep's declaration and its report appendix on planted runs."""

import dataclasses
import os

import numpy as np
import pytest

from experiments.common.evidence.tensorboard_writer import MetricWriter
from experiments.common.evidence import curve_plots
from experiments.stale_sampler import appendix as sss
from experiments.stale_sampler import sweeps as sss_sweeps
from launch import registry
from launch.manifest import expand, write_manifest


def test_degradation_update_hand_cases():
  flat = [(0, 0.4), (8, 0.41), (16, 0.39), (24, 0.42)]
  assert sss.degradation_update(flat) is None
  # 0.25 < 0.4 - 0.1 from update 16 on.
  falls = [(0, 0.4), (8, 0.35), (16, 0.25), (24, 0.2), (32, 0.1)]
  assert sss.degradation_update(falls) == 16
  # A single evaluation below the line is not degradation; two in a row are.
  blip = [(0, 0.4), (8, 0.25), (16, 0.4), (24, 0.28), (32, 0.29)]
  assert sss.degradation_update(blip) == 24
  assert sss.degradation_update(blip, persist=1) == 8
  # The last evaluation below the line counts (nothing after it to contradict it).
  assert sss.degradation_update([(0, 0.4), (8, 0.39), (16, 0.2)]) == 16
  assert sss.degradation_update([]) is None


def test_moving_average_is_trailing():
  np.testing.assert_allclose(curve_plots.moving_average([1, 2, 3, 4, 5], 2),
                             [1, 1.5, 2.5, 3.5, 4.5])
  np.testing.assert_allclose(curve_plots.moving_average([3, 1], 5), [3, 2])
  with pytest.raises(ValueError, match="window"):
    curve_plots.moving_average([1.0], 0)


def test_sweep_declaration():
  sweep = registry.get("stale_sampler")
  assert sweep.baseline in [a.name for a in sweep.arms]
  assert len(sweep.seeds) >= 3
  k = {a.name: a.overrides["refresh_interval"] for a in sweep.arms}
  for arm in sweep.arms:  # the name says what the arm is
    assert arm.name.endswith(f"_K{k[arm.name]}")
    method = arm.overrides.get("is_method", sweep.base.is_method)
    assert arm.name.startswith("tis" if method == "token_tis" else "none")
    if "sampler_temperature" in arm.overrides:
      assert f"_T{arm.overrides['sampler_temperature']}" in arm.name
  # Every arm's config is valid (e.g. no IS weight with the ratio against the sampler).
  for run in expand(sweep, "/tmp/unused"):
    dataclasses.replace(sweep.base, **{f: run.config[f] for f in ("is_method",
                                                                  "ratio_against")})


def _plant(tmp_path, arms):
  """A 2-arm, 2-seed sweep dir with planted events; returns the sweep."""
  base = dataclasses.replace(registry.get("stale_sampler").base, num_updates=32,
                             eval_every=8)
  sweep = dataclasses.replace(registry.get("stale_sampler"), base=base, seeds=(0, 1),
                              arms=arms, baseline=arms[0].name, claims=())
  runs = expand(sweep, str(tmp_path))
  write_manifest(sweep, runs, str(tmp_path))
  for r in runs:
    writer = MetricWriter(r.workdir)
    k = r.config["refresh_interval"]
    collapse = r.arm.startswith("none")
    for u in range(0, 33, 8):  # greedy accuracy falls from 0.4 to 0.1 after update 8
      acc = 0.4 - (0.3 * (u >= 16) if collapse else -0.01 * u / 8)
      writer.write_scalars(u, {"eval/greedy_accuracy": acc})
    for u in range(1, 33):
      cycle_step = (u - 1) % k
      writer.write_scalars(u, {"train/reward": 0.3, "train/is_mean": 1.0,
                               "train/mismatch_k3": 0.01 * cycle_step + 0.1 * r.seed,
                               "train/mismatch_max_abs_delta_logp": 1.0,
                               "train/is_clipped_frac": 0.0, "train/is_ess": 1.0})
    # the run's summary scalars: seed 1's warm start stopped short of the 0.4 target
    writer.write_scalars(32, {"warm_start/greedy_accuracy": 0.45 - 0.1 * r.seed,
                              "warm_start/pretrain_steps": 850 + 3150 * r.seed,
                              "accuracy/last_quarter": 0.5 + 0.1 * r.seed})
    writer.close()
  return sweep


def test_appendix_on_planted_runs(tmp_path):
  arms = (sss_sweeps._arm("tis", 8), sss_sweeps._arm("none", 16))
  _plant(tmp_path, arms)
  md = sss.stale_sampler_appendix(str(tmp_path))
  rows = {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:-1]]
          for l in md.splitlines() if l.startswith("| `")}
  table = [l for l in md.splitlines() if "seed 0: " in l]
  assert len(table) == 2
  tis = next(l for l in table if l.startswith("| `tis_K8`"))
  none = next(l for l in table if l.startswith("| `none_K16`"))
  assert "| 0/2 | 0/2 |" in tis and "seed 0: no; seed 1: no" in tis
  # Degrades at the evaluation after update 16: the last update of cycle 0 of K = 16.
  assert "| 2/2 | 2/2 |" in none and "seed 0: update 16 (cycle 0, step 16 of 16)" in none
  assert "0.300 ± 0.000" in tis  # reward mean over training
  # Cycle table: k3 is 0.01 * cycle_step (+0.1 for seed 1): quarters of K = 8 hold
  # cycle steps {0,1}, {2,3}, ...; mean over seeds adds 0.05.
  k3_rows = [l for l in md.split("**`train/mismatch_k3`**")[1].split("**")[0].splitlines()
             if l.startswith("| `")]
  cells = [c.strip() for c in k3_rows[0].split("|")[3:-1]]
  assert cells[0].startswith("0.055 ± 0.07") and cells[3].startswith("0.115 ± 0.07")
  # The IS rows skip the uncorrected arm; the plots exist.
  is_rows = md.split("**`train/is_mean`**")[1].split("**")[0]
  assert "`tis_K8`" in is_rows and "`none_K16`" not in is_rows
  for name in ("greedy_accuracy_K8", "reward_K16", "mismatch_k3_K16"):
    assert os.path.exists(tmp_path / "plots" / f"{name}.png")
    assert f"plots/{name}.png" in md
  assert rows  # sanity: the tables parsed
  # Warm starts: update 0 is the planted 0.4; the control (tis_K8) ends at 0.5 / 0.6.
  assert "| 0 | 850 | 0.450 | 0.400 | 0.500 | +0.100 |" in md
  assert "| 1 | 4000 | 0.350 | 0.400 | 0.600 | +0.200 |" in md
  assert "seeds [1] stopped at the step cap" in md
