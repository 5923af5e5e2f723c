"""experiments.mxfp8_rl: recipe pairs end to end with the seven sync checks."""

import dataclasses

import jax
import pytest

from experiments.common.evidence.tensorboard_reader import read_scalars
from experiments.common.harness.run_options import RunOptions
from experiments.common.trainers.rl.config import make_model
from experiments.common.trainers.rl.warm_start import warm_start
from experiments.mxfp8_rl import experiment as mxfp8_rl
from lowprec.numerics import tree_paths
from experiments.mxfp8_rl import weight_sync
from tests import compile_cache


# Four runs of one tiny config (two learner recipes) rebuild the RL loop's jitted
# closures; a program that differs (the bf16 learner's step) still compiles.
_compile_each_program_once = compile_cache.module_fixture()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  # d_model 48 is not a multiple of the MX block: the served kernels are padded.
  return mxfp8_rl.MXFP8RLConfig(
      digits=2, d_model=48, num_layers=1, num_heads=2, d_ff=64, pretrain_steps=150,
      pretrain_batch=32, pretrain_lr=1e-2, num_updates=3, prompts_per_update=4,
      group_size=4, learning_rate=1e-3, eval_every=3, eval_problems=32, probe_problems=4,
      pretrain_dir=str(tmp_path_factory.mktemp("pretrain")))


def test_matching_recipes_are_exact_and_crossed_ones_are_not(tiny, tmp_path):
  k3 = {}
  for learner, sampler in (("mxfp8", "mxfp8"), ("bf16", "mxfp8")):
    config = dataclasses.replace(tiny, learner_recipe=learner, sampler_recipe=sampler)
    workdir = str(tmp_path / f"{learner}_{sampler}")
    summary = mxfp8_rl.train_and_evaluate(config, RunOptions(workdir=workdir))
    assert summary["experiment"] == "mxfp8_rl" and summary["completed"]
    s = read_scalars(workdir)
    # A sync before every update, the first at update 0 (logged at step 0).
    assert [u for u, _ in s["sync/k3"]] == [0, 2, 3]
    assert all(v > 0 for _, v in s["sync/mx_tensors"])
    assert all(v == 0 for _, v in s["sync/padding_max_abs_diff"])
    k3[learner] = [v for _, v in s["sync/k3"]]
    assert "train/mismatch_k3" in s
  assert k3["mxfp8"] == [0.0, 0.0, 0.0]
  assert all(v > 0 for v in k3["bf16"])


def test_served_copy_is_the_serving_engines(tiny):
  params = tiny.initial_master(warm_start(tiny, make_model(tiny))[0])
  served = tiny.serve(params)
  plan = tiny.served_plan(params)
  assert plan["head/kernel"] == "bf16" and plan["embed/embedding"] == "fp32"
  assert plan["block_0/qkv/kernel"] == "mxfp8" and plan["block_0/attn_norm/scale"] == "fp32"
  names = tree_paths.named_leaves(served)
  assert names["block_0/qkv/kernel"].dtype == jax.numpy.bfloat16
  assert params["pos_embed"].shape[0] == mxfp8_rl.MAX_LEN
  weight_sync.check_mx_scales(names["block_0/qkv/kernel"].astype(jax.numpy.float32),
                              axis=0, scale_rule="rceil")


def test_a_bf16_list_resolved_differently_by_the_sampler_fails(tiny, tmp_path):
  config = dataclasses.replace(tiny, sampler_keep_bf16="*/qkv/*")
  with pytest.raises(weight_sync.WeightSyncError, match="layer plan"):
    mxfp8_rl.train_and_evaluate(config, RunOptions(workdir=str(tmp_path / "run")))


def test_an_export_that_is_not_the_configured_one_fails(tiny, tmp_path):
  class Wrong(mxfp8_rl.MXFP8RLConfig):
    def exporter(self):  # serves the head in float32 instead of through the plan
      good = super().exporter()
      return good._replace(export=lambda m, s, k: ({**good.export(m, s, k)[0],
                                                    "head": m["head"]}, s))

  config = Wrong(**dataclasses.asdict(tiny))
  with pytest.raises(weight_sync.WeightSyncError):
    mxfp8_rl.train_and_evaluate(config, RunOptions(workdir=str(tmp_path / "run")))


def test_config_validation(tiny):
  with pytest.raises(ValueError, match="sampler_recipe"):
    dataclasses.replace(tiny, sampler_dtype="bfloat16")
  with pytest.raises(ValueError, match="learner_recipe"):
    dataclasses.replace(tiny, learner_recipe="fp4")
