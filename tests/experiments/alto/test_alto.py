"""experiments.alto end to end (two arms, a few steps) and the alto sweep's appendix."""

import dataclasses
import json
import math
import os

import jax
import numpy as np
import pytest

from experiments.alto import appendix
from experiments.alto import experiment as alto
from experiments.common.evidence import curves
from experiments.common.evidence.results import read_results
from experiments.common.evidence.tensorboard_reader import read_scalars
from experiments.common.evidence.tensorboard_writer import MetricWriter
from experiments.common.harness.run_options import RunOptions
from launch import registry
from launch.manifest import expand, write_manifest

TINY = alto.AltoConfig(num_steps=12, warmup_steps=2, seq_len=32, batch_size=8, d_model=32,
                       num_layers=1, num_heads=2, d_ff=32, num_experts=4, eval_every=6,
                       eval_batches=2, log_every=3, checkpoint_every=0, histogram_every=12,
                       max_chars=100_000, deosc_start=2, deosc_period=3)


@pytest.mark.parametrize("overrides", [
    {"recipe": "bf16"},
    {"recipe": "mxfp4", "deoscillation": True},
], ids=["bf16", "mxfp4_deosc"])
def test_two_arms_train_log_and_write_results(tmp_path, overrides):
  config = dataclasses.replace(TINY, **overrides)
  wd = tmp_path / "run"
  results = tmp_path / "results.jsonl"
  summary = alto.train_and_evaluate(config, RunOptions(workdir=str(wd),
                                                       results_file=str(results)))
  assert summary["completed"] and summary["step"] == 12
  scalars = read_scalars(str(wd))
  assert [s for s, _ in scalars["eval/loss"]] == [0, 6, 12]
  # The balance loss is part of the training loss; the validation loss is next-token only.
  for (_, total), (_, ntl), (_, bal) in zip(scalars["train/loss"],
                                            scalars["train/next_token_loss"],
                                            scalars["train/sown/moe_balance"]):
    np.testing.assert_allclose(total, ntl + bal * TINY.num_layers, rtol=1e-5)
    assert bal >= TINY.moe_balance_coef * 0.99  # E * sum f P >= 1 (Cauchy-Schwarz)
  assert all(0 <= v < 1 for _, v in scalars["train/sown/moe_dropped"])
  assert scalars["eval/loss"][-1][1] < scalars["eval/loss"][0][1]
  assert ("train/deosc/snapped" in scalars) == bool(overrides.get("deoscillation"))
  # Expert and router weights are not 2-D "kernel" leaves of the recipe: not inspected.
  assert not any("router" in t for t in scalars)
  [row] = read_results(str(results))
  assert row["experiment"] == "alto" and row["config"]["recipe"] == overrides["recipe"]
  meta = json.load(open(wd / "config.json"))
  assert meta["config"]["deoscillation"] == bool(overrides.get("deoscillation"))


def test_compensation_and_curve_metrics(tmp_path):
  """A compensated MXFP4 run's results row carries the steps to the target loss and
  the late gain, recomputed here from its logged eval curve."""
  config = dataclasses.replace(TINY, compensation_rank=2, late_from=6, num_steps=18)
  first = alto.train_and_evaluate(config, RunOptions(workdir=str(tmp_path / "probe")))
  losses = dict(read_scalars(str(tmp_path / "probe"))["eval/loss"])
  # A target between the evaluations at steps 6 and 12, and one never reached.
  target = 0.5 * (losses[6] + losses[12])
  assert losses[12] < target < losses[6] and min(losses.values()) == losses[18]
  for goal, reached in ((target, True), (0.5 * losses[18], False)):
    wd = tmp_path / f"run{int(reached)}"
    summary = alto.train_and_evaluate(dataclasses.replace(config, target_loss=goal),
                                      RunOptions(workdir=str(wd)))
    m = summary["metrics"]
    assert m["eval/loss"] == first["metrics"]["eval/loss"]  # deterministic
    expected = 6 + 6 * (losses[6] - goal) / (losses[6] - losses[12]) if reached else 18
    np.testing.assert_allclose(m["eval/steps_to_target"], expected, rtol=1e-6)
    assert m["eval/target_reached"] == float(reached)
    np.testing.assert_allclose(m["eval/late_gain"], losses[6] - losses[18], rtol=1e-6)
  scalars = read_scalars(str(wd))
  assert "eval/steps_to_target" in scalars and "eval/late_gain" in scalars  # for the report
  with pytest.raises(ValueError, match="late_from=5 must be an evaluated step"):
    dataclasses.replace(TINY, late_from=5)
  with pytest.raises(ValueError, match="late_from=12 must be an evaluated step"):
    dataclasses.replace(TINY, late_from=12)


def test_recipe_options_build_the_named_variants():
  for option, suffix in (("dge", "+dge"), ("static_clip", "+static_clip"),
                         ("dynamic_clip", "+dynamic_clip"), ("macro_block", "+mbs")):
    r = dataclasses.replace(TINY, recipe_options=option).build_recipe()
    assert r.name == "mxfp4" + suffix
  r = dataclasses.replace(TINY, recipe_options="dge, static_clip").build_recipe()
  assert r.name == "mxfp4+dge+static_clip" and r.dge_k == 5
  assert r.forward.lhs.prescale == 0.75


def test_config_validation():
  with pytest.raises(ValueError, match="unknown recipe_options"):
    dataclasses.replace(TINY, recipe_options="lowrank")
  with pytest.raises(ValueError, match="need a quantized recipe"):
    dataclasses.replace(TINY, recipe="bf16", recipe_options="dge")
  with pytest.raises(ValueError, match="deoscillation needs a recipe"):
    dataclasses.replace(TINY, recipe="bf16", deoscillation=True)
  with pytest.raises(ValueError, match="unknown recipe"):
    dataclasses.replace(TINY, recipe="mxfp3")


def test_deoscillation_mask_covers_exactly_the_quantized_weights():
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from lowprec.models.transformer import DecoderLM  # pylint: disable=import-outside-toplevel
  model = DecoderLM(TINY.transformer_config(30))
  # The mask reads paths only: the parameters' shapes, without running init.
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32),
                          jax.random.PRNGKey(1))["params"]
  mask = alto.quantized_weight_mask(params)
  flat = {jax.tree_util.keystr(p): m for p, m in jax.tree_util.tree_flatten_with_path(mask)[0]}
  on = sorted(k for k, m in flat.items() if m)
  assert on == sorted(["['block_0']['attn_out']['kernel']", "['block_0']['qkv']['kernel']",
                       "['block_0']['moe']['w_in']", "['block_0']['moe']['w_out']"])


def test_steps_to_target_and_value_at_by_hand():
  curve = [(0, 4.0), (10, 3.0), (20, 2.0), (30, 2.5)]
  assert curves.steps_to_target(curve, 3.0) == 10.0
  assert curves.steps_to_target(curve, 2.5) == 15.0  # halfway from 3.0 to 2.0
  assert curves.steps_to_target(curve, 1.9) is None
  assert curves.steps_to_target([(0, 1.0)], 2.0) == 0.0
  assert curves.value_at(curve, 25) == 2.0
  assert math.isnan(curves.value_at(curve, -1))


def test_convergence_table_from_planted_curves(tmp_path):
  sweep = dataclasses.replace(registry.get("alto"), seeds=(0, 1))
  runs = expand(sweep, str(tmp_path))
  write_manifest(sweep, runs, str(tmp_path))
  n = sweep.base.num_steps
  steps = list(range(0, n + 1, 25))
  for r in runs:
    if r.arm not in ("bf16", "mxfp4_rht_sr"):
      continue
    # bf16 reaches 2.0 + 0.1 * seed at the end; mxfp4 is the same curve 25% slower
    # in steps, so it reaches bf16's final loss at 1.25 * n if at all (never here).
    stretch = 1.0 if r.arm == "bf16" else 0.8
    writer = MetricWriter(r.workdir)
    for s in steps:
      writer.write_scalars(s, {"eval/loss": 2.0 + 0.1 * r.seed + 1.0 - s * stretch / n})
    writer.close()
  table = appendix.convergence_table(str(tmp_path))
  rows = {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:-1]]
          for l in table.splitlines() if l.startswith("| `")}
  # columns: n, loss @ 50%, @ 75%, final, gap, overhead (reached), reached, overhead
  # (all seeds), overhead at 75%
  assert rows["`bf16`"][0] == "2" and rows["`bf16`"][4] == "+0.0000 [+0.0000, +0.0000]"
  assert rows["`bf16`"][5] == "+0.0 [+0.0, +0.0]" and rows["`bf16`"][6] == "2/2"
  # final gap: 1 - 0.8 = 0.2 for both seeds; never reaches the target.
  assert rows["`mxfp4_rht_sr`"][4] == "+0.2000 [+0.2000, +0.2000]"
  assert rows["`mxfp4_rht_sr`"][5] == "n/a" and rows["`mxfp4_rht_sr`"][6] == "0/2"
  # bf16 reaches mxfp4's final loss (its own final + 0.2) at step 0.8 n: 1 / 0.8 - 1.
  assert rows["`mxfp4_rht_sr`"][7] == "+25.0 [+25.0, +25.0]"
  assert rows["`bf16`"][7] == "+0.0 [+0.0, +0.0]"
  # bf16's loss at 0.75 n is reached by mxfp4 at 0.75 n / 0.8: again +25%.
  assert rows["`mxfp4_rht_sr`"][8] == "+25.0 [+25.0, +25.0]"
  assert rows["`nvfp4_rht_sr`"][0] == "0"
  assert os.path.exists(tmp_path / "sweep.json")


def test_dge_table_from_planted_statistics(tmp_path):
  sweep = dataclasses.replace(registry.get("alto"), seeds=(0, 1))
  runs = expand(sweep, str(tmp_path))
  write_manifest(sweep, runs, str(tmp_path))
  n = sweep.base.num_steps
  for r in runs:
    if r.arm != "mxfp4_rht_sr_dge":
      continue
    writer = MetricWriter(r.workdir)
    for s in (1, n // 4, n // 4 + 1, n):  # quarters 1, 1, 2, 4
      writer.write_scalars(s, {"train/dge/factor_mean": float(s), "train/dge/gradient_gain":
                               0.5 + r.seed, "train/dge/clamped_fraction": 0.1,
                               "train/dge/above_one_fraction": 0.2})
    writer.close()
  rows = [l for l in appendix.dge_table(str(tmp_path)).splitlines() if l.startswith("| `")]
  q = n // 4
  assert rows == [
      f"| `mxfp4_rht_sr_dge` | 1 | {(1 + q) / 2:.3f} | 0.100 | 0.200 | 1.000 |",
      f"| `mxfp4_rht_sr_dge` | 2 | {q + 1:.3f} | 0.100 | 0.200 | 1.000 |",
      f"| `mxfp4_rht_sr_dge` | 4 | {n:.3f} | 0.100 | 0.200 | 1.000 |"]


def test_negative_sweep_adds_one_option_to_the_alto_base():
  main, neg = registry.get("alto"), registry.get("alto_negative")
  assert neg.base.num_steps == main.base.num_steps // 2 and neg.base.macro_block == 64
  # the model, batch and lr are the alto sweep's (chosen there on its calibration seed)
  for field in ("d_model", "batch_size", "learning_rate", "seq_len", "num_layers"):
    assert getattr(neg.base, field) == getattr(main.base, field), field
  base = next(a for a in neg.arms if a.name == neg.baseline).overrides
  for arm in neg.arms:
    extra = {k: v for k, v in arm.overrides.items() if base.get(k) != v}
    assert set(extra) <= {"recipe_options"} and arm.overrides["recipe"] == "mxfp4"
  assert len(neg.seeds) >= 5 and {c.arm for c in neg.claims} == {
      "static_clip", "dynamic_clip", "macro_block"}
