"""The operator-SNR script runs and prints its table."""

import subprocess
import sys


def _run(*args):
  out = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                       timeout=300, check=True)
  return out.stdout


def test_operator_snr_prints_table():
  out = _run("experiments.alto.operator_snr", "--recipes=bf16,mxfp4", "--tokens=64", "--k=64",
             "--n=64", "--repeats=1", "--experts=2")
  rows = {tuple(l.split()[:2]): [float(v) for v in l.split()[2:]] for l in out.splitlines()
          if l.split() and l.split()[0] in ("bf16", "mxfp4")}
  assert set(rows) == {(r, g) for r in ("bf16", "mxfp4") for g in ("linear", "grouped")}
  for gemm in ("linear", "grouped"):
    assert all(b > m for b, m in zip(rows["bf16", gemm], rows["mxfp4", gemm]))
