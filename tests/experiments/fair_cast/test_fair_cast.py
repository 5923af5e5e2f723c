"""experiments.fair_cast: export arms end to end, the lag metrics, and resume."""

import dataclasses

import numpy as np
import pytest

from experiments.fair_cast import experiment as fc
from experiments.common.evidence.results import read_results
from experiments.common.harness.run_options import RunOptions
from experiments.common.evidence.tensorboard_reader import read_scalars
from tests import compile_cache


# Nine runs of one tiny config rebuild the RL loop's jitted closures; a program that
# differs (another export or loss) still compiles.
_compile_each_program_once = compile_cache.module_fixture()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  return fc.FairCastConfig(
      digits=2, d_model=32, num_layers=1, num_heads=2, d_ff=64, pretrain_steps=150,
      pretrain_batch=32, pretrain_lr=1e-2, num_updates=6, prompts_per_update=4,
      group_size=4, learning_rate=1e-4, eval_every=3, eval_problems=32, lag_every=2,
      lag_history=8, pretrain_dir=str(tmp_path_factory.mktemp("pretrain")))


def test_nearest_and_error_feedback_end_to_end(tiny, tmp_path):
  for rounding in ("nearest", "error_feedback"):
    config = dataclasses.replace(tiny, export_rounding=rounding)
    results = tmp_path / f"{rounding}.jsonl"
    summary = fc.train_and_evaluate(config, RunOptions(
        workdir=str(tmp_path / rounding), results_file=str(results)))
    assert summary["experiment"] == "fair_cast"
    s = read_scalars(str(tmp_path / rounding))
    unchanged = [v for _, v in s["export/unchanged_fraction"]]
    assert len(unchanged) == 5 and all(0.0 <= v <= 1.0 for v in unchanged)
    # Every export is on the bf16 grid, so the master is within an ulp (nearest:
    # half an ulp) of it.
    assert max(v for _, v in s["export/ulp_max"]) <= (0.5 if rounding == "nearest" else 1.0)
    assert [u for u, _ in s["export/lag_steps"]] == [3, 5]  # updates 2, 4 (+1 logged)
    assert any(t.startswith("export/lag_steps/block_0/qkv") for t in s)
    # (Updates whose groups all got the same reward have zero advantage: no step.)
    assert any(v > 0 for _, v in s["export/master_step_rms"])
    assert "perf/update_s" in s and "export/visible_displacement" in s
    [row] = read_results(str(results))
    assert row["completed"]
    # The export's summaries are results-row metrics (the sweep's claims use them).
    m = row["metrics"]
    assert m["export/lag_second_half"] == s["export/lag_steps"][-1][1]  # step 5 > 3
    assert m["export/unchanged_mean"] == pytest.approx(np.mean(unchanged))
    assert 0.0 <= m["export/lag_capped_fraction"] <= 1.0
    assert m["mismatch/k3_mean_over_training"] >= 0.0


def test_tiny_updates_never_reach_a_nearest_export(tiny, tmp_path):
  # Adam steps of 1e-8 are far below half a bf16 ulp of any weight of this model, and
  # the masters start on the grid: nearest never changes the served copy.
  config = dataclasses.replace(tiny, learning_rate=1e-8, num_updates=4)
  fc.train_and_evaluate(config, RunOptions(workdir=str(tmp_path / "n")))
  s = read_scalars(str(tmp_path / "n"))
  assert [v for _, v in s["export/unchanged_fraction"]] == [1.0, 1.0, 1.0]
  assert all(v == 0.0 for _, v in s.get("export/visible_displacement", []))
  # ... while stochastic rounding of masters off the grid redraws some elements at
  # every export, whatever the update.
  sr = dataclasses.replace(config, export_rounding="stochastic", master_on_grid=False)
  fc.train_and_evaluate(sr, RunOptions(workdir=str(tmp_path / "sr")))
  s = read_scalars(str(tmp_path / "sr"))
  assert all(v < 1.0 for _, v in s["export/unchanged_fraction"])


def test_loss_on_served_removes_the_mismatch(tiny, tmp_path):
  # Masters off the bf16 grid, so the served copy differs from them from the start.
  config = dataclasses.replace(tiny, loss_on_served=True, num_updates=3,
                               master_on_grid=False)
  fc.train_and_evaluate(config, RunOptions(workdir=str(tmp_path / "run")))
  s = read_scalars(str(tmp_path / "run"))
  # The learner computes its log-probs on exactly the weights the sampler drew from.
  assert [v for _, v in s["train/mismatch_max_abs_delta_logp"]] == [0.0, 0.0, 0.0]
  plain = dataclasses.replace(config, loss_on_served=False)
  fc.train_and_evaluate(plain, RunOptions(workdir=str(tmp_path / "plain")))
  s = read_scalars(str(tmp_path / "plain"))
  assert all(v > 0 for _, v in s["train/mismatch_max_abs_delta_logp"])


def test_resume_is_bit_exact_with_the_error_feedback_residual(tiny, tmp_path):
  config = dataclasses.replace(tiny, export_rounding="error_feedback", checkpoint_every=2)
  whole = fc.train_and_evaluate(config, RunOptions(workdir=str(tmp_path / "whole")))
  part = fc.train_and_evaluate(config, RunOptions(workdir=str(tmp_path / "split"),
                                                  stop_at_step=3))
  assert not part["completed"] and part["step"] == 3
  resumed = fc.train_and_evaluate(config, RunOptions(workdir=str(tmp_path / "split"),
                                                     resume=True))
  assert resumed["completed"]
  for tag in ("train/reward", "train/loss", "export/relative_drift"):
    a = read_scalars(str(tmp_path / "whole"))[tag]
    b = read_scalars(str(tmp_path / "split"))[tag]
    assert a == b, tag
  assert (whole["metrics"]["reward/mean_over_training"]
          == resumed["metrics"]["reward/mean_over_training"])


def test_config_validation(tiny):
  with pytest.raises(ValueError, match="refresh_interval=1"):
    dataclasses.replace(tiny, loss_on_served=True, refresh_interval=2)
  with pytest.raises(ValueError, match="export_format"):
    dataclasses.replace(tiny, sampler_dtype="bfloat16")
  with pytest.raises(ValueError, match="unknown"):
    dataclasses.replace(tiny, export_format="bf17")
  with pytest.raises(ValueError, match="momentum"):
    dataclasses.replace(tiny, momentum=1.0)
  assert isinstance(dataclasses.replace(tiny, optimizer_kind="sgdm").optimizer(),
                    type(tiny.optimizer()))
  np.testing.assert_equal(tiny.refresh_interval, 1)
