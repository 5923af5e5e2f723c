"""experiments.optimizer_state end to end (a few steps), its state metrics on a
hand-worked state, and the sweep's declaration and appendix."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments.common.evidence.results import append_result, read_results
from experiments.common.evidence.tensorboard_reader import read_scalars
from experiments.common.evidence.tensorboard_writer import MetricWriter
from experiments.common.harness.run_options import RunOptions
from experiments.optimizer_state import appendix
from experiments.optimizer_state import experiment as ostate
from launch import registry
from launch.manifest import expand, write_manifest
from lowprec.numerics.optim import moment_codecs
from lowprec.numerics.optim.quantized_adam import scale_by_quantized_adam

TINY = ostate.OptimizerStateConfig(
    num_steps=8, warmup_steps=2, seq_len=32, batch_size=8, d_model=32, num_layers=1,
    num_heads=2, d_ff=32, num_experts=4, eval_every=4, eval_batches=2, log_every=2,
    checkpoint_every=0, histogram_every=0, max_chars=100_000, min_quantized_size=1024)


@pytest.mark.parametrize("overrides", [
    {"moment_format": "fp32", "num_experts": 0},
    {"moment_format": "dynamic4", "moment_rounding": "stochastic"},
], ids=["dense_fp32", "moe_dynamic4_sr"])
def test_run_logs_state_metrics_and_writes_results(tmp_path, overrides):
  config = dataclasses.replace(TINY, **overrides)
  wd, results = tmp_path / "run", tmp_path / "results.jsonl"
  summary = ostate.train_and_evaluate(config, RunOptions(workdir=str(wd),
                                                         results_file=str(results)))
  assert summary["completed"] and summary["step"] == 8
  scalars = read_scalars(str(wd))
  assert [s for s, _ in scalars["eval/loss"]] == [0, 4, 8]
  assert ("train/sown/moe_balance" in scalars) == (config.num_experts > 0)
  bpp = scalars["train/optim/state_bytes_per_param"][-1][1]
  param_bytes = scalars["train/optim/param_bytes"][-1][1]
  state_bytes = scalars["train/optim/state_bytes"][-1][1]
  np.testing.assert_allclose(bpp, state_bytes / (param_bytes / 4), rtol=1e-6)
  if config.moment_format == "fp32":
    # two float32 moments per parameter plus three int32 counters (adam, schedule)
    # and nothing else: 8 B/param up to the counters.
    assert 8.0 < bpp < 8.0 + 16 / (param_bytes / 4)
    assert all(v == 0 for _, v in scalars["train/optim/nu_zero_frac"])
  else:
    assert bpp < 4.0  # 4-bit codes on every leaf of >= 1024 elements
  [row] = read_results(str(results))
  assert row["experiment"] == "optimizer_state"
  assert row["config"]["moment_format"] == config.moment_format


def test_state_metrics_on_a_hand_worked_e2m1_state():
  # One leaf of 4 blocks of 128: per block one gradient of 1 and the rest 0.1. After
  # one step (b1 0.9, b2 0.999): m = 0.1 g, v = 0.001 g^2. E2M1 with the block's
  # absmax scaled to 6: v's small entries are 0.01 * 6 = 0.06 of a grid step of 0.5
  # (below 0.25): stored 0; m's are 0.1 * 6 = 0.6 -> 0.5, not 0. So 127 of every 128
  # stored v are 0 under a non-zero m, and the largest ratio is m / eps with m =
  # 0.5 / 6 * 0.1 (the block's absmax 0.1 scaled back).
  fmt = moment_codecs.state_format("e2m1", min_size=0)
  tx = scale_by_quantized_adam(b1=0.9, b2=0.999, state_format=fmt)
  params = {"w": jnp.zeros((4, 128), jnp.float32)}
  grads = {"w": jnp.full((4, 128), 0.1, jnp.float32).at[:, 0].set(1.0)}
  _, state = tx.update(grads, tx.init(params), params)
  metrics = jax.device_get(ostate.state_metrics((optax.EmptyState(), state)))
  np.testing.assert_allclose(metrics["optim/nu_zero_frac"], 127 / 128, rtol=1e-6)
  np.testing.assert_allclose(metrics["optim/max_update_ratio"], (0.5 / 6 * 0.1) / 1e-8,
                             rtol=1e-5)
  n = 4 * 128
  assert metrics["optim/param_bytes"] == 4 * n
  # 4-bit codes two per byte for each moment, a float32 scale per block each, a count
  expected = 2 * (n // 2 + 4 * 4) + 4
  assert metrics["optim/state_bytes"] == expected
  np.testing.assert_allclose(metrics["optim/state_bytes_per_param"], expected / n)


def test_config_validation():
  with pytest.raises(ValueError, match="lossless"):
    dataclasses.replace(TINY, moment_format="fp32", moment_rounding="stochastic")
  with pytest.raises(ValueError, match="lossless"):
    dataclasses.replace(TINY, moment_format="fp32", sqrt_nu=True)
  with pytest.raises(ValueError, match="moment_format"):
    dataclasses.replace(TINY, moment_format="int3")
  with pytest.raises(ValueError, match="block_size"):
    dataclasses.replace(TINY, moment_format="bf16", moment_block_size=64)
  with pytest.raises(ValueError, match="found 0"):
    ostate.state_metrics(optax.EmptyState())


def test_alto_only_options_are_not_flags_of_this_study():
  """Before: the config inherited ALTO's, so --deoscillation was accepted and ignored
  (this study's optimizer never applied it)."""
  for name in ("deoscillation", "recipe_options", "dge_k", "macro_block"):
    assert name not in {f.name for f in dataclasses.fields(ostate.OptimizerStateConfig)}
  with pytest.raises(TypeError, match="deoscillation"):
    ostate.OptimizerStateConfig(deoscillation=True)  # pylint: disable=unexpected-keyword-arg


def test_sweep_declaration_expands_without_calibration_seeds(tmp_path):
  sweep = registry.get("optimizer_state")
  runs = expand(sweep, str(tmp_path))
  assert len(runs) == len(sweep.arms) * len(sweep.seeds)
  assert 0 not in {r.seed for r in runs} and sweep.calibration_seeds == (0,)
  dense = [a for a in sweep.arms if a.name.startswith("dense_")]
  assert dense and all(a.overrides["num_experts"] == 0 for a in dense)


def test_appendix_from_planted_curves(tmp_path):
  sweep = dataclasses.replace(registry.get("optimizer_state"), seeds=(1, 2))
  runs = expand(sweep, str(tmp_path))
  write_manifest(sweep, runs, str(tmp_path))
  n, every = sweep.base.num_steps, sweep.base.eval_every
  for r in runs:
    if r.arm not in ("moe_fp32", "moe_e2m1"):
      continue
    broken = r.arm == "moe_e2m1"
    writer = MetricWriter(r.workdir)
    for s in range(0, n + 1, every):
      writer.write_scalars(s, {"eval/loss": 2.0 + 0.1 * r.seed + (s / n if broken else 0),
                               "train/optim/state_bytes_per_param": 1.0 if broken else 8.0,
                               "train/optim/state_bytes": 1e6 if broken else 8e6,
                               "train/optim/param_bytes": 4e6,
                               "train/optim/nu_zero_frac": 0.25 * s / n if broken else 0.0,
                               "train/optim/max_update_ratio": 1.0})
    writer.close()
    # The run's final metrics, as its results row records them (the byte counts are
    # read from the rows, which event thinning leaves whole).
    append_result(str(tmp_path / "results.jsonl"), {
        "run_name": r.run_name, "completed": True,
        "metrics": {"train/optim/state_bytes_per_param": 1.0 if broken else 8.0,
                    "train/optim/state_bytes": 1e6 if broken else 8e6,
                    "train/optim/param_bytes": 4e6}})
  text = appendix.optimizer_state_appendix(str(tmp_path))
  rows = {}
  for line in text.splitlines():
    if line.startswith("| `"):
      cells = [c.strip() for c in line.split("|")[1:-1]]
      rows.setdefault(cells[0], []).append(cells[1:])
  per_arm, budget = rows["`moe_e2m1`"]
  assert per_arm[0] == "2" and per_arm[2].startswith("+1.0000 [")  # gap of 1.0 nats
  assert per_arm[3] == "1.000 ± 0.000" and per_arm[4] == "0.2500 ± 0.0000"
  assert budget == ["1.000 M", "4.000", "4.000", "1.000", "11.1%"]  # 1 / (4 + 4 + 1)
  assert rows["`moe_fp32`"][0][2] == "(baseline)"
  assert rows["`moe_fp32`"][1][-1] == "50.0%"  # 8 / (4 + 4 + 8)
  assert rows["`moe_bf16`"][0][:2] == ["0", "no completed runs"]
