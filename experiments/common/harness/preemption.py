"""Noticing a preemption request (SIGTERM, or SIGINT: Ctrl-C) so the loop can checkpoint
and exit cleanly.

A run that stops before its last step (SIGTERM, Ctrl-C, or ``--stop_at_step``) has saved
a checkpoint and written no results row; its script then exits with
:data:`PREEMPTED_EXIT_CODE` (75, ``EX_TEMPFAIL``: "try again"), so a runner tells it
from a success (0) and from a failure (1), reports it as preempted and reruns it with
``--resume``. A second Ctrl-C stops at once, without a checkpoint (KeyboardInterrupt).
"""

from __future__ import annotations

import signal
import threading

import jax
from absl import logging

PREEMPTED_EXIT_CODE = 75  # os.EX_TEMPFAIL: launchers read it as "preempted, requeue"


class PreemptionWatcher:
  """Context manager; ``requested(step)`` is True once the job should checkpoint and stop.

  Single process: SIGTERM and SIGINT handlers set a flag (installed only from the main
  thread; the previous handlers are restored on exit). After the first SIGINT, the next
  one raises KeyboardInterrupt as usual, so a second Ctrl-C still stops a run whose
  step or checkpoint hangs. Multi-process: every process must stop at the same step,
  so JAX's preemption sync point (set up by ``jax.distributed``) decides.
  """

  def __init__(self):
    self._flag = threading.Event()
    self._previous: dict[int, object] = {}
    self._multi = False

  def __enter__(self) -> "PreemptionWatcher":
    self._multi = jax.process_count() > 1
    if not self._multi and threading.current_thread() is threading.main_thread():
      for signum in (signal.SIGTERM, signal.SIGINT):
        self._previous[signum] = signal.signal(signum, self._on_signal)
    return self

  def _on_signal(self, signum, frame) -> None:  # pylint: disable=unused-argument
    if signum == signal.SIGINT:
      logging.warning("SIGINT (Ctrl-C) received: will checkpoint and stop after this step "
                      "(Ctrl-C again stops at once, without a checkpoint)")
      signal.signal(signal.SIGINT, signal.default_int_handler)
    else:
      logging.warning("SIGTERM received: will checkpoint and stop after this step")
    self._flag.set()

  def requested(self, step: int) -> bool:
    if self._multi:
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      return bool(multihost_utils.reached_preemption_sync_point(step))
    return self._flag.is_set()

  def __exit__(self, *exc) -> None:
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    self._previous = {}
