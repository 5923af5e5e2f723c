"""Device check of the Pallas kernels: correctness compiled, throughput, training step.

    # on one GPU/TPU, designed for ~8 min:
    python -m experiments.benchmarks.kernel_check --out=device_check.json
    # a CPU smoke run in interpret mode (CI: tests/experiments/test_scripts.py runs it
    # with one kernel test, --kernels=<one> and --recipes=mxfp8):
    python -m experiments.benchmarks.kernel_check --interpret --out=/tmp/smoke.json

One command, one JSON file, in three stages (each skipped, and recorded as skipped,
once ``--time_budget_s`` is spent):

1. ``correctness``: tests/numerics/kernels/test_kernels.py with
   NUMERICS_KERNEL_COMPILED=1 -- every kernel compiled on the device against the
   independent NumPy references (bit for bit; the matmul bit for bit on exactly
   summable operands, within float32 accumulation error otherwise). Per-test outcomes;
   ``--tests`` (a pytest ``-k`` expression) picks a subset. The script exits 1 when this
   stage fails, times out or runs no test.
2. ``bandwidth`` and ``kernels``: the device's copy bandwidth (``x + 1`` on float32,
   read + write), then each quantize kernel and its jnp (XLA) path: milliseconds, the
   bytes it must move, and that rate as a fraction of the copy bandwidth; ``matmul``:
   the block-scaled matmul in TFLOP/s against a bf16 ``jnp.dot`` of the same shape.
   On a device that :mod:`numerics.kernels.compile_check` has a target for (H200,
   B200, TPU v5e, v6e), each figure is printed beside its roofline estimate (bytes
   over the vendor's HBM bandwidth; the matmul's FLOPs over its bf16 peak), the same
   estimate the README's compile table gives.
3. ``train_step``: one jitted training step (forward, backward, AdamW) of the
   quick-start LM (experiments.lm's defaults: d_model 128, 2 layers, 4 heads, d_ff
   512, seq 128, batch 32; synthetic tokens, vocabulary 65) per recipe, with the
   kernels dispatched as on a user's machine, as a ratio to bf16; ``mxfp8 (jnp)`` is
   mxfp8 traced with ``kernels.implementation("jnp")``, and ``pallas_calls`` counts the kernels in the step.
   ``<recipe> native`` is ``recipes.with_native_gemm(recipe)`` (each recipe with a
   native GEMM: f8 x f8 or block-scaled GEMMs on a CUDA device, the emulated GEMM
   elsewhere). Then ``native_vs_emulated``: ``--loss_steps`` training steps of each
   such recipe from one initialization and one batch sequence, emulated and native: the
   per-step losses and their largest and final differences (0 where the native GEMM is
   the emulated one, e.g. on the CPU or a TPU).

Timings: each call is dispatched ``--iters`` times back to back and the mean taken (so
Python dispatch overlaps device work), the best of ``--repeats``; compare ratios.
Targets on an H200 (benchmarks, not tests): quantize kernels >= 0.8 of copy
bandwidth; the mxfp8 training step <= 1.2x bf16.

It lives in experiments/ (not numerics/kernels/) because it builds the LM from
models/ and experiments/common/, and imports only go downwards.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable
import xml.etree.ElementTree as ElementTree

# The pytest subprocess and this process share the accelerator: allocate on demand.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=wrong-import-position
import jax  # pylint: disable=wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position
import optax  # pylint: disable=wrong-import-position

from lowprec import numerics  # pylint: disable=wrong-import-position
from lowprec.numerics import kernels  # pylint: disable=wrong-import-position
from lowprec.numerics import recipes as recipes_lib  # pylint: disable=wrong-import-position
from lowprec.numerics.kernels import compile_check  # pylint: disable=wrong-import-position
from experiments.benchmarks.qtrain_step import lm_train_step  # pylint: disable=wrong-import-position
from experiments.common.harness import repo_paths  # pylint: disable=wrong-import-position
from experiments.common.harness import run_metadata  # pylint: disable=wrong-import-position
from experiments.common.harness.config_flags import parse_flags  # pylint: disable=wrong-import-position
from experiments.common.trainers import recipe_flag  # pylint: disable=wrong-import-position
from lowprec.models import transformer  # pylint: disable=wrong-import-position
from lowprec.numerics.rounding import Stochastic

_ROOT = pathlib.Path(repo_paths.REPO_DIR)
_KERNEL_TESTS = "tests/numerics/kernels/test_kernels.py"


class _Clock:
  def __init__(self, budget_s: float):
    self.t0 = time.perf_counter()
    self.budget_s = budget_s

  def elapsed(self) -> float:
    return time.perf_counter() - self.t0

  def left(self) -> float:
    return self.budget_s - self.elapsed()


def time_call(fn, *args, iters: int, repeats: int) -> float:
  """Seconds per call: ``iters`` calls dispatched back to back, best of ``repeats``."""
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = None
    for _ in range(iters):
      out = fn(*args)
    jax.block_until_ready(out)
    best = min(best, (time.perf_counter() - t0) / iters)
  return best


# ----------------------------------------------------------------------------- stage 1


def run_correctness(interpret: bool, timeout_s: float, selection: str = "") -> dict:
  """Runs the kernel tests (compiled unless ``interpret``; those the pytest ``-k``
  expression ``selection`` picks, all if empty) and returns their outcomes."""
  env = dict(os.environ)
  if not interpret:
    env["NUMERICS_KERNEL_COMPILED"] = "1"
  with tempfile.TemporaryDirectory() as tmp:
    xml = os.path.join(tmp, "junit.xml")
    cmd = [sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider",
           f"--junitxml={xml}", str(_ROOT / _KERNEL_TESTS)]
    if selection:
      cmd += ["-k", selection]
    t0 = time.perf_counter()
    try:
      proc = subprocess.run(cmd, env=env, cwd=_ROOT, capture_output=True, text=True,
                            timeout=timeout_s)
    except subprocess.TimeoutExpired:
      return {"exit_code": None, "error": f"timed out after {timeout_s:.0f} s"}
    result = {"exit_code": proc.returncode, "seconds": time.perf_counter() - t0,
              "compiled": not interpret, "selection": selection, "tests": {}}
    if os.path.exists(xml):
      for case in ElementTree.parse(xml).getroot().iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
          node = case.find(tag)
          if node is not None:
            outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
            if tag != "skipped":
              result.setdefault("failures", {})[case.get("name")] = (
                  node.get("message") or "")[:500]
        result["tests"][case.get("name")] = outcome
    counts = {}
    for outcome in result["tests"].values():
      counts[outcome] = counts.get(outcome, 0) + 1
    result["counts"] = counts
    result["output_tail"] = proc.stdout[-2000:]
    return result


def correctness_failure(result: dict) -> str | None:
  """Why the correctness stage proves nothing or found a fault (None if it passed):
  a timeout, a pytest failure, or no test run (pytest's exit 4, a wrong path)."""
  if result.get("exit_code") is None:
    return result.get("error", "no exit code")
  counts = result.get("counts", {})
  if result["exit_code"] != 0 or counts.get("failed") or counts.get("error"):
    return f"pytest exit {result['exit_code']}, {counts}"
  if not counts.get("passed"):
    return f"no kernel test passed ({counts})"
  return None


# ----------------------------------------------------------------------------- stage 2


_DEVICE_TARGETS = {"NVIDIA H200": "H200", "NVIDIA B200": "B200", "TPU v5 lite": "v5e",
                   "TPU v5e": "v5e", "TPU v6 lite": "v6e", "TPU v6e": "v6e"}


def device_target(device_kind: str) -> compile_check.Target | None:
  """The compile check's target of a device kind (None for other devices)."""
  for prefix, name in _DEVICE_TARGETS.items():
    if device_kind.startswith(prefix):
      return next(t for t in compile_check.TARGETS if t.name == name)
  return None


def _rate(seconds: float, nbytes: int, copy_bw: float,
          target: compile_check.Target | None) -> dict:
  rec = {"ms": seconds * 1e3, "bytes": nbytes, "gb_per_s": nbytes / seconds / 1e9,
         "fraction_of_copy": nbytes / seconds / copy_bw}
  if target is not None:  # the roofline estimate: the bytes at the vendor's bandwidth
    rec["estimate_ms"] = nbytes / target.hbm_bytes_per_s * 1e3
    rec["measured_over_estimate"] = rec["ms"] / rec["estimate_ms"]
  return rec


def _vs_estimate(rec: dict) -> str:
  if "estimate_ms" not in rec:
    return ""
  return (f" ({rec['ms']:.3f} ms measured, roofline estimate {rec['estimate_ms']:.3f} ms: "
          f"{rec['measured_over_estimate']:.2f}x)")


def bandwidth_cases(n: int) -> dict[str, tuple[Callable[..., Any], int]]:
  """``name -> (fn(x, key, mode), HBM bytes it moves)`` of the kernels timed against a
  copy, for an operand of ``n`` float32 elements."""
  codes_out = n + n // 32  # uint8 codes + E8M0 scales
  return {
      "mx_quantize e4m3 nearest": (
          lambda x, k, m: kernels.mx_quantize(x, "e4m3", **m).codes, 4 * n + codes_out),
      "mx_quantize e4m3 stochastic": (
          lambda x, k, m: kernels.mx_quantize(x, "e4m3", rounding=Stochastic(), key=k,
                                              **m).codes, 4 * n + codes_out),
      "mx_quantize e2m1 stochastic": (
          lambda x, k, m: kernels.mx_quantize(x, "e2m1", scale_rule="alto",
                                              rounding=Stochastic(), key=k, **m).codes,
          4 * n + codes_out),
      # NVFP4's tensor amax is a separate reduction pass: x is read twice.
      "nvfp4_quantize stochastic": (
          lambda x, k, m: kernels.nvfp4_quantize(x, rounding=Stochastic(), key=k,
                                                 **m).codes, 8 * n + n + n // 16),
      "mx_quantize_dequantize e4m3 axis -1": (
          lambda x, k, m: kernels.mx_quantize_dequantize(x, "e4m3", scale_rule="rceil",
                                                         **m), 8 * n),
      "mx_quantize_dequantize e4m3 axis -2": (
          lambda x, k, m: kernels.mx_quantize_dequantize(x, "e4m3", axis=-2,
                                                         scale_rule="rceil", **m), 8 * n),
      "mx_quantize_dequantize e2m1 stochastic axis -2": (
          lambda x, k, m: kernels.mx_quantize_dequantize(
              x, "e2m1", axis=-2, scale_rule="alto", rounding=Stochastic(), key=k, **m),
          8 * n),
      "nvfp4_quantize_dequantize stochastic axis -1": (
          lambda x, k, m: kernels.nvfp4_quantize_dequantize(x, rounding=Stochastic(),
                                                            key=k, **m), 12 * n),
      # qdot's NVFP4 operand quantizer: the values before the tensor scale.
      "nvfp4_quantize_dequantize_blocks stochastic axis -2": (
          lambda x, k, m: kernels.nvfp4_quantize_dequantize_blocks(
              x, axis=-2, rounding=Stochastic(), key=k, **m)[0], 12 * n),
  }


def _time_kernels(x, key, on: dict, off: dict, copy_bw: float, target, iters: int,
                  repeats: int) -> dict:
  """Each selected kernel (``--kernels``; all when empty) and its jnp path, as
  fractions of the copy's bandwidth."""
  cases = bandwidth_cases(x.size)
  records = {}
  for name, (fn, nbytes) in cases.items():
    if flags.FLAGS.kernels and name not in flags.FLAGS.kernels:
      continue
    rec = {}
    for label, mode in (("kernel", on), ("jnp", off)):
      f = jax.jit(lambda x, k, fn=fn, mode=mode: fn(x, k, mode))
      rec[label] = _rate(time_call(f, x, key, iters=iters, repeats=repeats), nbytes,
                         copy_bw, target)
    records[name] = rec
    print(f"{name:48s} kernel {rec['kernel']['fraction_of_copy']:.2f} of copy, "
          f"jnp {rec['jnp']['fraction_of_copy']:.2f}{_vs_estimate(rec['kernel'])}",
          flush=True)

  return records


def _time_matmuls(key, on: dict, target, interpret: bool, iters: int, repeats: int
                  ) -> dict:
  """The MX matmul kernel (e4m3 and e2m1) against a bf16 ``jnp.dot``."""
  size = 128 if interpret else flags.FLAGS.mm
  ka, kb = jax.random.split(key)
  a = jax.random.normal(ka, (size, size), jnp.float32)
  b = jax.random.normal(kb, (size, size), jnp.float32)
  flops = 2 * size ** 3
  bf = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
  abf, bbf = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
  t_bf16 = time_call(bf, abf, bbf, iters=iters, repeats=repeats)
  matmul = {"size": size, "bf16_jnp_dot": {"ms": t_bf16 * 1e3,
                                           "tflop_per_s": flops / t_bf16 / 1e12}}
  for fa, fb in (("e4m3", "e4m3"), ("e2m1", "e2m1")):
    qa = numerics.quantize_mx(a, fa)
    qb = numerics.quantize_mx(b, fb, axis=0)
    f = jax.jit(lambda qa, qb: kernels.mx_matmul(qa, qb, **on))
    t = time_call(f, qa, qb, iters=iters, repeats=repeats)
    rec = {"ms": t * 1e3, "tflop_per_s": flops / t / 1e12, "time_vs_bf16": t / t_bf16}
    if target is not None:  # the FLOPs at the vendor's bf16 peak
      rec["estimate_ms"] = flops / target.bf16_flops_per_s * 1e3
      rec["measured_over_estimate"] = rec["ms"] / rec["estimate_ms"]
    matmul[f"mx_matmul {fa} x {fb}"] = rec
    print(f"mx_matmul {fa} x {fb} {size}^3: {flops / t / 1e12:.1f} TFLOP/s "
          f"(bf16 jnp.dot {flops / t_bf16 / 1e12:.1f}){_vs_estimate(rec)}", flush=True)
  return matmul


def run_bandwidth(interpret: bool, iters: int, repeats: int) -> tuple[dict, dict, dict]:
  """(bandwidth, kernels, matmul) records."""
  rows, cols = (256, 512) if interpret else (flags.FLAGS.rows, flags.FLAGS.cols)
  n = rows * cols
  target = None if interpret else device_target(jax.devices()[0].device_kind)
  x = jax.random.normal(jax.random.key(0), (rows, cols), jnp.float32)
  key = jax.random.key(1)
  t = time_call(jax.jit(lambda x: x + 1.0), x, iters=iters, repeats=repeats)
  copy_bw = 8 * n / t
  bandwidth = {"shape": [rows, cols], "copy_ms": t * 1e3, "copy_gb_per_s": copy_bw / 1e9,
               "bytes": 8 * n}
  on = dict(interpret=True) if interpret else dict(use_kernel=True)
  off = dict(use_kernel=False)
  records = _time_kernels(x, key, on, off, copy_bw, target, iters, repeats)
  matmul = _time_matmuls(key, on, target, interpret, iters, repeats)
  return bandwidth, records, matmul


# ----------------------------------------------------------------------------- stage 3


def count_primitive(jaxpr, name: str) -> int:
  """Equations of primitive ``name`` in ``jaxpr`` and every sub-jaxpr (jit, custom_vjp,
  cond branches: a platform_dependent switch counts each platform's kernel)."""
  def subs(value):
    if hasattr(value, "jaxpr") and hasattr(value, "consts"):  # ClosedJaxpr
      yield value.jaxpr
    elif hasattr(value, "eqns"):  # Jaxpr
      yield value
    elif isinstance(value, (tuple, list)):
      for v in value:
        yield from subs(v)

  n = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == name:
      n += 1
      continue
    for value in eqn.params.values():
      for sub in subs(value):
        n += count_primitive(sub, name)
  return n


def _lm_config(interpret: bool) -> dict:
  if interpret:
    return dict(d_model=32, num_layers=1, num_heads=2, d_ff=64, seq_len=32, batch=2)
  return dict(d_model=128, num_layers=2, num_heads=4, d_ff=512, seq_len=128, batch=32)


_VOCAB = 65


def _lm_step(recipe: str | recipes_lib.Recipe, cfg: dict):
  """(jittable train step, its initial (params, opt_state), a token batch) of the LM."""
  model = recipe_flag.quantized_model(transformer.DecoderLM(
      transformer.TransformerConfig(vocab_size=_VOCAB, d_model=cfg["d_model"],
                                    num_layers=cfg["num_layers"],
                                    num_heads=cfg["num_heads"], d_ff=cfg["d_ff"],
                                    max_len=cfg["seq_len"])), recipe)
  tokens = jax.random.randint(jax.random.key(0), (cfg["batch"], cfg["seq_len"] + 1), 0,
                              _VOCAB)
  # Jitted: an eager init dispatches (and compiles) the forward op by op.
  params = jax.jit(model.init)(jax.random.key(1), tokens[:, :-1], jax.random.key(2))
  opt = optax.adamw(1e-3)
  return lm_train_step(model, opt), (params, opt.init(params["params"])), tokens


def native_arms(recipes: list[str]) -> list[str]:
  """The recipes among ``recipes`` that have a native GEMM (``with_native_gemm``)."""
  return [r for r in recipes if recipes_lib.has_native_gemm(r)]


def train_step_time(recipe: str | recipes_lib.Recipe, impl: str, cfg: dict, iters: int,
                    repeats: int) -> dict:
  """Seconds per jitted LM train step under ``recipe``, its kernels traced as ``impl``."""
  with kernels.implementation(impl):
    step, state, tokens = _lm_step(recipe, cfg)
    key = jax.random.key(3)
    pallas_calls = count_primitive(jax.make_jaxpr(step)(state, tokens, key).jaxpr,
                                   "pallas_call")
    jitted = jax.jit(step)
    t0 = time.perf_counter()
    jax.block_until_ready(jitted(state, tokens, key))
    compile_s = time.perf_counter() - t0
    seconds = time_call(jitted, state, tokens, key, iters=iters, repeats=repeats)
  return {"ms": seconds * 1e3, "compile_s": compile_s, "pallas_calls": pallas_calls,
          "kernels": impl}


def losses_over_steps(recipe: str | recipes_lib.Recipe, impl: str, cfg: dict,
                      steps: int) -> list[float]:
  """The LM's training loss at each of ``steps`` steps under ``recipe`` (one init, one
  key sequence, a fresh token batch per step: the same for every recipe)."""
  with kernels.implementation(impl):
    step, state, _ = _lm_step(recipe, cfg)
    jitted = jax.jit(step)
    losses = []
    for i in range(steps):
      tokens = jax.random.randint(jax.random.key(100 + i),
                                  (cfg["batch"], cfg["seq_len"] + 1), 0, _VOCAB)
      state, loss = jitted(state, tokens, jax.random.key(1000 + i))
      losses.append(float(loss))
  return losses


def run_native_vs_emulated(recipes: list[str], impl: str, cfg: dict, steps: int,
                           clock: _Clock) -> dict:
  """Per recipe with a native GEMM: ``steps`` losses emulated and native, and their
  largest and final absolute differences."""
  out = {"steps": steps, "recipes": {}, "skipped": []}
  for r in native_arms(recipes):
    if clock.left() <= 0:
      out["skipped"].append(r)
      continue
    emulated = losses_over_steps(r, impl, cfg, steps)
    native = losses_over_steps(recipes_lib.with_native_gemm(r), impl, cfg, steps)
    diffs = [abs(a - b) for a, b in zip(emulated, native)]
    out["recipes"][r] = {"emulated": emulated, "native": native,
                         "max_abs_diff": max(diffs), "final_abs_diff": diffs[-1]}
    print(f"native vs emulated {r:8s} final loss {emulated[-1]:.5f} vs {native[-1]:.5f} "
          f"(max |diff| over {steps} steps {max(diffs):.2e})", flush=True)
  return out


def run_train(interpret: bool, recipes: list[str], clock: _Clock, iters: int,
              repeats: int) -> dict:
  cfg = _lm_config(interpret)
  impl = "interpret" if interpret else "auto"
  arms = [("bf16", "bf16", "auto")]
  arms += [(r, r, impl) for r in recipes if r != "bf16"]
  if "mxfp8" in recipes:
    arms.append(("mxfp8 (jnp)", "mxfp8", "jnp"))
  arms += [(f"{r} native", recipes_lib.with_native_gemm(r), impl)
           for r in native_arms(recipes)]
  out = {"config": cfg, "vocab": _VOCAB, "recipes": {}, "skipped": []}
  base = None
  for label, recipe, impl in arms:
    if clock.left() <= 0:
      out["skipped"].append(label)
      continue
    rec = train_step_time(recipe, impl, cfg, iters, repeats)
    base = base or rec["ms"]
    rec["vs_bf16"] = rec["ms"] / base
    out["recipes"][label] = rec
    print(f"train step {label:14s} {rec['ms']:8.2f} ms  {rec['vs_bf16']:.2f}x bf16  "
          f"({rec['pallas_calls']} pallas_calls, compile {rec['compile_s']:.1f} s)",
          flush=True)
  return out


def _loss_steps(interpret: bool) -> int:
  return 3 if interpret else flags.FLAGS.loss_steps


def define_flags() -> None:
  """Defines this script's flags; called only when it runs as a script, so that
  importing the module (a test, another script) defines no flag names."""
  flags.DEFINE_string("out", "device_check.json", "where to write the JSON")
  flags.DEFINE_bool("interpret", False,
                    "CPU smoke run: interpret mode, tiny shapes")
  flags.DEFINE_bool("skip_tests", False, "skip the correctness stage")
  flags.DEFINE_bool("skip_bench", False, "skip the throughput stage")
  flags.DEFINE_bool("skip_train", False, "skip the training-step stage")
  flags.DEFINE_integer("rows", 8192, "rows of the quantized array")
  flags.DEFINE_integer("cols", 8192, "columns of the quantized array")
  flags.DEFINE_integer("mm", 4096, "M = N = K of the timed matmul")
  # fp32 is no kernel recipe. fp8_delayed (whose amax histories lm_train_step now
  # carries) is left out of the default to keep the stage inside the time budget.
  flags.DEFINE_list("recipes", [r for r in recipes_lib.names()
                                if r not in ("fp32", "fp8_delayed")],
                    "recipes of the training-step stage (bf16 is always added)")
  flags.DEFINE_list("kernels", [], "quantize kernels to time (default: all)")
  flags.DEFINE_integer("iters", 20, "calls per timing")
  flags.DEFINE_integer("repeats", 5, "timings per measurement (best kept)")
  flags.DEFINE_float("time_budget_s", 450.0,
                     "skip remaining stages after this many seconds")
  flags.DEFINE_float("test_timeout_s", 240.0, "correctness stage timeout")
  flags.DEFINE_integer("loss_steps", 50, "training steps of the native-vs-emulated "
                       "loss comparison (the CPU smoke run takes 3)")
  flags.DEFINE_string("tests", "", "pytest -k expression: the correctness stage's "
                      f"tests of {_KERNEL_TESTS} (default: all)")


def main(argv):
  del argv
  if flags.FLAGS.loss_steps < 1:
    print(f"error: --loss_steps must be >= 1, got {flags.FLAGS.loss_steps}",
          file=sys.stderr)
    return 2
  unknown = sorted(set(flags.FLAGS.kernels) - set(bandwidth_cases(1)))
  if unknown:  # before the correctness stage spends minutes
    print(f"error: unknown --kernels {unknown}; known: {sorted(bandwidth_cases(1))}",
          file=sys.stderr)
    return 2
  interpret = flags.FLAGS.interpret
  clock = _Clock(flags.FLAGS.time_budget_s)
  iters, repeats = (2, 1) if interpret else (flags.FLAGS.iters, flags.FLAGS.repeats)
  report = {"argv": sys.argv, "git": run_metadata.git_state(), "jax": jax.__version__,
            "interpret": interpret, "skipped": []}
  if flags.FLAGS.skip_tests:
    report["skipped"].append("correctness")
  else:  # before this process touches the accelerator
    report["correctness"] = run_correctness(
        interpret, min(flags.FLAGS.test_timeout_s, max(clock.left(), 1.0)),
        flags.FLAGS.tests)
    print(f"correctness: {report['correctness'].get('counts')} "
          f"(exit {report['correctness'].get('exit_code')})", flush=True)
  dev = jax.devices()[0]
  report["device"] = {"kind": dev.device_kind, "platform": dev.platform,
                      "backend": jax.default_backend(), "count": jax.device_count()}
  print(f"device: {dev.device_kind} ({jax.default_backend()}), interpret={interpret}",
        flush=True)
  if not interpret and jax.default_backend() not in ("gpu", "tpu"):
    print("no accelerator: run with --interpret for a CPU smoke run")
    return 1
  if flags.FLAGS.skip_bench or clock.left() <= 0:
    report["skipped"].append("throughput")
  else:
    report["bandwidth"], report["kernels"], report["matmul"] = run_bandwidth(
        interpret, iters, repeats)
  if flags.FLAGS.skip_train or clock.left() <= 0:
    report["skipped"].append("train_step")
  else:
    report["train_step"] = run_train(interpret, list(flags.FLAGS.recipes), clock, iters,
                                      repeats)
  if flags.FLAGS.skip_train or clock.left() <= 0:
    report["skipped"].append("native_vs_emulated")
  else:
    report["native_vs_emulated"] = run_native_vs_emulated(
        list(flags.FLAGS.recipes), "interpret" if interpret else "auto",
        _lm_config(interpret), _loss_steps(interpret), clock)
  report["elapsed_s"] = clock.elapsed()
  with open(flags.FLAGS.out, "w") as f:
    json.dump(report, f, indent=2, sort_keys=True)
  print(f"wrote {flags.FLAGS.out} ({report['elapsed_s']:.0f} s)")
  failure = ("correctness" in report) and correctness_failure(report["correctness"])
  if failure:
    print(f"correctness stage failed: {failure}")
    return 1
  return 0


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=parse_flags)
