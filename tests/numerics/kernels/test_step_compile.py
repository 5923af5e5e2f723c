"""The LM's whole training step compiles, without a device, for H200, B200, TPU v5e and
v6e under every built-in recipe, the kernels on; native FP8 GEMMs take f8 operands.

experiments/benchmarks/step_compile.py compiles (one child process per test, the compile
toolchain of the ``toolchain`` fixture, conftest.py). Its own file, so that
pytest-xdist's ``--dist loadfile`` runs it beside test_compile.py. Sharded steps:
test_compile.py.
"""

import json
import subprocess
import sys
import textwrap

import pytest

from experiments.benchmarks import step_compile
from experiments.common.harness.repo_paths import REPO_DIR
from lowprec.numerics import recipes
from lowprec.numerics.kernels import compile_check

pytestmark = pytest.mark.compile

_GPU, _TPU = ("H200", "B200"), ("v5e", "v6e")
# Each recipe on its cheaper GPU and TPU target (CPU seconds of the ci-size compiles,
# measured 2026-12-07: nvfp4 16-27 s, fp8_delayed and mxfp4 6-12 s, the others 1-10 s),
# each target at least once.
_COVERING = {"fp32": ("H200", "v5e"), "bf16": ("H200", "v5e"), "fp8": ("H200", "v5e"),
             "fp8_delayed": ("H200", "v5e"), "mxfp8": ("B200", "v5e"),
             "mxfp4_1d2d": ("H200", "v5e"), "mxfp4_rht": ("B200", "v6e"),
             "mxfp4": ("H200", "v5e"), "nvfp4": ("H200", "v6e")}
_KERNEL_RECIPES = ("mxfp8", "mxfp4_1d2d", "mxfp4_rht", "mxfp4", "nvfp4")


def covering_set() -> list[step_compile.Case]:
  """Every built-in recipe on a GPU and a TPU target, and each recipe with a native
  GEMM (``recipes.with_native_gemm``) natively on H200 and B200."""
  cases = [step_compile.Case(r, t) for r, targets in _COVERING.items() for t in targets]
  return cases + [step_compile.Case(r, t, native=True)
                  for r in step_compile.native_recipes(recipes.names()) for t in _GPU]


def test_the_covering_set_covers_every_recipe_and_target():
  cases = covering_set()
  assert set(_COVERING) == set(recipes.names())
  for r in recipes.names():
    on = {c.target for c in cases if c.recipe == r and not c.native}
    assert on & set(_GPU) and on & set(_TPU), (r, on)
  assert {c.target for c in cases} == {t.name for t in compile_check.TARGETS}
  native = {c.recipe for c in cases if c.native}
  assert {"fp8", "fp8_delayed", "mxfp8", "nvfp4"} <= native


def _failures(results) -> str:
  return "\n".join(f"{r['recipe']}{' native' if r['native'] else ''} on {r['target']}: "
                   f"{r['error']}" for r in results if not r["ok"])


def test_the_covering_set_compiles_and_native_fp8_gemms_take_f8_operands(toolchain):
  """One child process, about 270 CPU seconds (4-5 minutes on a free core)."""
  results = step_compile.run_child(covering_set(), toolchain=toolchain, timeout_s=1800)
  assert len(results) == len(covering_set())
  assert all(r["ok"] for r in results), _failures(results)  # each with its compiler's reason
  for r in results:
    assert r["flops"] > 0 and r["bytes"] > 0, r
    if r["recipe"] in _KERNEL_RECIPES and not r["native"]:
      assert r["kernel_calls"] > 0, r  # the Pallas kernels are in the program
    if r["recipe"] in ("fp8", "fp8_delayed") and r["target"] in _GPU:
      # Native: the forward, dgrad and wgrad GEMMs of each of the 4 projections take
      # f8 operands; emulated: none does (quantize-dequantize, then a float32 GEMM).
      want = 12 if r["native"] else 0
      assert r["narrow_gemms"] == want, (r["recipe"], r["native"], r["gemms"])
      if r["native"]:
        assert {"f8e4m3fn x f8e4m3fn -> f32 dot", "f8e4m3fn x f8e5m2 -> f32 dot",
                "f8e5m2 x f8e4m3fn -> f32 dot"} <= set(r["gemms"]), r["gemms"]
    if r["recipe"] in ("mxfp8", "nvfp4") and r["native"]:
      # jax.nn.scaled_matmul: without a device XLA compiles its fallback (dequantize,
      # then cuBLASLt); cuDNN's block-scaled GEMM is chosen on a Blackwell device.
      assert any("__cublas$lt$matmul" in g or "__cudnn$blockScaledDot" in g
                 for g in r["gemms"]), r["gemms"]


_DOTS = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np
    from jax import lax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from lowprec.numerics.kernels import compile_check, hlo_program

    def f(x, y):
      return lax.dot_general(x, y, (((1,), (0,)), ((), ())),
                             preferred_element_type=jnp.float32)

    out = {}
    for target in compile_check.TARGETS[:2]:
      s = NamedSharding(Mesh(np.array([compile_check.target_device(target)]), ("x",)),
                        PartitionSpec())
      for dtype in (jnp.float8_e4m3fn, jnp.bfloat16):
        a = jax.ShapeDtypeStruct((64, 128), dtype, sharding=s)
        b = jax.ShapeDtypeStruct((128, 256), dtype, sharding=s)
        text = jax.jit(f).trace(a, b).lower().compile().as_text()
        out[f"{target.name} {jnp.dtype(dtype).name}"] = [
            [list(g.operand_types[:2]), g.narrow] for g in hlo_program.gemms(text)]
    print(json.dumps(out))
""")


def test_an_f8_dot_general_compiles_to_a_gemm_on_f8_operands(toolchain):
  """The check's premise on a single GEMM: f8 x f8 -> f32 keeps its f8 operands on H200
  and B200 (Hopper's and Blackwell's FP8 tensor cores), bf16 x bf16 holds none."""
  env = compile_check._child_env(toolchain)  # pylint: disable=protected-access
  proc = subprocess.run([sys.executable, "-c", _DOTS], env=env, cwd=REPO_DIR,
                        capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  for target in _GPU:
    assert out[f"{target} float8_e4m3fn"] == [[["f8e4m3fn", "f8e4m3fn"], True]], out
    assert out[f"{target} bfloat16"] == [[["bf16", "bf16"], False]], out


@pytest.mark.slow
def test_every_recipe_compiles_on_every_target(toolchain, request):
  """The full product: 9 recipes x 4 targets and the 4 native recipes on H200 and B200,
  44 compiles, about 11 minutes on 2 loaded cores."""
  if "slow" not in (request.config.getoption("markexpr") or ""):
    pytest.skip("44 whole-step compiles; run with: pytest -m 'compile and slow'")
  cases = step_compile.product(recipes.names(), step_compile.SINGLE, (), native=True)
  results = step_compile.run_child(cases, toolchain=toolchain, timeout_s=3600)
  assert all(r["ok"] for r in results), _failures(results)
  for r in results:
    assert r["flops"] > 0 and r["bytes"] > 0, r
    if r["recipe"] in ("fp8", "fp8_delayed") and r["target"] in _GPU:
      assert r["narrow_gemms"] == (12 if r["native"] else 0), r["gemms"]
