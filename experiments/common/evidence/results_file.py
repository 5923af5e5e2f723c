"""The results table on disk: one JSON object per line, appended under a lock.

Parallel runs share one file, so every append holds an exclusive ``flock`` and writes
one complete line. A write that fails part way (a full disk) is truncated back to where
it started by the writer, which still holds the lock, so the file never keeps it. A
line cut short by a crash (the writer killed mid-write) is never glued to the next row:
:func:`append_result` first ends it with a newline, so it stays a damaged line of its
own, which readers list by ``path:line``. Non-finite
numbers are written as JSON ``null`` (JSON has no NaN or Inf); readers treat them as
missing.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
from typing import Any

from absl import logging


def jsonable(value: Any) -> Any:
  """``value`` with every non-finite float (at any depth) replaced by None."""
  if isinstance(value, float):
    return value if math.isfinite(value) else None
  if isinstance(value, dict):
    return {k: jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [jsonable(v) for v in value]
  return value


def _write_all(fd: int, data: bytes) -> None:
  """``os.write`` until every byte is written (a write may take only some)."""
  view = memoryview(data)
  while view:
    view = view[os.write(fd, view):]


def _append_locked(f: Any, path: str, line: str) -> None:
  """Appends ``line`` to the locked file ``f``, first ending a partial last line; a
  failed write (ENOSPC, EIO) is truncated back to the file's size before it."""
  f.seek(0, os.SEEK_END)
  start = f.tell()
  data = line.encode()
  if start:
    f.seek(start - 1)
    if f.read(1) != b"\n":
      data = b"\n" + data
      logging.warning(
          "%s ended in a partial line (a write cut short); ended it there, so it stays "
          "a damaged line of its own (readers list it by line number) and the new row "
          "starts on a line of its own", path)
  fd = f.fileno()
  try:
    _write_all(fd, data)  # O_APPEND: at the end, which the lock keeps at ``start``
  except BaseException:
    # Nobody else appends while the lock is held, so everything past ``start`` is ours.
    os.ftruncate(fd, start)
    raise


def _open_locked(path: str) -> Any:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  f = open(path, "a+b")  # appends always go to the end; reads may seek
  fcntl.flock(f, fcntl.LOCK_EX)
  return f


def _line(row: dict[str, Any]) -> str:
  if not isinstance(row, dict):
    raise TypeError(f"row must be a dict, got {type(row).__name__}")
  return json.dumps(jsonable(row), sort_keys=True, allow_nan=False) + "\n"


def append_result(path: str, row: dict[str, Any]) -> None:
  """Appends ``row`` as one line to the JSONL file at ``path`` (safe across processes)."""
  line = _line(row)
  with _open_locked(path) as f:
    _append_locked(f, path, line)


def same_run(a: dict[str, Any], b: dict[str, Any]) -> bool:
  """Whether two rows record one run: the same ``run_name`` and, where both name it,
  the same ``workdir``."""
  if a.get("run_name") != b.get("run_name"):
    return False
  return not (a.get("workdir") and b.get("workdir")) or a["workdir"] == b["workdir"]


def append_result_unless_present(path: str, row: dict[str, Any]) -> bool:
  """Appends ``row`` unless the file already holds a readable row of the same run
  (:func:`same_run`); returns whether it appended. The check and the append hold one
  lock, so two processes never both append it: finishing a run twice (a rerun after a
  kill between its row and its completion mark) leaves one row."""
  line = _line(row)
  if os.path.exists(path):
    with open(path, "rb") as f:  # unlocked first: a read-only file that holds it is fine
      if _holds(f, row):
        return False
  with _open_locked(path) as f:
    f.seek(0)
    if _holds(f, row):
      return False
    _append_locked(f, path, line)
  return True


def _holds(f: Any, row: dict[str, Any]) -> bool:
  """Whether the open results file ``f`` holds a readable row of ``row``'s run."""
  for raw in f:
    try:
      existing = json.loads(raw)
    except ValueError:
      continue
    if isinstance(existing, dict) and same_run(existing, row):
      return True
  return False


def read_results(path: str, problems: list[str] | None = None) -> list[dict[str, Any]]:
  """Reads every row of a results JSONL file (missing file: empty list).

  A line that is not a JSON object raises ValueError naming ``path:line``, unless a
  ``problems`` list is given: the line is then skipped and its ``path:line: reason``
  appended there (a report tolerates a damaged row and says which).
  """
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for lineno, line in enumerate(f, 1):
      line = line.strip()
      if not line:
        continue
      try:
        row = json.loads(line)
        if not isinstance(row, dict):
          raise ValueError(f"a JSON {type(row).__name__}, not an object")
      except ValueError as e:  # json.JSONDecodeError is a ValueError
        message = f"{path}:{lineno}: not a results row ({e})"
        if problems is None:
          raise ValueError(message) from e
        problems.append(message)
        continue
      rows.append(row)
  return rows
