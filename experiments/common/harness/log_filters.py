"""Keeps third-party chatter out of an entry point's output.

orbax logs ~20 INFO lines per save, and when a save fails (a full disk) it logs the
error with its traceback from each of its worker threads before re-raising it to the
caller, which reports it once (:mod:`experiments.common.harness.script`). JAX logs at INFO that
it found no TPU ("Unable to initialize backend 'tpu'") on every CPU start, and
TensorBoard's event reader one "No path found after ..." line per run directory read.
When a checkpoint cannot be read (a damaged step, which the checkpointer reports and
skips), tensorstore's callbacks into orbax's closed event loop each print a
``RuntimeError: Event loop is closed`` traceback through ``sys.unraisablehook``.
"""

from __future__ import annotations

import logging as std_logging
import sys
from typing import Any

from absl import logging


class _DropInfoFrom(std_logging.Filter):

  def __init__(self, path_fragments: tuple[str, ...]):
    super().__init__()
    self._fragments = path_fragments

  def filter(self, record: std_logging.LogRecord) -> bool:
    from_library = any(f in record.pathname for f in self._fragments)
    if record.levelno >= std_logging.WARNING:
      # A worker thread's copy of an exception its caller re-raises and reports.
      return not (from_library and "raised an exception" in record.getMessage())
    return not from_library


_LIBRARIES = ("/orbax/", "/jax/_src/xla_bridge.py", "/tensorboard/")


def _closed_loop_callback(unraisable: Any) -> bool:
  """Whether an unraisable exception is a callback into an event loop already closed."""
  return (isinstance(unraisable.exc_value, RuntimeError)
          and str(unraisable.exc_value) == "Event loop is closed")


def quiet_library_info(path_fragments: tuple[str, ...] = _LIBRARIES) -> None:
  """Drops INFO/DEBUG records emitted from files under ``path_fragments``, their worker
  threads' logged copies of re-raised exceptions, and the unraisable "Event loop is
  closed" errors of callbacks that arrive after orbax closed its loop (entry points
  only)."""
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _DropInfoFrom) for f in handler.filters):
    handler.addFilter(_DropInfoFrom(path_fragments))
  previous = sys.unraisablehook
  if getattr(previous, "_drops_closed_loop_callbacks", False):
    return

  def hook(unraisable: Any) -> None:
    if not _closed_loop_callback(unraisable):
      previous(unraisable)

  hook._drops_closed_loop_callbacks = True  # pylint: disable=protected-access
  sys.unraisablehook = hook
