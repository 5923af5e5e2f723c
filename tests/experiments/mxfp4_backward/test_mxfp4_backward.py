"""experiments.mxfp4_backward: each arm's backward GEMMs against the NumPy MX
reference, the arms' recipes, the config's one-line refusals and a tiny run."""

import json
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.common.harness.run_options import RunOptions
from experiments.mxfp4_backward import experiment as mb
from experiments.mxfp4_backward import sweeps
from lowprec.numerics import qdot
from lowprec.numerics.rounding import Nearest, Stochastic
from tests.numerics import hadamard_reference
from tests.numerics import mx_reference as ref

DN = (((1,), (0,)), ((), ()))
_TINY = dict(num_steps=3, warmup_steps=1, d_model=32, num_heads=2, d_ff=64, seq_len=32,
             batch_size=4, eval_batches=2, max_chars=60_000, checkpoint_every=0,
             histogram_every=0)


def _bf16_mm(a, b):
  """The GEMM of exactly representable operands: bf16 in, float32 accumulation."""
  return np.asarray(jnp.dot(jnp.asarray(a, jnp.bfloat16), jnp.asarray(b, jnp.bfloat16),
                            preferred_element_type=jnp.float32,
                            precision=jax.lax.Precision.HIGHEST))


def _grads(config, x, w, g, key=None):
  recipe = config.model_recipe()
  f = lambda x, w: qdot.quantized_dot_general(x, w, DN, recipe, key=key,
                                              preferred_element_type=jnp.float32)
  out, vjp = jax.vjp(f, jnp.asarray(x), jnp.asarray(w))
  return (np.asarray(out),) + tuple(np.asarray(t) for t in vjp(jnp.asarray(g)))


@pytest.mark.parametrize("hadamard,wgrad", [("none", True), ("deterministic", True),
                                            ("none", False)])
def test_backward_gemms_are_the_numpy_mx_reference(hadamard, wgrad):
  """Forward bf16; dgrad = q(dO) q(W)^T with both quantized along N, wgrad = q(X)^T q(dO)
  along tokens (OCP floor MXFP4, round to nearest), behind the fixed Sylvester transform
  when asked (H_16 / 4 on integers is exact in float32); wgrad unquantized when off."""
  config = mb.Mxfp4BackwardConfig(backward="mxfp4", hadamard=hadamard, hadamard_size=16,
                                  quantize_wgrad=wgrad)
  rng = np.random.default_rng(1)
  x, w, g = (rng.integers(-8, 9, size=s).astype(np.float32)
             for s in ((64, 64), (64, 96), (64, 96)))
  out, dx, dw = _grads(config, x, w, g)
  np.testing.assert_array_equal(out, _bf16_mm(x, w))
  def t(a, axis):
    if hadamard == "none":
      return a
    return hadamard_reference.sylvester_blocks(a, axis, 16)

  q = lambda a, axis: ref.quantize_mx(t(a, axis), "e2m1", "floor", axis=axis)[2]
  np.testing.assert_array_equal(dx, _bf16_mm(q(g, 1), q(w, 1).T))
  want_dw = _bf16_mm(q(x, 0).T, q(g, 0)) if wgrad else _bf16_mm(x.T, g)
  np.testing.assert_array_equal(dw, want_dw)
  assert not np.array_equal(dx, _bf16_mm(g, w.T))  # the backward is quantized


def test_every_arm_builds_the_recipe_it_names():
  recipes = {arm.name: mb.Mxfp4BackwardConfig(**{**vars_of(sweeps.BASE),
                                                 **arm.overrides}).model_recipe()
             for arm in sweeps.ARMS}
  assert recipes["bf16"] == "bf16"
  for name, r in recipes.items():
    if name == "bf16":
      continue
    assert r.forward.lhs is None and r.forward.rhs is None  # forward bf16
    d = r.dgrad
    assert d.lhs == d.rhs and d.lhs.fmt == "e2m1" and d.lhs.scale_rule == "floor"
    sr = "sr" in name.split("_")
    assert d.lhs.rounding == (Stochastic() if sr else Nearest())
    assert d.lhs.prescale == (0.75 if sr else 1.0)
    assert d.hadamard == (32 if name.startswith(("rht", "dh")) else None)
    assert d.hadamard_random == (not name.startswith("dh"))
    assert r.wgrad == (d if name != "rtn_dgrad_only" else type(d)())
    assert r.needs_key == (sr or name.startswith("rht"))


def vars_of(config):
  return {f: getattr(config, f) for f in config.__dataclass_fields__}


@pytest.mark.parametrize("overrides,message", [
    (dict(recipe="mxfp8"), "--recipe=mxfp8 is not used here"),
    (dict(backward="bf16", stochastic_rounding=True), "--backward=bf16 quantizes nothing"),
    (dict(backward="bf16", quantize_wgrad=False), "--backward=bf16 quantizes nothing"),
    (dict(hadamard="random", hadamard_size=24), "--hadamard_size=24 must be a power"),
])
def test_bad_configs_are_refused_in_one_line(overrides, message):
  with pytest.raises(ValueError, match=message):
    mb.Mxfp4BackwardConfig(**overrides)


def test_a_tiny_run_writes_its_row(tmp_path):
  config = mb.Mxfp4BackwardConfig(**_TINY, backward="mxfp4", stochastic_rounding=True,
                                  hadamard="random")
  workdir = str(tmp_path / "run")
  mb.train_and_evaluate(config, RunOptions(workdir=workdir, run_name="run"))
  row = json.loads(open(os.path.join(workdir, "results.jsonl")).readline())
  assert row["completed"] and np.isfinite(row["metrics"]["eval/loss"])
  assert row["config"]["hadamard"] == "random"


def test_the_report_decides_by_the_plan_and_the_appendix_computes_the_interaction(
    tmp_path):
  """Synthetic results through the sequential runner and the report: the appendix's
  interaction is ``(rht_sr - sr) - (rht - rtn)`` per seed, its mean and t-interval
  computed here by hand; the report rebuilds byte for byte from a copy."""
  import math  # pylint: disable=import-outside-toplevel
  import shutil  # pylint: disable=import-outside-toplevel
  from scipy import stats  # pylint: disable=import-outside-toplevel
  from launch import registry, sequential_runner  # pylint: disable=import-outside-toplevel
  from launch.manifest import expand, write_manifest  # pylint: disable=import-outside-toplevel
  from launch.report import build_report  # pylint: disable=import-outside-toplevel

  sweep = registry.get("mxfp4_backward")
  sweep_dir = str(tmp_path / "report")
  write_manifest(sweep, [], sweep_dir)
  gap = {"bf16": 0.0, "rtn": 0.05, "sr": 0.045, "rht": 0.012, "rht_sr": 0.004,
         "dh": 0.01, "dh_sr": 0.0105, "rtn_dgrad_only": 0.01}
  loss = lambda arm, seed: 1.85 + gap[arm] + 0.003 * math.sin(seed * (1 + len(arm)))
  seen: dict[str, dict[int, float]] = {}

  def run_batch(scheduled):
    with open(os.path.join(sweep_dir, "results.jsonl"), "a") as f:
      for r in scheduled:
        seen.setdefault(r.arm, {})[r.seed] = loss(r.arm, r.seed)
        f.write(json.dumps({"run_name": r.run_name, "completed": True, "metrics": {
            **{m: 0.0 for m in sweep.metrics}, "eval/loss": loss(r.arm, r.seed)}})
                + "\n")

  result = sequential_runner.run_sequential(
      sweep, sweep_dir, expand(sweep, sweep_dir), run_batch,
      lambda s: write_manifest(sweep, s, sweep_dir), say=lambda _: None)
  assert result.done
  text = open(build_report(sweep_dir)).read()
  assert "## Rounding x Hadamard" in text
  seeds = sorted(set.intersection(*(set(seen[a]) for a in ("rht_sr", "sr", "rht", "rtn"))))
  d = np.array([(seen["rht_sr"][s] - seen["sr"][s]) - (seen["rht"][s] - seen["rtn"][s])
                for s in seeds])
  half = stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
  want = (f"{d.mean():+.4f} [{d.mean() - half:+.4f}, {d.mean() + half:+.4f}] "
          f"(n = {d.size})")
  assert want in text, want
  copy = tmp_path / "copy"
  shutil.copytree(sweep_dir, copy)
  assert open(build_report(str(copy))).read() == text
