"""The cost table's arithmetic on a hand-made step_compile report (no compile)."""

import json
import subprocess
import sys

import pytest

from experiments.benchmarks import step_costs
from lowprec.numerics.kernels import compile_check

_H200, _V5E = compile_check.TARGETS[0], compile_check.TARGETS[2]


def _row(recipe, target, flops, nbytes, native=False, ok=True):
  return dict(recipe=recipe, target=target, layout="single", native=native, ok=ok,
              error=None if ok else "JaxRuntimeError: no", flops=flops, bytes=nbytes,
              kernel_bytes=0.0, cpu_s=1.5, cost_source="cost_analysis()")


_REPORT = dict(command="python -m experiments.benchmarks.step_compile --size=ci",
               jax="0.10.2", date="2026-12-07", seconds=1.0,
               size=dict(d_model=64, num_layers=1),
               results=[_row("bf16", "H200", 1e9, 4.8e9),         # 1000 us, memory
                        _row("fp8", "H200", 1e9, 9.6e9),          # 2000 us
                        _row("fp8", "H200", 1.978e15, 1.0, True),  # 2e6 us, compute
                        _row("nvfp4", "H200", 0, 0, ok=False),
                        _row("mxfp8", "v5e", 1.0, 819e9),          # no bf16 row on v5e
                        dict(_row("bf16", "h200x4", 1, 1), layout="data")])


def test_the_roofline_is_the_longer_of_flops_over_peak_and_bytes_over_bandwidth():
  assert step_costs.estimate_us(_row("x", "H200", 1e9, 4.8e9), _H200) == (
      pytest.approx(1000.0), "memory")
  assert step_costs.estimate_us(_row("x", "H200", 989e12, 1.0), _H200) == (
      pytest.approx(1e6), "compute")
  assert step_costs.estimate_us(_row("x", "v5e", 0.0, 819e9), _V5E)[0] == pytest.approx(1e6)


def test_the_table_divides_by_bf16_on_the_same_target_and_names_failures():
  text = step_costs.markdown(_REPORT)
  assert "estimates, not timings" in text and _REPORT["command"] in text
  lines = text.splitlines()
  h200 = lines[lines.index("### H200"):lines.index("### v5e")]
  assert any(l.startswith("| bf16 | emulated |") and "| 1000.0 | memory | 1.00 |" in l
             for l in h200)
  assert any(l.startswith("| fp8 | emulated |") and "| 2000.0 | memory | 2.00 |" in l
             for l in h200)
  assert any(l.startswith("| fp8 | native |") and "| compute | 2000.00 |" in l for l in h200)
  assert any("nvfp4 | emulated | does not compile: JaxRuntimeError: no" in l for l in h200)
  v5e = lines[lines.index("### v5e"):]
  assert any(l.startswith("| mxfp8 |") and "| memory | - |" in l for l in v5e)
  assert "h200x4" not in text  # sharded compiles are not in the table
  assert "### B200" not in text  # no row for it


def test_the_script_rebuilds_the_table_from_a_report_and_refuses_a_bad_one(tmp_path):
  report = tmp_path / "report.json"
  report.write_text(json.dumps(_REPORT))
  out = tmp_path / "costs.md"
  cmd = [sys.executable, "-m", "experiments.benchmarks.step_costs"]
  subprocess.run(cmd + [f"--json={report}", f"--out={out}"], check=True, timeout=120)
  assert out.read_text() == step_costs.markdown(_REPORT)
  (tmp_path / "bad.json").write_text("{}")
  proc = subprocess.run(cmd + [f"--json={tmp_path / 'bad.json'}"], capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip().startswith("error: --json=") and len(
      proc.stderr.strip().splitlines()) == 1, proc.stderr
