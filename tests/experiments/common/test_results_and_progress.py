"""Results JSONL rows, progress lines, run metadata."""

import json
import os
import platform
import subprocess
import sys

import jax
import jaxlib.version
import numpy as np
import pytest

from experiments.common.evidence import results
from experiments.common.harness import progress, run_metadata
from experiments.common.harness.run_options import RunOptions, resolve_run_options


from experiments.common.harness.repo_paths import REPO_DIR as REPO
_WORKER = """
import sys
from experiments.common.evidence import results
for i in range(50):
  results.append_result(sys.argv[1], {"worker": sys.argv[2], "i": i, "pad": "x" * 5000})
"""


def test_append_and_read(tmp_path):
  path = str(tmp_path / "sub" / "results.jsonl")
  assert results.read_results(path) == []
  results.append_result(path, {"a": 1, "loss": float("nan")})
  results.append_result(path, {"a": 2})
  rows = results.read_results(path)
  # JSON has no NaN: non-finite numbers are written as null, at any depth (issue 16:
  # a "nan" string crashed the report's number formatting).
  assert [r["a"] for r in rows] == [1, 2] and rows[0]["loss"] is None
  results.append_result(path, {"a": 3, "metrics": {"x": float("inf"), "y": [float("nan")]}})
  assert results.read_results(path)[2]["metrics"] == {"x": None, "y": [None]}
  with pytest.raises(TypeError):
    results.append_result(path, [1])


def test_parallel_appends_do_not_interleave(tmp_path):
  path = str(tmp_path / "r.jsonl")
  procs = [subprocess.Popen([sys.executable, "-c", _WORKER, path, str(w)],
                            env={**os.environ, "PYTHONPATH": REPO}) for w in range(3)]
  assert all(p.wait(timeout=60) == 0 for p in procs)
  rows = results.read_results(path)
  assert len(rows) == 150 and all(len(r["pad"]) == 5000 for r in rows)


def test_progress_line_and_eta():
  t = [0.0]
  rep = progress.ProgressReporter(100, every_s=5.0, clock=lambda: t[0])
  rep.start(10)
  t[0] = 9.0
  line = rep.maybe_log(40, 1.2345)
  assert line == "train step 40/100 | loss 1.2345 | 3.33 steps/s | ETA 18s"
  t[0] = 10.0
  assert rep.maybe_log(41, 1.0) is None  # throttled
  assert rep.maybe_log(41, 1.0, force=True) is not None
  assert progress.format_duration(3725) == "1h02m05s"
  assert progress.format_duration(65) == "1m05s"


def test_run_options_resolution(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  o = resolve_run_options(RunOptions(), "lm")
  assert o.workdir == str(tmp_path / "runs" / "lm" / "default")
  assert o.run_name == "default" and o.results_file == o.workdir + "/results.jsonl"
  o = resolve_run_options(RunOptions(workdir="x/y"), "lm")
  assert o.run_name == "y"
  # The README's "add --recipe=mxfp8" after the quick start gets a run of its own.
  from experiments.lm.experiment import LMConfig  # pylint: disable=import-outside-toplevel
  o = resolve_run_options(RunOptions(), "lm", LMConfig(recipe="mxfp8"))
  assert o.workdir == str(tmp_path / "runs" / "lm" / "recipe=mxfp8")
  assert resolve_run_options(RunOptions(), "lm", LMConfig()).run_name == "default"
  with pytest.raises(ValueError):
    resolve_run_options(RunOptions(stop_at_step=-1), "lm")


def test_run_metadata(tmp_path):
  path = run_metadata.write_run_metadata(str(tmp_path), RunOptions(), RunOptions(workdir="w"))
  rec = json.load(open(path))
  assert rec["run_options"]["workdir"] == "w"
  assert len(rec["git"]["commit"]) == 40  # this checkout is a git repository
  # What a float metric's last bits depend on beyond the commit (docs/sweeps.md).
  host = rec["host"]
  assert host["versions"]["jaxlib"] == jaxlib.version.__version__
  assert host["versions"]["jax"] == jax.__version__
  assert host["versions"]["numpy"] == np.__version__
  assert set(host["cpu_isa"]) <= set(run_metadata._ISA_FLAGS)  # pylint: disable=protected-access
  if os.path.exists("/proc/cpuinfo") and platform.machine() == "x86_64":
    assert "sse4_2" in host["cpu_isa"] and host["cpu"]


def test_benchmark_json_records_the_git_state(tmp_path, capsys):
  path = str(tmp_path / "bench.json")
  results.write_benchmark(path, {"ms": 1.0}, "table")
  record = json.load(open(path))
  assert record["ms"] == 1.0 and record["git"] == run_metadata.git_state()
  assert len(record["git"]["commit"]) == 40 and record["git"]["dirty"] in (True, False)
  assert "table" in capsys.readouterr().out
  sha = "a" * 40
  assert results.benchmark_provenance({"git": {"commit": sha, "dirty": False}}) == \
      "commit `aaaaaaa`, clean tree"
  assert "dirty" in results.benchmark_provenance({"git": {"commit": sha, "dirty": True}})
  assert results.benchmark_provenance({"git_commit": sha}) == \
      "commit `aaaaaaa`, dirty flag not recorded"
  assert results.benchmark_provenance({}) == "commit and dirty flag not recorded"
