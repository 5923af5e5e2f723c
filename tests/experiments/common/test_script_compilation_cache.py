"""Every experiment script turns on JAX's persistent compilation cache
(``experiments.common.script.turn_on_compilation_cache``): a later run loads the
programs an earlier one compiled, and ends with the same final metrics, bit for bit."""

import os
import subprocess

from experiments.common.repo_paths import REPO_DIR
from experiments.common.results import read_results
from tests.experiments.common.tiny_lm import cli


def _entries(cache_dir):
  return sorted(f for f in os.listdir(cache_dir) if f.endswith("-cache"))


def test_a_run_from_cached_programs_equals_the_run_that_compiled_them(tmp_path):
  # The script's default directory, <tmp>/jax_cache_lm, under a temporary directory of
  # this test's own. A floor of 0 s caches every program (the default, 1 s, skips a
  # tiny run's), so a second run that compiled anything at all would add an entry.
  (tmp_path / "tmp").mkdir()
  cache_dir = tmp_path / "tmp" / "jax_cache_lm"
  env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"),
         "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  env.pop("JAX_COMPILATION_CACHE_DIR", None)

  def run(name):
    out = subprocess.run(cli(tmp_path / name), env=env, capture_output=True, text=True,
                         timeout=300, cwd=REPO_DIR)
    assert out.returncode == 0, out.stderr[-3000:]
    [row] = read_results(str(tmp_path / name / "results.jsonl"))
    return row

  first = run("first")
  assert cache_dir.is_dir(), "the script did not turn the compilation cache on"
  entries = _entries(cache_dir)
  assert entries
  second = run("second")
  assert _entries(cache_dir) == entries  # every program of the second run was a hit
  assert second["metrics"] == first["metrics"] and second["metrics"]
