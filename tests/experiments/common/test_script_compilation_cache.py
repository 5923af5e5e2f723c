"""Every experiment script turns on JAX's persistent compilation cache
(``experiments.common.harness.script.turn_on_compilation_cache``) in a directory private to the
user: a later run loads the programs an earlier one compiled and ends with the same
final metrics, bit for bit; a directory another user owns or can write is not used
(issue 51, row 1: a shared ``<tmp>/jax_cache_lm`` let one user choose the executable
another user's run loaded)."""

import os
import stat
import subprocess

import jax
import pytest

from experiments.common.evidence.results import read_results
from experiments.common.harness import private_dirs
from experiments.common.harness import script
from experiments.common.harness.repo_paths import REPO_DIR
from tests.experiments.common.tiny_lm import cli


def _entries(cache_dir):
  return sorted(f for f in os.listdir(cache_dir) if f.endswith("-cache"))


def test_a_run_from_cached_programs_equals_the_run_that_compiled_them(tmp_path):
  # The script's default directory, <cache home>/lowprec/jax_cache_lm, under a cache
  # home of this test's own. A floor of 0 s caches every program (the default, 1 s,
  # skips a tiny run's), so a second run that compiled anything would add an entry.
  cache_dir = tmp_path / "cache" / "lowprec" / "jax_cache_lm"
  env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"),
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
  assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700
  entries = _entries(cache_dir)
  assert entries
  second = run("second")
  assert _entries(cache_dir) == entries  # every program of the second run was a hit
  assert second["metrics"] == first["metrics"] and second["metrics"]


@pytest.fixture
def jax_cache_settings():
  names = ("jax_enable_compilation_cache", "jax_compilation_cache_dir")
  before = {n: getattr(jax.config, n) for n in names}
  yield
  for n, v in before.items():
    jax.config.update(n, v)


def _turn_on(monkeypatch, tmp_path, explicit=None):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  if explicit is None:
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  else:
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(explicit))
  return script.turn_on_compilation_cache("lm")


def test_the_default_directory_is_private_and_per_user(monkeypatch, tmp_path,
                                                       jax_cache_settings):
  directory = _turn_on(monkeypatch, tmp_path)
  assert directory == str(tmp_path / "cache" / "lowprec" / "jax_cache_lm")
  assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
  assert jax.config.jax_compilation_cache_dir == directory
  assert jax.config.jax_enable_compilation_cache


@pytest.mark.parametrize("explicit", [False, True])
def test_a_world_writable_cache_directory_is_not_used(monkeypatch, tmp_path, capsys,
                                                      jax_cache_settings, explicit):
  # Another user created the directory first and left it writable (or the user set
  # JAX_COMPILATION_CACHE_DIR to a shared one): its executables are not loaded.
  shared = (tmp_path / "shared") if explicit else (
      tmp_path / "cache" / "lowprec" / "jax_cache_lm")
  shared.mkdir(parents=True)
  shared.chmod(0o777)
  assert _turn_on(monkeypatch, tmp_path, shared if explicit else None) is None
  assert not jax.config.jax_enable_compilation_cache
  [line] = capsys.readouterr().err.splitlines()
  assert "compilation cache off" in line and "writable by other users" in line
  assert str(shared) in line


def test_a_cache_directory_owned_by_another_user_is_not_used(monkeypatch, tmp_path, capsys,
                                                             jax_cache_settings):
  (tmp_path / "cache" / "lowprec" / "jax_cache_lm").mkdir(parents=True, mode=0o700)
  # The directory is this process's; make this process another user instead.
  monkeypatch.setattr(os, "geteuid", lambda: os.stat(tmp_path).st_uid + 4242)
  assert _turn_on(monkeypatch, tmp_path) is None
  assert not jax.config.jax_enable_compilation_cache
  assert "not by this user" in capsys.readouterr().err


def test_a_writable_directory_above_without_the_sticky_bit_is_refused(tmp_path):
  open_dir = tmp_path / "open"
  (open_dir / "mine").mkdir(parents=True, mode=0o700)
  open_dir.chmod(0o777)
  reason = private_dirs.unsafe_reason(str(open_dir / "mine"))
  assert reason is not None and "without the sticky bit" in reason
  open_dir.chmod(0o777 | stat.S_ISVTX)  # as /tmp: others cannot rename what is inside
  assert private_dirs.unsafe_reason(str(open_dir / "mine")) is None


def test_without_a_writable_home_the_default_falls_back_to_a_private_tmp_dir(
    monkeypatch, tmp_path):
  monkeypatch.setenv("XDG_CACHE_HOME", "/proc/no-such-cache-home")
  monkeypatch.setattr(private_dirs.tempfile, "gettempdir", lambda: str(tmp_path))
  directory = private_dirs.default_cache_dir("jax_cache_lm")
  assert directory == str(tmp_path / f"lowprec-{os.geteuid()}" / "jax_cache_lm")
  assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
