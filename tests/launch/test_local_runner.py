"""The local parallel runner, with trivial commands (no JAX)."""

import os
import sys
import time

from experiments.common.evidence.results import append_result
from launch.local_runner import default_parallelism, run_local
from launch.manifest import RunSpec


def _spec(tmp_path, i, code):
  wd = str(tmp_path / f"r{i}")
  return RunSpec(i, f"r{i}", "a", i, wd, str(tmp_path / "results.jsonl"), {},
                 (sys.executable, "-c", code))


def test_parallel_skip_and_timeout(tmp_path):
  append_result(str(tmp_path / "results.jsonl"), {"run_name": "r0"})
  sleep = "import time, os; time.sleep(1.0); print(sorted(os.sched_getaffinity(0)))"
  specs = [_spec(tmp_path, 0, "raise SystemExit(3)"),  # already complete: skipped
           _spec(tmp_path, 1, sleep), _spec(tmp_path, 2, sleep),
           _spec(tmp_path, 3, "raise SystemExit(2)"),
           _spec(tmp_path, 4, "import time; time.sleep(30)")]
  t0 = time.monotonic()
  out = {o.run_name: o for o in run_local(specs, parallel=2, timeout_s=3.0)}
  assert time.monotonic() - t0 < 15
  assert out["r0"].returncode is None
  assert out["r1"].returncode == 0 and out["r2"].returncode == 0
  assert out["r3"].returncode == 2
  assert out["r4"].returncode not in (0, None)  # killed at the timeout
  pinned = [open(os.path.join(tmp_path, r, "launch.log")).read().strip() for r in ("r1", "r2")]
  if len(os.sched_getaffinity(0)) >= 2:  # two parallel runs, one core each, disjoint
    assert sorted(pinned) == sorted(f"[{c}]" for c in sorted(os.sched_getaffinity(0))[:2])


def test_default_parallelism():
  n = default_parallelism()
  assert 1 <= n <= len(os.sched_getaffinity(0))
  assert default_parallelism(cpus_per_run=10_000) == 1
