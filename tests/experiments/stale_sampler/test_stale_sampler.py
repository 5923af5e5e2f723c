"""experiments.stale_sampler: one short RL arm end to end, and the harness checks."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from experiments.common.rl import harness_checks
from experiments.common.rl import loop as rl_loop
from experiments.stale_sampler import experiment as ss
from experiments.common import arithmetic_task
from experiments.common.results import read_results
from experiments.common.run_options import RunOptions
from experiments.common.tensorboard_reader import read_scalars
from models import sampling


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  return ss.StaleSamplerConfig(
      digits=2, d_model=32, num_layers=1, num_heads=2, d_ff=64, pretrain_steps=150,
      pretrain_batch=32, pretrain_lr=1e-2, num_updates=6, prompts_per_update=4,
      group_size=4, learning_rate=1e-3, refresh_interval=3, sampler_temperature=0.8,
      eval_every=3, eval_problems=32,
      pretrain_dir=str(tmp_path_factory.mktemp("pretrain")))


def test_one_arm_end_to_end(tiny, tmp_path):
  results = tmp_path / "results.jsonl"
  summary = ss.train_and_evaluate(tiny, RunOptions(workdir=str(tmp_path / "run"),
                                                   results_file=str(results)))
  scalars = read_scalars(str(tmp_path / "run"))
  assert [s for s, _ in scalars["train/reward"]] == list(range(1, 7))
  assert [v for _, v in scalars["rl/staleness"]] == [0, 1, 2, 0, 1, 2]
  assert [v for _, v in scalars["rl/sampler_version"]] == [0, 0, 0, 3, 3, 3]
  for tag in ("train/is_mean", "train/is_ess", "train/is_clipped_frac",
              "train/mismatch_k1", "train/mismatch_k3", "train/mismatch_max_abs_delta_logp",
              "train/ppo_clip_frac", "eval/greedy_accuracy"):
    assert tag in scalars, tag
  # Cooled sampler: the learner (T = 1) and the behaviour (T = 0.8) differ from step 0.
  assert scalars["train/mismatch_k3"][0][1] > 0
  assert 0 <= summary["metrics"]["warm_start/greedy_accuracy"] <= 1
  assert all(0 <= v <= 1 for _, v in scalars["train/reward"])
  [row] = read_results(str(results))
  assert row["first_batch"] == harness_checks.batch_fingerprint(arithmetic_task.problems(
      seed=0, position=0, batch_size=4, digits=2)["prompts"])
  # The data seed reaches the run: another seed draws other problems.
  other = dataclasses.replace(tiny, seed=1, num_updates=1)
  s1 = ss.train_and_evaluate(other, RunOptions(workdir=str(tmp_path / "s1")))
  assert s1["first_batch"] != row["first_batch"]


def test_repeated_batch_is_caught(tiny, tmp_path, monkeypatch):
  real = arithmetic_task.grouped_prompts
  monkeypatch.setattr(rl_loop.task, "grouped_prompts",
                      lambda **kw: real(**{**kw, "position": 0}))
  with pytest.raises(RuntimeError, match="already used"):
    ss.train_and_evaluate(tiny, RunOptions(workdir=str(tmp_path / "run")))


def test_behaviour_logp_not_from_the_sampler_is_caught(tiny, tmp_path, monkeypatch):
  real = sampling.sample

  def wrong(*args, **kwargs):  # records log-probs at T = 1 while sampling at T = 0.8
    out = real(*args, **kwargs)
    return out._replace(logp=out.logp * 1.25)

  monkeypatch.setattr(rl_loop.sampling, "sample", wrong)
  with pytest.raises(RuntimeError, match="differ from the sampler"):
    ss.train_and_evaluate(tiny, RunOptions(workdir=str(tmp_path / "run")))


def test_config_validation(tiny):
  with pytest.raises(ValueError, match="corrects twice"):
    dataclasses.replace(tiny, ratio_against="sampler")
  with pytest.raises(ValueError, match="group_size"):
    dataclasses.replace(tiny, group_size=1)
  with pytest.raises(ValueError, match="temperature"):
    dataclasses.replace(tiny, sampler_temperature=0.0)
