"""Wall-clock timing of jitted calls, for the benchmark scripts (never for tests)."""

from __future__ import annotations

import time
from typing import Any, Callable

import jax


def best_time(fn: Callable[..., Any], *args: Any, repeats: int = 7) -> float:
  """Seconds of the fastest of ``repeats`` calls of ``fn(*args)`` after a warm-up call.

  The minimum is the least load-sensitive statistic on a shared machine; compare it
  only as a ratio to another op timed in the same process.
  """
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - t0)
  return best
