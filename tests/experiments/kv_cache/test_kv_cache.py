"""experiments.kv_cache: the exact outlier reparametrization, the cache names, a run."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.common.harness.run_options import RunOptions
from experiments.kv_cache import experiment as kv
from experiments.kv_cache.outliers import scale_key_channels
from launch import registry
from lowprec.models import kv_cache
from lowprec.models.transformer import DecoderLM, TransformerConfig
from lowprec.numerics import kv_quant
from tests import compile_cache


# Runs of one tiny config (end to end, warm starts) rebuild the same jitted steps.
_compile_each_program_once = compile_cache.module_fixture()


CFG = TransformerConfig(vocab_size=14, d_model=16, num_layers=2, num_heads=2, d_ff=32,
                        max_len=8)
KEY = jax.random.PRNGKey(0)


def _keys(params, tokens):
  model = DecoderLM(CFG)
  cache = kv_cache.init_cache(CFG, *tokens.shape)
  logits, cache = jax.jit(lambda p: model.apply({"params": p}, tokens, KEY, cache=cache))(
      params)
  return logits, [np.asarray(kv_quant.read(c)) for c in cache.keys], \
      [np.asarray(kv_quant.read(c)) for c in cache.values]


@pytest.mark.parametrize("gain,channels", [(8, 2), (-12, 0)])
def test_outlier_channels_change_the_keys_not_the_model(gain, channels):
  model = DecoderLM(CFG)
  params = model.init(KEY, jnp.zeros((1, 8), jnp.int32), KEY)["params"]
  tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 8), 0, 14)
  scaled = scale_key_channels(params, CFG.num_heads, gain, channels)
  full = jax.jit(lambda p: model.apply({"params": p}, tokens, KEY))
  np.testing.assert_array_equal(full(scaled), full(params))  # bit for bit
  logits, keys, values = _keys(params, tokens)
  logits_s, keys_s, values_s = _keys(scaled, tokens)
  np.testing.assert_array_equal(logits_s, logits)
  # By hand: channel c < channels (all when 0) of every head times 2^gain, exactly.
  want = np.ones(CFG.d_model // CFG.num_heads, np.float32)
  want[:channels or len(want)] = 2.0 ** gain
  for k, k_s, v, v_s in zip(keys, keys_s, values, values_s):
    np.testing.assert_array_equal(k_s, k * want)
    np.testing.assert_array_equal(v_s, v)
  assert scale_key_channels(params, CFG.num_heads, 0) is params


def test_outlier_validation():
  params = DecoderLM(CFG).init(KEY, jnp.zeros((1, 8), jnp.int32), KEY)["params"]
  with pytest.raises(TypeError, match="int"):
    scale_key_channels(params, 2, 1.5)
  with pytest.raises(ValueError, match="channels"):
    scale_key_channels(params, 2, 3, channels=9)
  with pytest.raises(ValueError, match="block_"):
    scale_key_channels({"embed": {}}, 2, 3)


def test_parse_cache():
  assert kv.parse_cache("fp32") == (kv_quant.KVQuantSpec(), None)
  assert kv.parse_cache("e4m3/tensor/unit") == (kv_quant.KVQuantSpec("e4m3", "tensor"),
                                                "unit")
  assert kv.parse_cache("int8/head/calibrated")[1] == "calibrated"
  assert kv.parse_cache("e4m3/block") == (kv_quant.KVQuantSpec("e4m3", "block"), None)
  assert kv.parse_cache("nvfp4") == (kv_quant.KVQuantSpec("nvfp4", "block"), None)
  assert kv.parse_cache("e4m3/block/16") == (
      kv_quant.KVQuantSpec("e4m3", "block", block_size=16), None)
  for bad, match in (("e4m3", "granularity"), ("e4m3/tensor", "static"),
                     ("e4m3/token/unit", "computed"), ("bf16/token", "no granularity"),
                     ("fp16", "unknown KV format"), ("nvfp4/token", "nvfp4"),
                     ("e4m3/block/x", "integer"), ("e4m3/block/0", "positive")):
    with pytest.raises(ValueError, match=match):
      kv.parse_cache(bad)
  with pytest.raises(ValueError, match="no effect"):
    kv.KVCacheConfig(key_outlier_channels=2)


def test_sweep_declaration():
  sweep = registry.get("kv_cache")
  assert sweep.baseline == "fp32" and set(sweep.seeds).isdisjoint(sweep.calibration_seeds)
  names = [a.name for a in sweep.arms]
  assert "out_e4m3_tensor_unit" in names and "small_e4m3_tensor_unit" in names
  for arm in sweep.arms:  # every arm's caches parse
    config = dataclasses.replace(sweep.base, **arm.overrides)
    kv.parse_cache(config.key_cache)


def test_run_end_to_end(tmp_path):
  config = kv.KVCacheConfig(seed=0, key_cache="e4m3/tensor/calibrated",
                            value_cache="int8/token", key_outlier_log2=8,
                            key_outlier_channels=2, d_model=32, num_layers=1, d_ff=32,
                            weight_format="e2m1/g16/awq", pretrain_steps=2, eval_problems=8, calibration_problems=4,
                            pretrain_dir=str(tmp_path / "pretrain"))
  options = RunOptions(workdir=str(tmp_path / "run"), single_process=True)
  summary = kv.train_and_evaluate(config, options)
  m = summary["metrics"]
  assert summary["completed"] and 0 <= m["kv/greedy_accuracy"] <= 1
  assert m["kv/key_abs_max"] > 100  # the outlier channels
  assert 0 < m["weights/rel_error"] < 0.3 and 0 <= m["weights/awq_alpha"] < 1
  assert m["kv/bytes_per_token"] == kv_cache.bytes_per_token(
      config.model().config, kv_quant.KVQuantSpec("e4m3", "tensor"),
      kv_quant.KVQuantSpec("int8", "token"))
  with open(tmp_path / "run" / "results.jsonl") as f:
    row = json.loads(f.read())
  assert row["metrics"]["kv/mismatch_k3"] == m["kv/mismatch_k3"]


def test_appendix_names_the_seeds_whose_base_did_not_learn(tmp_path):
  # The fault of the first kv_cache sweep: bases at 0.53 / 0.03 / 0.01 accuracy, with
  # nothing in the report saying the task was never learned.
  from experiments.common.evidence.results import append_result  # pylint: disable=import-outside-toplevel
  from experiments.kv_cache.appendix import kv_cache_appendix  # pylint: disable=import-outside-toplevel
  from launch.manifest import expand, write_manifest  # pylint: disable=import-outside-toplevel
  sweep = dataclasses.replace(registry.get("kv_cache"), seeds=(1, 2))
  runs = expand(sweep, str(tmp_path))
  write_manifest(sweep, runs, str(tmp_path))
  results = str(tmp_path / "results.jsonl")
  for r in runs:
    if r.arm in ("fp32", "e4m3_tensor_unit"):
      base = 0.99 if r.seed == 1 else 0.03
      append_result(results, {"run_name": r.run_name, "completed": True,
                              "metrics": {"kv/greedy_accuracy": base,
                                          "kv/fp32_greedy_accuracy": base}})
  text = kv_cache_appendix(str(tmp_path))
  assert "**The bases of seeds [2] did not learn the task**" in text
  assert "seed 1: [0.99]; seed 2: [0.03]" in text


def test_warm_start_doubles_its_steps_until_the_target_accuracy(tmp_path):
  tiny = dict(d_model=16, num_layers=1, d_ff=16, pretrain_steps=2, eval_problems=8,
              pretrain_dir=str(tmp_path / "pretrain"))
  # A target no 2-8 step base reaches: three attempts, the last (8 steps) is used.
  _, info = kv.base_params(kv.KVCacheConfig(pretrain_target_accuracy=1.0,
                                            pretrain_attempts=3, **tiny))
  assert info["pretrain_steps"] == 8 and info["greedy_accuracy"] < 1.0
  # Any base meets a target of 0: the first attempt is kept.
  _, info = kv.base_params(kv.KVCacheConfig(pretrain_target_accuracy=0.0, **tiny))
  assert info["pretrain_steps"] == 2
