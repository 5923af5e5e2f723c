"""Keeps third-party chatter out of an entry point's output.

orbax logs ~20 INFO lines per save, and when a save fails (a full disk) it logs the
error with its traceback from each of its worker threads before re-raising it to the
caller, which reports it once (:mod:`experiments.common.script`). JAX logs at INFO that
it found no TPU ("Unable to initialize backend 'tpu'") on every CPU start, and
TensorBoard's event reader one "No path found after ..." line per run directory read.
"""

from __future__ import annotations

import logging as std_logging

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


def quiet_library_info(path_fragments: tuple[str, ...] = _LIBRARIES) -> None:
  """Drops INFO/DEBUG records emitted from files under ``path_fragments``, and their
  worker threads' logged copies of re-raised exceptions (entry points only)."""
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _DropInfoFrom) for f in handler.filters):
    handler.addFilter(_DropInfoFrom(path_fragments))
