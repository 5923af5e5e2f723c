"""Periodic progress lines (step, loss, steps/s, ETA) through absl logging."""

from __future__ import annotations

import time

from absl import logging


def format_duration(seconds: float) -> str:
  """``3725.2 -> '1h02m05s'``, ``65 -> '1m05s'``, ``4.2 -> '4s'``."""
  seconds = max(0, int(round(seconds)))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  if h:
    return f"{h}h{m:02d}m{s:02d}s"
  if m:
    return f"{m}m{s:02d}s"
  return f"{s}s"


class ProgressReporter:
  """Logs a progress line at most every ``every_s`` seconds (and on demand).

  Throughput is measured from the first reported step on, so compilation of the first
  step does not pollute steps/s or the ETA.
  """

  def __init__(self, num_steps: int, *, every_s: float = 10.0, prefix: str = "train",
               clock=time.perf_counter):
    if num_steps < 1:
      raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    self.num_steps = num_steps
    self.every_s = every_s
    self.prefix = prefix
    self._clock = clock
    self._t0: float | None = None
    self._step0 = 0
    self._last_log = -float("inf")

  def start(self, step: int) -> None:
    """Starts the throughput clock at ``step`` (call after the first, compiling step)."""
    self._t0, self._step0 = self._clock(), step

  def timed(self, step: int) -> tuple[int, float]:
    """``(steps, seconds)`` timed from the first reported step to ``step``, now."""
    if self._t0 is None or step <= self._step0:
      return 0, 0.0
    return step - self._step0, max(self._clock() - self._t0, 0.0)

  def steps_per_s(self, step: int) -> float:
    if self._t0 is None or step <= self._step0:
      return float("nan")
    return (step - self._step0) / max(self._clock() - self._t0, 1e-9)

  def maybe_log(self, step: int, loss: float, force: bool = False) -> str | None:
    """Logs ``step n/N | loss | steps/s | ETA`` if due (or forced); returns the line."""
    now = self._clock()
    if not force and now - self._last_log < self.every_s:
      return None
    self._last_log = now
    rate = self.steps_per_s(step)
    eta = (self.num_steps - step) / rate if rate == rate and rate > 0 else float("nan")
    eta_text = format_duration(eta) if eta == eta else "?"
    line = (f"{self.prefix} step {step}/{self.num_steps} | loss {loss:.4f} | "
            f"{rate:.2f} steps/s | ETA {eta_text}")
    logging.info(line)
    return line
