"""Smoke tests of the demo and benchmark scripts: they run and print what they claim."""

import json
import subprocess
import sys

import pytest


def _run(*args):
  out = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                       timeout=300, check=True)
  return out.stdout


def test_demo_formats_prints_every_format():
  out = _run("experiments.demo_formats", "--rows=32", "--cols=64")
  for name in ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "int8", "bf16", "fp16", "nvfp4"):
    assert f"\n{name} " in out
  assert "MX 32x32 floor" in out


@pytest.mark.parametrize("script,args", [
    ("experiments.benchmarks.numerics_throughput", ["--size=65536", "--repeats=1"]),
    ("experiments.benchmarks.quantizer_cpu", ["--size=65536", "--rounds=1", "--calls=1"]),
    ("experiments.benchmarks.qtrain_step", ["--d_model=32", "--layers=1", "--batch=2", "--seq=32",
                                  "--repeats=1", "--recipes=bf16,mxfp8"]),
    ("experiments.benchmarks.library_speed", ["--width=64", "--layers=1", "--batch=16",
                                              "--size=65536", "--repeats=1",
                                              "--recipes=bf16,nvfp4",
                                              "--parts=step,telemetry,operands,quantize"]),
])
def test_benchmarks_run_small(script, args):
  out = _run(script, *args)
  assert out.strip()


def test_small_models_benchmark_smoke(tmp_path):
  """The small-model benchmark at tiny sizes: one compile and one step per arm, every
  arm's ratio to bf16 in the JSON."""
  out = tmp_path / "small.json"
  _run("experiments.benchmarks.small_models", "--models=vit", "--tokens=16",
       "--widths=32", "--depth=1", "--heads=1", "--batch=2", "--repeats=1",
       "--compile_rounds=1", "--recipes=bf16,mxfp8", "--qwix=", f"--json={out}")
  rows = json.loads(out.read_text())
  assert [r["arm"] for r in rows] == ["bf16", "mxfp8"]
  assert rows[0]["step_ratio_median"] == 1.0 and rows[0]["compile_ratio"] == 1.0
  assert all(r["step_ms_median"] > 0 and r["compile_s"] > 0 for r in rows)


def test_program_size_counts_the_compiled_step():
  """bf16's step has no threefry loop; mxfp4's (RHT and per-GEMM keys) has loops and
  a larger program."""
  out = _run("experiments.benchmarks.program_size", "--models=vit", "--tokens=16",
             "--width=32", "--recipes=bf16,mxfp4")
  rows = {line.split()[1]: line.split() for line in out.splitlines()[1:]}
  instructions = {r: int(rows[r][2].replace(",", "")) for r in ("bf16", "mxfp4")}
  assert rows["bf16"][4] == "0" and int(rows["mxfp4"][4]) > 0
  assert instructions["mxfp4"] > instructions["bf16"] > 0


def test_kernel_check_smoke_runs_every_stage(tmp_path):
  """The device check's CPU smoke run at its smallest settings: every stage runs and
  records what it ran. Its correctness stage once looked for the kernel tests under
  experiments/, ran none (pytest's exit 4) and recorded ``correctness: {}``."""
  out = tmp_path / "check.json"
  _run("experiments.benchmarks.kernel_check", "--interpret", "--recipes=mxfp8",
       "--tests=test_mx_quantize_matches_numpy_reference and e4m3-nearest-gpu",
       "--kernels=mx_quantize_dequantize e4m3 axis -2", f"--out={out}")
  report = json.loads(out.read_text())
  assert report["skipped"] == []
  correctness = report["correctness"]
  assert correctness["exit_code"] == 0 and not correctness["compiled"]
  assert correctness["counts"] == {"passed": 1}
  assert set(report["kernels"]) == {"mx_quantize_dequantize e4m3 axis -2"}
  assert report["bandwidth"]["copy_gb_per_s"] > 0
  assert report["matmul"]["mx_matmul e4m3 x e4m3"]["tflop_per_s"] > 0
  steps = report["train_step"]["recipes"]
  assert list(steps) == ["bf16", "mxfp8", "mxfp8 (jnp)", "mxfp8 native"]
  assert report["train_step"]["skipped"] == []
  assert steps["mxfp8"]["pallas_calls"] > 0 and steps["mxfp8 (jnp)"]["pallas_calls"] == 0
  assert all(step["ms"] > 0 for step in steps.values())
  # Issue 53 item 5: emulated against native losses; on the CPU the native recipe runs
  # the emulated GEMMs, so the two trainings agree exactly.
  native = report["native_vs_emulated"]
  assert native["steps"] == 3 and native["skipped"] == []
  mx = native["recipes"]["mxfp8"]
  assert len(mx["emulated"]) == 3 and mx["emulated"] == mx["native"]
  assert mx["max_abs_diff"] == 0.0 and mx["emulated"][0] > 0


def test_kernel_check_sets_measured_beside_the_roofline_estimate():
  """On a device the compile check has a target for, each rate gets its estimate."""
  code = """
import pytest
from experiments.benchmarks import kernel_check as kc
assert kc.device_target("NVIDIA H200").name == "H200"
assert kc.device_target("NVIDIA B200").name == "B200"
assert kc.device_target("TPU v5 lite").name == "v5e"
assert kc.device_target("TPU v6 lite").name == "v6e"
assert kc.device_target("NVIDIA H100 80GB HBM3") is None and kc.device_target("cpu") is None
rec = kc._rate(2e-3, 4.8e9, 4e12, kc.device_target("NVIDIA H200"))
assert rec["estimate_ms"] == pytest.approx(1.0) and rec["measured_over_estimate"] == pytest.approx(2.0)
assert "estimate_ms" not in kc._rate(2e-3, 4.8e9, 4e12, None)
# The exit status: a correctness stage that timed out or ran no test proves nothing.
passed = dict(exit_code=0, counts=dict(passed=3, skipped=1))
assert kc.correctness_failure(passed) is None
timed_out = dict(exit_code=None, error="timed out after 9 s")
assert "timed out" in kc.correctness_failure(timed_out)
assert "exit 4" in kc.correctness_failure(dict(exit_code=4, counts={}))
assert "no kernel test passed" in kc.correctness_failure(dict(exit_code=0, counts={}))
failed = dict(exit_code=1, counts=dict(passed=2, failed=1))
assert "failed" in kc.correctness_failure(failed)
print("ok")
"""
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, check=True)
  assert out.stdout.strip() == "ok"


@pytest.mark.parametrize("flag,message", [
    ("--targets=v4:2x2", "error: --targets: unknown v4:2x2; known: H200, B200, v5e, v6e, "
                         "v5e:2x2, h200x4"),
    ("--recipes=fp9", "error: --recipes: unknown fp9; known: "),
    ("--layouts=", "error: --layouts: none given; known: data, data_tensor"),
    ("--size=huge", "error: flag --size=huge: value should be one of <ci|table>")])
def test_step_compile_refuses_a_bad_flag_in_one_line(flag, message):
  proc = subprocess.run([sys.executable, "-m", "experiments.benchmarks.step_compile", flag],
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
  assert proc.stderr.strip().startswith(message), proc.stderr


def test_kernel_check_refuses_an_unknown_kernel_in_one_line_before_its_stages():
  """Before: an unknown --kernels name was a ValueError traceback (exit 1) raised in
  the throughput stage, after the correctness stage had run for minutes."""
  proc = subprocess.run([sys.executable, "-m", "experiments.benchmarks.kernel_check",
                         "--interpret", "--kernels=nope"], capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.strip().startswith("error: unknown --kernels ['nope']; known: ")
  assert "correctness:" not in proc.stdout
