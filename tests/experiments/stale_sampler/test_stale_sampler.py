"""experiments.stale_sampler: one short RL arm end to end, and the harness checks."""

import dataclasses

import numpy as np
import pytest

from experiments.common.trainers.rl import harness_checks
from experiments.common.trainers.rl import loop as rl_loop
from experiments.stale_sampler import experiment as ss
from experiments.common.data import arithmetic_task
from experiments.common.evidence.results import read_results
from experiments.common.harness.run_options import RunOptions
from experiments.common.evidence.tensorboard_reader import read_scalars
from lowprec.models import sampling
from tests import compile_cache


# Seven runs of one tiny config and three warm starts rebuild their jitted closures; a
# program that differs (another refresh interval, a patched sampler) still compiles.
_compile_each_program_once = compile_cache.module_fixture()


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


def test_rollout_keys_streams():
  """Stream 0 keeps the historical keys; other streams are independent of it and of
  each other, and every stream is a pure function of (seed, stream, update)."""
  import jax  # pylint: disable=import-outside-toplevel
  data = lambda k: np.asarray(jax.random.key_data(k))
  for u in (0, 7):
    np.testing.assert_array_equal(data(rl_loop.rollout_keys(3, 0)(u)),
                                  data(jax.random.fold_in(jax.random.PRNGKey(3), u)))
  keys = {s: data(rl_loop.rollout_keys(3, s)(5)).tobytes() for s in (0, 1, 2)}
  assert len(set(keys.values())) == 3
  assert data(rl_loop.rollout_keys(3, 2)(5)).tobytes() == keys[2]


def test_arms_on_different_streams_are_different_runs(tiny, tmp_path):
  """Two arms that are the same process until their first refresh (K = 3 and K = 6 on
  the same warm start) are the same run on one stream and different runs on two."""
  def first_rewards(k, stream, name):
    cfg = dataclasses.replace(tiny, refresh_interval=k, sampling_stream=stream,
                              num_updates=3, eval_every=3)
    ss.train_and_evaluate(cfg, RunOptions(workdir=str(tmp_path / name)))
    return [v for _, v in read_scalars(str(tmp_path / name))["train/mismatch_k3"]]
  same = first_rewards(3, 0, "a"), first_rewards(6, 0, "b")
  assert same[0] == same[1]
  assert first_rewards(6, 5, "c") != same[0]


def test_warm_start_per_seed_and_target_accuracy(tiny, tmp_path):
  from experiments.common.trainers.rl import warm_start as ws  # pylint: disable=import-outside-toplevel
  from experiments.common.trainers.rl.config import make_model  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match="pretrain_seed=3 conflicts"):
    dataclasses.replace(tiny, warm_start_per_seed=True, pretrain_seed=3)
  per_seed = dataclasses.replace(tiny, warm_start_per_seed=True, seed=4)
  assert per_seed.warm_start_seed == 4 and tiny.warm_start_seed == 0
  # The target stops training at the first check that reaches it; the params are those
  # of a plain run of exactly that many steps (same batches, same optimizer).
  model = make_model(tiny)
  full = dataclasses.replace(tiny, pretrain_dir=str(tmp_path / "a"), pretrain_steps=150)
  _, info_full = ws.warm_start(full, model)
  target = dataclasses.replace(full, pretrain_dir=str(tmp_path / "b"),
                               pretrain_target_accuracy=1e-6, pretrain_check_every=25)
  params, info = ws.warm_start(target, model)
  used = info["pretrain_steps_used"]
  assert info_full["pretrain_steps_used"] == 150
  assert used % 25 == 0 and 0 < used < 150 and info["greedy_accuracy"] >= 1e-6
  plain, _ = ws.warm_start(dataclasses.replace(full, pretrain_dir=str(tmp_path / "c"),
                                               pretrain_steps=used), model)
  for x, y in zip(jax_leaves(params), jax_leaves(plain)):
    np.testing.assert_array_equal(x, y)


def jax_leaves(tree):
  import jax  # pylint: disable=import-outside-toplevel
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_accuracy_summary_by_hand():
  curve = [(0, 0.4), (8, 0.5), (16, 0.2), (24, 0.6), (32, 0.7)]
  out = rl_loop.accuracy_summary(curve, 32)
  assert out["accuracy/mean_over_training"] == pytest.approx(0.5)
  assert out["accuracy/min"] == pytest.approx(0.2)
  assert out["accuracy/last_quarter"] == pytest.approx(0.7)  # updates 25..32
  # a run stopped at 20 updates: its evaluations after 20 are not counted
  out = rl_loop.accuracy_summary(curve, 20)
  assert out["accuracy/last_quarter"] == pytest.approx(0.2)  # the evaluation at 16
  assert np.isnan(rl_loop.accuracy_summary([(0, 0.4)], 5)["accuracy/min"])
