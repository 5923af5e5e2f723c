"""Noticing a preemption request (SIGTERM) so the loop can checkpoint and exit cleanly.

A run that stops before its last step (SIGTERM, or ``--stop_at_step``) has saved a
checkpoint and written no results row; its script then exits with
:data:`PREEMPTED_EXIT_CODE` (75, ``EX_TEMPFAIL``: "try again"), so a runner tells it
from a success (0) and from a failure (1), reports it as preempted and reruns it with
``--resume``.
"""

from __future__ import annotations

import signal
import threading

import jax
from absl import logging

PREEMPTED_EXIT_CODE = 75  # os.EX_TEMPFAIL: launchers read it as "preempted, requeue"


class PreemptionWatcher:
  """Context manager; ``requested(step)`` is True once the job should checkpoint and stop.

  Single process: a SIGTERM handler sets a flag (installed only from the main thread;
  the previous handler is restored on exit). Multi-process: every process must stop at
  the same step, so JAX's preemption sync point (set up by ``jax.distributed``) decides.
  """

  def __init__(self):
    self._flag = threading.Event()
    self._previous = None
    self._multi = False

  def __enter__(self) -> "PreemptionWatcher":
    self._multi = jax.process_count() > 1
    if not self._multi and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
    return self

  def _on_sigterm(self, signum, frame) -> None:  # pylint: disable=unused-argument
    logging.warning("SIGTERM received: will checkpoint and stop after this step")
    self._flag.set()

  def requested(self, step: int) -> bool:
    if self._multi:
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      return bool(multihost_utils.reached_preemption_sync_point(step))
    return self._flag.is_set()

  def __exit__(self, *exc) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None
