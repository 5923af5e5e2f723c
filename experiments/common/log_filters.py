"""Keeps third-party INFO chatter (orbax logs ~20 lines per save) out of progress output."""

from __future__ import annotations

import logging as std_logging

from absl import logging


class _DropInfoFrom(std_logging.Filter):

  def __init__(self, path_fragments: tuple[str, ...]):
    super().__init__()
    self._fragments = path_fragments

  def filter(self, record: std_logging.LogRecord) -> bool:
    if record.levelno >= std_logging.WARNING:
      return True
    return not any(f in record.pathname for f in self._fragments)


def quiet_library_info(path_fragments: tuple[str, ...] = ("/orbax/",)) -> None:
  """Drops INFO/DEBUG records emitted from files under ``path_fragments`` (entry points only)."""
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _DropInfoFrom) for f in handler.filters):
    handler.addFilter(_DropInfoFrom(path_fragments))
