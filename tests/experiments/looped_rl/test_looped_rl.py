"""experiments.looped_rl: GRPO on a looped LM end to end, dense vs replayed log-probs."""

import dataclasses

import numpy as np
import pytest

from experiments.common.evidence.tensorboard_reader import read_scalars
from experiments.common.harness.run_options import RunOptions
from experiments.looped_rl import experiment as lrl
from launch import registry

TINY = dict(d_model=16, num_heads=1, d_ff=32, max_loops=2, pretrain_steps=3,
            num_updates=2, prompts_per_update=4, group_size=2, eval_problems=8,
            eval_every=1)


def test_replay_ratio_is_exactly_one_where_dense_is_not(tmp_path):
  # fp32 GEMMs and an MXFP8 rollout cache: a mismatch the dense pass cannot see.
  config = lrl.LoopedRLConfig(recipe="fp32", rollout_kv="mxfp8", learner_logp="replay",
                              pretrain_dir=str(tmp_path / "pretrain"), **TINY)
  summary = lrl.train_and_evaluate(config, RunOptions(workdir=str(tmp_path / "run"),
                                                      single_process=True))
  curves = read_scalars(str(tmp_path / "run"))
  m = summary["metrics"]
  assert summary["completed"]
  assert m["ratio/max_abs_log_ratio"] == 0.0 and m["ratio/not_one_frac_mean"] == 0.0
  assert m["ratio/clip_frac_mean"] == 0.0
  assert [v for _, v in curves["train/replay_exact"]] == [1.0, 1.0]
  # Both log-probs are computed in every arm: the dense pass differs from the rollout.
  assert m["mismatch/dense_max_abs_dlogp"] > 1e-3
  assert all(v > 0 for _, v in curves["train/dense_mismatch_k3"])
  for key in ("reward/mean_over_training", "eval/greedy_accuracy"):
    assert np.isfinite(m[key])


def test_sweep_declaration():
  sweep = registry.get("looped_rl")
  assert [a.name for a in sweep.arms][:2] == ["fp32_dense", "fp32_replay"]
  assert set(sweep.seeds).isdisjoint(sweep.calibration_seeds)
  for arm in sweep.arms:
    dataclasses.replace(sweep.base, **arm.overrides)
  with pytest.raises(ValueError, match="divisible by 16"):
    lrl.LoopedRLConfig(rollout_kv="mxfp8", d_model=24, num_heads=2)
