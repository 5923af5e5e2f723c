"""experiments.nvfp4_recipe: the full recipe is numerics' nvfp4; each leave-one-out arm
removes exactly its component; the forward GEMM against the NumPy NVFP4 / MX
references; the bf16 last blocks; one-line refusals; a tiny end-to-end run."""

import dataclasses
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.common.harness.config_flags import replace_checked
from experiments.common.harness.run_options import RunOptions
from experiments.common.trainers import lm_trainer
from experiments.nvfp4_recipe import experiment as nv
from experiments.nvfp4_recipe import sweeps
from lowprec.models import Rule, quantization, quantize_model
from lowprec.numerics import operand_quant
from lowprec.numerics import recipes
from lowprec.numerics.rounding import Nearest
from tests.numerics import mx_reference as ref

_TINY = dict(num_steps=6, warmup_steps=1, d_model=32, num_heads=2, d_ff=64, seq_len=32,
             batch_size=4, eval_batches=2, max_chars=60_000, num_layers=2,
             eval_every=0, checkpoint_every=0, histogram_every=0)


def _arm(name):
  overrides = next(a.overrides for a in sweeps.ARMS if a.name == name)
  return replace_checked(sweeps.BASE, dict(overrides))


def _fields(config):
  """Every component of a config's numerics: each GEMM operand and RHT, the weight
  reuse, and the bf16 blocks."""
  r = config.model_recipe()
  out = {f"{g}.{side}": getattr(getattr(r, g), side)
         for g in recipes.GEMM_NAMES for side in ("lhs", "rhs", "hadamard")}
  out.update(reuse=r.reuse_forward_weight, compute_dtype=r.compute_dtype,
             bf16_blocks=config.bf16_blocks())
  return out


def _differing(a, b):
  fa, fb = _fields(a), _fields(b)
  return {k for k in fa if fa[k] != fb[k]}


def test_the_full_recipe_is_numerics_nvfp4_up_to_its_name():
  full = _arm("nvfp4_full").model_recipe()
  assert full.name != "nvfp4"
  assert dataclasses.replace(full, name="nvfp4") == recipes.get("nvfp4")
  assert sweeps.BASE.bf16_blocks() == (3,)  # the last of 4 blocks


@pytest.mark.parametrize("arm,component", [
    ("no_2d", {"forward.rhs", "dgrad.rhs", "reuse"}),
    ("no_rht", {"wgrad.hadamard"}),
    ("no_sr", {"dgrad.lhs", "wgrad.rhs"}),
    ("no_bf16_last", {"bf16_blocks"}),
])
def test_each_leave_one_out_arm_removes_exactly_its_component(arm, component):
  full, other = _arm("nvfp4_full"), _arm(arm)
  assert _differing(full, other) == component
  f, o = _fields(full), _fields(other)
  if arm == "no_2d":  # 16x16 tiles reused in dgrad -> 1D blocks, re-quantized for dgrad
    assert f["forward.rhs"].block_shape == (16, 16) and f["dgrad.rhs"] is None
    assert o["forward.rhs"] == o["dgrad.rhs"] == recipes.NVFP4Quant()
  if arm == "no_sr":  # only the rounding of dO changes
    for k in component:
      assert operand_quant.replace(f[k], rounding=Nearest()) == o[k]
      assert f[k].rounding.needs_key and not o[k].rounding.needs_key
  if arm == "no_rht":
    assert f["wgrad.hadamard"] == 16 and o["wgrad.hadamard"] is None
  if arm == "no_bf16_last":
    assert o["bf16_blocks"] == ()


def test_the_mxfp4_arm_is_the_same_recipe_in_mxfp4_with_rceil():
  f, m = _fields(_arm("nvfp4_full")), _fields(_arm("mxfp4_full"))
  for k, op in m.items():
    if isinstance(op, recipes.OperandQuant):
      assert isinstance(op, recipes.MXQuant) and (op.fmt, op.scale_rule) == ("e2m1", "rceil")
      block = (32, 32) if f[k].block_shape == (16, 16) else 32
      assert op.block_shape == block
      assert op.rounding == f[k].rounding
    elif k == "wgrad.hadamard":
      assert op == 32
    else:
      assert op == f[k], k


def _dense_out(recipe, x, w):
  model = quantize_model(nn.Dense(w.shape[1], use_bias=False), [Rule(".*", recipe)])
  return np.asarray(model.apply({"params": {"kernel": jnp.asarray(w)}}, jnp.asarray(x)),
                    np.float64)


def _data(k, n, seed):
  rng = np.random.default_rng(seed)
  x = (rng.standard_t(3, size=(4, k)) * 3.0).astype(np.float32)
  w = (rng.standard_t(3, size=(k, n)) * 0.1).astype(np.float32)
  return x, w


def _close(got, want):
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.max(np.abs(want)))


@pytest.mark.parametrize("weight_2d", [True, False])
def test_nvfp4_forward_matches_the_numpy_te_reference(weight_2d):
  """A Dense under the no-SR, no-RHT NVFP4 recipe: x in 1x16 blocks along K, W in
  16x16 tiles (or 1D blocks along K), each with its tensor scale, by the NumPy
  transcription of Transformer Engine's chain (tests/numerics/mx_reference.py)."""
  config = nv.Nvfp4RecipeConfig(weight_2d=weight_2d, wgrad_rht=False, grad_sr=False)
  x, w = _data(64, 32, 0)
  xq = ref.quantize_nvfp4(x, axis=-1)[3]
  if weight_2d:  # one tile per row: blocks of 256 share the tensor amax of w
    rows = ref.quantize_nvfp4(ref.tiles_to_rows(w, 16, 16), block=256)[3]
    wq = ref.rows_to_tiles(rows, *w.shape, 16, 16)
  else:
    wq = ref.quantize_nvfp4(w, axis=0)[3]
  want = xq.astype(np.float64) @ wq.astype(np.float64)
  _close(_dense_out(config.model_recipe(), x, w), want)
  other = ref.quantize_nvfp4(w, axis=0)[3] if weight_2d else \
      ref.rows_to_tiles(ref.quantize_nvfp4(ref.tiles_to_rows(w, 16, 16), block=256)[3],
                        *w.shape, 16, 16)
  assert not np.allclose(xq.astype(np.float64) @ other, want, rtol=1e-3)  # layouts differ


def test_mxfp4_forward_matches_the_numpy_ocp_reference():
  config = nv.Nvfp4RecipeConfig(fmt="mxfp4", wgrad_rht=False, grad_sr=False)
  x, w = _data(64, 64, 1)
  xq = ref.quantize_mx(x, "e2m1", "rceil", axis=-1)[2]
  rows = ref.quantize_mx(ref.tiles_to_rows(w, 32, 32), "e2m1", "rceil", block=1024)[2]
  wq = ref.rows_to_tiles(rows, *w.shape, 32, 32)
  want = xq.astype(np.float64) @ wq.astype(np.float64)
  _close(_dense_out(config.model_recipe(), x, w), want)


def test_the_bf16_last_blocks_rule_catches_exactly_those_blocks():
  """The model's recorded ops: block_1 (the last of 2) runs every op in bf16, block_0's
  projections run the recipe, and every required rule catches an op."""
  config = nv.Nvfp4RecipeConfig(**{k: v for k, v in _TINY.items()
                                   if k in ("d_model", "num_heads", "d_ff", "seq_len")})
  assert config.num_layers == 2 and config.bf16_last_blocks == 1
  recipe = config.model_recipe()
  parts = lm_trainer.build_lm(config, 11)
  with quantization.recording() as records:
    jax.eval_shape(lambda: parts.model.init(
        jax.random.PRNGKey(0), jnp.zeros((1, config.seq_len), jnp.int32),
        jax.random.PRNGKey(0)))
  by_path = {}
  for r in records:
    by_path.setdefault(r.path, set()).add(r.rule.recipe_name)
  for proj in ("qkv", "attn_out", "ff_in", "ff_out"):
    assert by_path[f"block_0/{proj}"] == {recipe.name}
    assert by_path[f"block_1/{proj}"] == {"bf16"}
  assert by_path["block_1"] == by_path["block_0"] == by_path["head"] == {"bf16"}
  used = [r.rule for r in records]  # build_lm's own Rule objects: compare by value
  kept = config.model_rules(recipe)[0]
  assert kept.module_path == "block_1(/.*)?" and kept in used
  assert all(rule in used or not rule.required for rule in config.model_rules(recipe))


@pytest.mark.parametrize("kwargs,message", [
    (dict(bf16_last_blocks=2), "--bf16_last_blocks=2 must be at most num_layers - 1"),
    (dict(num_layers=4, bf16_last_blocks=4), "--bf16_last_blocks=4 must be at most"),
    (dict(fmt="bf16"), "--fmt=bf16 is the unquantized baseline: turn off --weight_2d, "
     "--wgrad_rht, --grad_sr, --bf16_last_blocks"),
    (dict(fmt="bf16", weight_2d=False, wgrad_rht=False, bf16_last_blocks=0),
     "turn off --grad_sr "),
    (dict(recipe="mxfp4"), "--recipe=mxfp4 is not used by nvfp4_recipe"),
    (dict(fmt="fp8"), "fmt must be one of"),
])
def test_bad_configs_are_refused_in_one_line(kwargs, message):
  with pytest.raises(ValueError, match=message) as e:
    nv.Nvfp4RecipeConfig(**kwargs)
  assert "\n" not in str(e.value)


def test_the_sweep_declares_its_claims_on_fresh_seeds():
  from launch import registry  # pylint: disable=import-outside-toplevel
  sweep = registry.get("nvfp4_recipe")
  assert sweep.sequential is not None and sweep.sequential.cap == len(sweep.seeds) == 16
  assert not set(sweep.seeds) & set(sweep.calibration_seeds)
  for other in registry.names():
    if other != "nvfp4_recipe":
      assert not set(sweep.seeds) & set(registry.get(other).seeds), other
  assert {c.arm for c in sweep.claims if c.baseline == "nvfp4_full"} == {
      "no_2d", "no_rht", "no_sr", "no_bf16_last"}
  named = {a for c in sweep.claims for a in (c.arm, c.baseline)}
  assert named == {a.name for a in sweep.arms}  # a sequential sweep runs only these
  assert "PLACEHOLDER" not in sweep.description


def test_a_tiny_run_writes_its_results_row(tmp_path):
  """The full recipe (2D weights, wgrad RHT, SR, the last of two blocks in bf16) trains
  end to end: 2 steps (the cost is the train step's compilation)."""
  config = nv.Nvfp4RecipeConfig(**{**_TINY, "num_steps": 2, "eval_batches": 1})
  workdir = str(tmp_path / "run")
  nv.train_and_evaluate(config, RunOptions(workdir=workdir, run_name="tiny"))
  with open(os.path.join(workdir, "results.jsonl")) as f:
    row = json.loads(f.readline())
  assert np.isfinite(row["metrics"]["eval/loss"])
  assert row["config"]["fmt"] == "nvfp4" and row["config"]["bf16_last_blocks"] == 1
