"""Smoke tests of the small numerics scripts: they run and print what they claim."""

import json
import subprocess
import sys

import pytest


def _run(*args):
  out = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                       timeout=300, check=True)
  return out.stdout


def test_operator_snr_prints_table():
  out = _run("experiments.operator_snr", "--recipes=bf16,mxfp4", "--tokens=64", "--k=64",
             "--n=64", "--repeats=1", "--experts=2")
  rows = {tuple(l.split()[:2]): [float(v) for v in l.split()[2:]] for l in out.splitlines()
          if l.split() and l.split()[0] in ("bf16", "mxfp4")}
  assert set(rows) == {(r, g) for r in ("bf16", "mxfp4") for g in ("linear", "grouped")}
  for gemm in ("linear", "grouped"):
    assert all(b > m for b, m in zip(rows["bf16", gemm], rows["mxfp4", gemm]))


def test_demo_formats_prints_every_format():
  out = _run("experiments.demo_formats", "--rows=32", "--cols=64")
  for name in ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "int8", "bf16", "fp16", "nvfp4"):
    assert f"\n{name} " in out
  assert "MX 32x32 floor" in out


@pytest.mark.parametrize("script,args", [
    ("experiments.bench_numerics", ["--size=65536", "--repeats=1"]),
    ("experiments.bench_qtrain", ["--d_model=32", "--layers=1", "--batch=2", "--seq=32",
                                  "--repeats=1", "--recipes=bf16,mxfp8"]),
])
def test_benchmarks_run_small(script, args):
  out = _run(script, *args)
  assert out.strip()


def test_kernel_check_smoke_writes_its_json(tmp_path):
  out = tmp_path / "check.json"
  _run("experiments.kernel_check", "--interpret", "--skip_tests", "--skip_train",
       "--kernels=mx_quantize_dequantize e4m3 axis -2", f"--out={out}")
  report = json.loads(out.read_text())
  assert report["skipped"] == ["correctness", "train_step"]
  assert set(report["kernels"]) == {"mx_quantize_dequantize e4m3 axis -2"}
  assert report["bandwidth"]["copy_gb_per_s"] > 0
  assert report["matmul"]["mx_matmul e4m3 x e4m3"]["tflop_per_s"] > 0
