"""experiments.scale_rules: the PTQ recipe against the NumPy MX reference; the cached
base; the config's one-line refusals."""

import dataclasses
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.common.harness.run_options import RunOptions
from experiments.scale_rules import experiment as sr
from lowprec.models import Rule, quantize_model
from tests.numerics import mx_reference, qwix_oracle

_TINY = dict(num_steps=6, warmup_steps=1, d_model=32, num_heads=2, d_ff=64, seq_len=32,
             batch_size=4, eval_batches=2, max_chars=60_000)


@pytest.mark.parametrize("fmt,rule", [("e4m3", "floor"), ("e4m3", "rceil"),
                                      ("e2m1", "floor"), ("e2m1", "rceil"),
                                      ("e2m1", "even")])
def test_recipe_quantizes_both_operands_along_the_contraction_with_the_rule(fmt, rule):
  """A Dense under the evaluated recipe is x and W each quantized by the NumPy OCP MX
  reference in blocks of 32 along the contraction axis (x's last, W's first), then
  multiplied."""
  recipe = sr.ScaleRulesConfig(fmt=fmt, scale_rule=rule).model_recipe()
  model = quantize_model(nn.Dense(8, use_bias=False), [Rule(".*", recipe)])
  rng = np.random.default_rng(0)
  # Heavy-tailed values so that blocks differ in amax and saturate under floor.
  x = (rng.standard_t(3, size=(4, 64)) * 3.0).astype(np.float32)
  w = (rng.standard_t(3, size=(64, 8)) * 0.1).astype(np.float32)
  y = model.apply({"params": {"kernel": jnp.asarray(w)}}, jnp.asarray(x))
  xq = mx_reference.quantize_mx(x, fmt, rule, axis=-1)[2]
  wq = mx_reference.quantize_mx(w, fmt, rule, axis=0)[2]
  want = xq.astype(np.float64) @ wq.astype(np.float64)
  np.testing.assert_allclose(np.asarray(y, np.float64), want, rtol=2e-6, atol=1e-6)
  assert not np.allclose(xq, x)  # the test sees quantization at all


@pytest.mark.parametrize("fmt,qtype", [("e4m3", "mxfp8"), ("e2m1", "mxfp4")])
def test_the_qwix_rule_is_qwix_s_own_quantization_of_both_operands(fmt, qtype):
  recipe = sr.ScaleRulesConfig(fmt=fmt, scale_rule="qwix").model_recipe()
  model = quantize_model(nn.Dense(8, use_bias=False), [Rule(".*", recipe)])
  rng = np.random.default_rng(1)
  x = (rng.standard_t(3, size=(4, 64)) * 3.0).astype(np.float32)
  w = (rng.standard_t(3, size=(64, 8)) * 0.1).astype(np.float32)
  y = model.apply({"params": {"kernel": jnp.asarray(w)}}, jnp.asarray(x))
  xq = qwix_oracle.quantize(x, qtype)[2]
  wq = qwix_oracle.quantize(np.ascontiguousarray(w.T), qtype)[2].T
  want = xq.astype(np.float64) @ wq.astype(np.float64)
  np.testing.assert_allclose(np.asarray(y, np.float64), want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("fmt,rule", [("e2m1", "none"), ("bf16", "floor"),
                                      ("nvfp4", "rceil")])
def test_a_rule_that_does_not_fit_the_format_is_refused_in_one_line(fmt, rule):
  with pytest.raises(ValueError, match=f"--scale_rule={rule} with --fmt={fmt}"):
    sr.ScaleRulesConfig(fmt=fmt, scale_rule=rule)


def _run(tmp_path, name, **overrides):
  config = sr.ScaleRulesConfig(**_TINY, pretrain_dir=str(tmp_path / "pre"), **overrides)
  workdir = str(tmp_path / name)
  sr.train_and_evaluate(config, RunOptions(workdir=workdir, run_name=name))
  with open(os.path.join(workdir, "results.jsonl")) as f:
    return json.loads(f.readline())["metrics"]


def test_arms_of_a_seed_share_one_cached_base(tmp_path):
  """The first run trains and caches the seed's base; the next arm reads it (no
  training, the same base loss); bf16 projections barely move the loss, e2m1 does, and
  its operands' telemetry is recorded."""
  first = _run(tmp_path, "e2m1", fmt="e2m1", scale_rule="floor")
  second = _run(tmp_path, "bf16", fmt="bf16", scale_rule="none")
  assert first["base/train_s"] > 0 and second["base/train_s"] == 0
  assert first["base/eval_loss"] == second["base/eval_loss"]
  assert abs(second["ptq/loss_increase"]) < 0.01
  assert first["ptq/loss_increase"] != second["ptq/loss_increase"]
  assert 0 < first["ptq/sqnr_db_weight"] < 40 and "ptq/sqnr_db_weight" not in second
  assert len(os.listdir(tmp_path / "pre")) == 2  # the base and its lock
  other = _run(tmp_path, "seed1", fmt="bf16", scale_rule="none", seed=1)
  assert other["base/train_s"] > 0 and other["base/eval_loss"] != first["base/eval_loss"]


def test_the_base_config_is_every_field_but_the_evaluated_quantization():
  config = sr.ScaleRulesConfig(fmt="nvfp4", scale_rule="none", seed=7, d_model=48)
  base = config.base_config()
  assert base.recipe == "fp32" and base.seed == 7 and base.d_model == 48
  assert not hasattr(base, "fmt")
  assert dataclasses.replace(config, fmt="bf16").base_config() == base


def test_ptq_telemetry_is_the_evaluated_batches_alone():
  """The ptq/ means once included the telemetry init sowed (random weights on a zero
  input): each operand's SQNR and saturated fraction against a direct apply of the
  quantized model on the same batch with fresh collections."""
  from experiments.common.trainers import lm_trainer  # pylint: disable=g-import-not-at-top
  from lowprec.models import quantization  # pylint: disable=g-import-not-at-top
  config = sr.ScaleRulesConfig(**_TINY, fmt="e2m1", scale_rule="floor")
  parts = lm_trainer.build_lm(config, 40)
  params = parts.init(jax.random.PRNGKey(3))[0]
  inputs = jax.random.randint(jax.random.PRNGKey(4), (4, 33), 0, 40)
  batch = {"inputs": inputs[:, :-1], "targets": inputs[:, 1:]}
  got = sr.evaluate(config, params, [batch], 40)
  _, sown = parts.model.apply({"params": params}, batch["inputs"], jax.random.PRNGKey(0),
                              mutable=[quantization.NUMERICS])
  want = quantization.telemetry_scalars(sown[quantization.NUMERICS])
  for side, name in (("forward_lhs", "act"), ("forward_rhs", "weight")):
    for stat in ("sqnr_db", "saturated"):
      values = [float(v) for k, v in want.items() if k.endswith(f"/{side}/{stat}")]
      assert values, (side, stat)
      np.testing.assert_allclose(got[f"ptq/{stat}_{name}"], np.mean(values), rtol=1e-6)
