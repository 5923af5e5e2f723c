"""Wall-clock timing of jitted calls, for the benchmark scripts (never for tests)."""

from __future__ import annotations

import statistics
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


def interleaved(fns: dict[str, Callable[[], Any]], rounds: int, repeats: int,
                first: int = 0) -> dict[str, list[float]]:
  """``{name: [per-round min seconds]}``; ``fns[name]()`` is called and blocked on,
  the names in a rotated order each round (so load that comes and goes during the
  rounds falls on every name alike). ``first`` continues the rotation of an earlier
  call's rounds (a benchmark run in looks)."""
  names = list(fns)
  out: dict[str, list[float]] = {n: [] for n in names}
  for r in range(first, first + rounds):
    order = names[r % len(names):] + names[:r % len(names)]
    for name in order:
      best = float("inf")
      for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fns[name]())
        best = min(best, time.perf_counter() - t)
      out[name].append(best)
  return out


def ratio_summary(times: dict[str, list[float]], baseline: str
                  ) -> dict[str, dict[str, float]]:
  """Per name of :func:`interleaved`'s ``times``: median and min ms over rounds, and
  the per-round ratio to ``baseline`` (median, min, max over rounds)."""
  out = {}
  for name, ts in times.items():
    ratios = [t / b for t, b in zip(ts, times[baseline])]
    out[name] = {"ms": 1e3 * statistics.median(ts), "ms_min": 1e3 * min(ts),
                 "ratio": statistics.median(ratios), "ratio_min": min(ratios),
                 "ratio_max": max(ratios)}
  return out
