"""experiments.kv_cache.weights: FP8 / AWQ-style 4-bit weights against a NumPy reference."""

import dataclasses
import json
import math
import os
import shutil

import jax
import ml_dtypes
import numpy as np
import pytest

from experiments.common.harness.repo_paths import REPO_DIR
from experiments.kv_cache import experiment as kv
from experiments.kv_cache import weights as w
from launch import registry, sequential_runner
from launch.manifest import expand, write_manifest
from launch.report import build_report
from lowprec.models.transformer import DecoderLM, TransformerConfig

_DTYPES = {"e4m3": (ml_dtypes.float8_e4m3fn, 448.0), "e5m2": (ml_dtypes.float8_e5m2, 57344.0),
           "e2m1": (ml_dtypes.float4_e2m1fn, 6.0)}


def _ref_quantize(w_io: np.ndarray, fmt: str, group: int) -> np.ndarray:
  """NumPy: symmetric absmax scales per (output channel, group of input channels),
  elements rounded by ml_dtypes (round to nearest even) after clipping to +-max."""
  dtype, fmax = _DTYPES[fmt]
  n_in, n_out = w_io.shape
  group = group or n_in
  out = np.empty_like(w_io, dtype=np.float32)
  for o in range(n_out):
    for g0 in range(0, n_in, group):
      v = w_io[g0:g0 + group, o].astype(np.float32)
      amax = np.float32(np.max(np.abs(v)))
      scale = np.float32(amax * np.float32(1.0 / fmax)) if amax >= 2.0 ** -126 else np.float32(1)
      inv = np.float32(np.float32(1) / scale)
      x = np.clip((v * inv).astype(np.float32), -fmax, fmax)
      out[g0:g0 + group, o] = x.astype(dtype).astype(np.float32) * scale
  return out


def _ref_awq(w_io: np.ndarray, x: np.ndarray, fmt: str, group: int):
  """NumPy AWQ: alpha on the 20-point grid minimizing the output MSE."""
  a = np.mean(np.abs(x.astype(np.float64)), axis=0)
  ref = x.astype(np.float64) @ w_io.astype(np.float64)
  best = None
  for i in range(20):
    s = np.maximum(a ** (i / 20), 1e-4)
    s = (s / np.sqrt(s.max() * s.min())).astype(np.float32)
    q = _ref_quantize(w_io * s[:, None], fmt, group) / s[:, None]
    err = np.mean((x.astype(np.float64) @ q.astype(np.float64) - ref) ** 2)
    if best is None or err < best[0]:
      best = (err, q, i / 20)
  return best[1], best[2]


def _weights(shape, seed=0):
  rng = np.random.default_rng(seed)
  return (rng.standard_normal(shape) * 0.1).astype(np.float32)


@pytest.mark.parametrize("fmt,group", [("e4m3", 0), ("e2m1", 32), ("e2m1", 64),
                                       ("e5m2", 16), ("e2m1", 0)])
def test_quantize_kernel_matches_numpy_bit_for_bit(fmt, group):
  x = _weights((64, 48))
  x[3, 5] = 0.0
  x[32:64, 7] = 0.0  # an all-zero group: scale 1, decodes to zeros
  spec = w.WeightSpec(fmt, group)
  got = np.asarray(jax.jit(lambda v: w.quantize_kernel(v, spec))(x))
  np.testing.assert_array_equal(got, _ref_quantize(x, fmt, group))
  np.testing.assert_array_equal(np.asarray(w.quantize_kernel(x, spec)), got)  # eager


def test_awq_matches_numpy_and_helps_on_outlier_activations():
  rng = np.random.default_rng(1)
  kernel = _weights((64, 32), seed=2)
  x = rng.standard_normal((256, 64)).astype(np.float32)
  x[:, :4] *= 20.0  # salient input channels: what AWQ protects
  spec = w.WeightSpec("e2m1", 32, awq=True)
  got, alpha = w.awq_kernel(kernel, x, spec)
  ref, ref_alpha = _ref_awq(kernel, x, "e2m1", 32)
  assert alpha == ref_alpha and alpha > 0
  np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-7)
  err = lambda q: float(np.mean((x @ np.asarray(q) - x @ kernel) ** 2))
  plain = w.quantize_kernel(kernel, dataclasses.replace(spec, awq=False))
  assert err(got) < 0.8 * err(plain)


def test_parse_weight_format():
  assert w.parse_weight_format("fp32") == w.WeightSpec()
  assert w.parse_weight_format("e4m3/channel") == w.WeightSpec("e4m3", 0)
  assert w.parse_weight_format("e2m1/g32/awq") == w.WeightSpec("e2m1", 32, True)
  for bad in ("fp16", "e4m3", "e2m1/g0", "e2m1/g32/gptq", "e4m3/tensor", "fp32/awq",
              "e2m1/g32/awq/x"):
    with pytest.raises(ValueError):
      w.parse_weight_format(bad)
  with pytest.raises(ValueError, match="weight format"):
    kv.KVCacheConfig(weight_format="e4m3/g7x")


def test_only_the_block_kernels_are_quantized():
  cfg = TransformerConfig(vocab_size=14, d_model=32, num_layers=1, num_heads=2, d_ff=64,
                          max_len=8)
  model = DecoderLM(cfg)
  tokens = np.ones((3, 8), np.int32)
  key = jax.random.PRNGKey(0)
  params = model.init(key, tokens, key)["params"]
  inputs = w.linear_inputs(model, params, tokens, key)
  assert set(inputs) == {f"block_{i}/{n}" for i in range(1)
                         for n in ("qkv", "attn_out", "ff_in", "ff_out")} | {"head"}
  assert inputs["block_0/ff_out"].shape == (3, 8, 64)
  q, alphas = w.quantize_params(params, w.WeightSpec("e2m1", 32, True), inputs)
  assert set(alphas) == set(inputs) - {"head"}
  flat = dict(jax.tree_util.tree_flatten_with_path(params)[0])
  for path, leaf in jax.tree_util.tree_flatten_with_path(q)[0]:
    name = "/".join(p.key for p in path)
    changed = not np.array_equal(np.asarray(leaf), np.asarray(flat[path]))
    assert changed == bool(w.QUANTIZED_PATH.fullmatch(name.rsplit("/", 1)[0])), name
  with pytest.raises(ValueError, match="calibration inputs"):
    w.quantize_params(params, w.WeightSpec("e2m1", 32, True))


def test_weights_sweep_is_declared_on_fresh_seeds():
  sweep = registry.get("kv_cache_weights")
  used = set()
  for name in registry.names():  # every other sweep of the experiment, declared ...
    other = registry.get(name)
    if name != sweep.name and other.module == sweep.module:
      used |= set(other.seeds) | set(other.calibration_seeds)
  for d, _, files in os.walk(os.path.join(REPO_DIR, "experiments", "kv_cache")):
    if "sweep.json" in files and "runs" not in d.split(os.sep):  # ... or recorded
      info = json.load(open(os.path.join(d, "sweep.json")))
      if info.get("name") != sweep.name:
        used |= set(info["seeds"]) | set(info.get("calibration_seeds", []))
  assert used and not set(sweep.seeds) & used
  assert not set(sweep.seeds) & set(sweep.calibration_seeds)
  names = {a.name for a in sweep.arms}
  assert {a for c in sweep.claims for a in (c.arm, c.baseline)} == names
  for arm in sweep.arms:  # every arm's format parses
    w.parse_weight_format(dataclasses.replace(sweep.base, **arm.overrides).weight_format)


def test_weights_report_on_made_up_results_rebuilds(tmp_path):
  """kv_cache_weights run on made-up results: the non-inferiority claims hold at the
  first look, the appendix tabulates every arm, and the report rebuilds byte for byte."""
  sweep = registry.get("kv_cache_weights")
  sweep_dir = str(tmp_path / "report_weights")
  write_manifest(sweep, [], sweep_dir)
  drop = {"fp32": 0.0, "w_e4m3_channel": 0.0, "w_e2m1_g32_awq": 0.002,
          "w_e2m1_g64_awq": 0.004, "w_e2m1_g32": 0.02}

  def run_batch(scheduled):
    with open(os.path.join(sweep_dir, "results.jsonl"), "a") as f:
      for r in scheduled:
        base = 0.99 - 0.001 * (r.seed % 3)
        acc = base - drop[r.arm] - 0.001 * math.sin(r.seed) * (r.arm != "fp32")
        f.write(json.dumps({"run_name": r.run_name, "completed": True, "metrics": {
            **{m: 0.0 for m in sweep.metrics}, "kv/greedy_accuracy": acc,
            "kv/fp32_greedy_accuracy": base,
            **({"weights/awq_alpha": 0.3} if "awq" in r.arm else {})}}) + "\n")

  result = sequential_runner.run_sequential(
      sweep, sweep_dir, expand(sweep, sweep_dir), run_batch,
      lambda s: write_manifest(sweep, s, sweep_dir), say=lambda _: None)
  assert result.done
  text = open(build_report(sweep_dir)).read()
  assert "## Every weight format" in text and "**Every base learned the task**" in text
  assert "| `w_e2m1_g32_awq` | 6 | 0.9870 ± 0.0012 |" in text
  assert text.count("held") >= 4
  copy = tmp_path / "copy"
  shutil.copytree(sweep_dir, copy)
  assert open(build_report(str(copy))).read() == text
