"""The operator-SNR script runs and prints its table."""

import subprocess
import sys

import pytest


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


def test_committed_snr_table_reproduces():
  """The ALTO report reads its SNR table from committed data (a rebuild no longer spends
  a minute measuring it); one cell measured again at the committed shape must match."""
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  from experiments.alto import appendix  # pylint: disable=g-import-not-at-top
  from experiments.common.harness.repo_paths import REPO_DIR  # pylint: disable=g-import-not-at-top
  with open(os.path.join(REPO_DIR, "experiments/alto/report", appendix.SNR_FILE)) as f:
    data = json.load(f)
  assert not data["git"]["dirty"], data["git"]
  assert [(r["label"], r["recipe"]) for r in data["rows"]] == list(appendix.SNR_RECIPES)
  row = data["rows"][0]
  again = appendix.measure_snr(row["label"], row["recipe"], "linear", data["shape"])
  # Another CPU may sum in another order: the table prints two decimals.
  assert again == pytest.approx(row["linear"], abs=1e-3)
