"""tests.compile_cache: programs are cached only inside, and the settings come back."""

import os

import jax
import jax.numpy as jnp

from tests import compile_cache


def _entries(path) -> int:
  return len([f for f in os.listdir(path) if not f.startswith(".")])


def test_programs_are_cached_inside_only_and_settings_are_restored(tmp_path):
  before = (jax.config.jax_compilation_cache_dir,
            jax.config.jax_persistent_cache_min_compile_time_secs)
  inside = tmp_path / "inside"
  inside.mkdir()
  with compile_cache.shared_compiles(str(inside)):
    # A program no other test compiles (the multiplier), so this compile is fresh.
    assert float(jax.jit(lambda x: x * 7919.0)(jnp.float32(1.0))) == 7919.0
    assert _entries(inside) >= 1
  assert (jax.config.jax_compilation_cache_dir,
          jax.config.jax_persistent_cache_min_compile_time_secs) == before
  n = _entries(inside)
  jax.jit(lambda x: x * 7907.0)(jnp.float32(1.0))
  assert _entries(inside) == n  # the cache is off again: nothing more is written
