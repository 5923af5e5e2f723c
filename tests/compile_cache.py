"""JAX's persistent compilation cache for one test module: XLA compiles each distinct
program once, however many runs trace it.

Why not cache the jitted functions themselves: an experiment's loop rebuilds its
jitted closures (learner step, sampler draw, evaluation, sync checks) per run, so
sharing them across runs would need a cache key in library code, one that goes stale
silently when a field it forgets changes what is traced. This cache is keyed by the
lowered program (and the compile options and backend), so a run whose program differs
compiles it afresh and a hit is the executable that program compiles to. It is what
:func:`experiments.common.harness.script.turn_on_compilation_cache` turns on in every
experiment script, and what JAX's own test suite can run under
(``jax._src.test_util``).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import jax
from jax.experimental.compilation_cache import compilation_cache
import pytest

# Restored on exit; the cache's initialization sets the entry-size floor itself.
_SETTINGS = ("jax_enable_compilation_cache", "jax_compilation_cache_dir",
             "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")


@contextlib.contextmanager
def shared_compiles(cache_dir: str) -> Iterator[None]:
  """Inside, compiled programs are stored in and served from ``cache_dir`` (private
  to the caller: one pytest worker's tmp dir, so no two processes write it at once).

  JAX decides once per process whether the cache is on, so it is reset on entry and
  exit; the settings before are restored on exit.
  """
  before = {name: getattr(jax.config, name) for name in _SETTINGS}
  jax.config.update("jax_enable_compilation_cache", True)
  jax.config.update("jax_compilation_cache_dir", cache_dir)
  # Every compile is cached: the default (1 s) would skip most of a tiny run's programs.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  compilation_cache.reset_cache()
  try:
    yield
  finally:
    for name, value in before.items():
      jax.config.update(name, value)
    compilation_cache.reset_cache()


def module_fixture():
  """An autouse, module-scoped pytest fixture that runs the module's tests inside
  :func:`shared_compiles` (a directory per module and worker); a test module assigns it
  to a name: ``_compile_each_program_once = compile_cache.module_fixture()``."""

  @pytest.fixture(scope="module", autouse=True)
  def compile_each_program_once(tmp_path_factory):
    with shared_compiles(str(tmp_path_factory.mktemp("jax_cache"))):
      yield

  return compile_each_program_once
