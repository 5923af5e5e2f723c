"""Reads a run's TensorBoard events back (for tests and the sweep report).

Damaged event files. TensorBoard's reader stops at the first record that fails its
checksum and drops the rest of the file without a word. Here each event file is
checked record by record first (TFRecord framing: length, its CRC-32C, data, its
CRC-32C); a damaged span is skipped up to the next intact record, every record after
it is read, and the span is reported (:func:`event_file_damage`, the ``problems``
argument of the readers, and a warning). Files without damage are read as they are.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from typing import Any, NamedTuple

import numpy as np
from absl import logging
from tensorboard.backend.event_processing import io_wrapper
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.plugins.hparams import api_pb2
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.util import tensor_util

# 0 keeps every event: the defaults reservoir-sample (e.g. 1 histogram per tag).
_KEEP_ALL = {"scalars": 0, "tensors": 0, "histograms": 0, "images": 0,
             "compressedHistograms": 0}


class EventFileDamage(NamedTuple):
  """Bytes ``[offset, offset + length)`` of the event file ``path`` hold no intact record."""

  path: str
  offset: int
  length: int
  reason: str

  def __str__(self) -> str:
    return (f"{self.path}: bytes {self.offset}-{self.offset + self.length} unreadable "
            f"({self.reason}), skipped")


_HEADER = 12  # uint64 length, uint32 masked CRC-32C of it
_FOOTER = 4   # uint32 masked CRC-32C of the data


def _record_at(data: bytes, pos: int) -> tuple[int, str]:
  """The end of the intact record at ``pos``, or (-1, why it is not one)."""
  if len(data) - pos < _HEADER:
    return -1, "truncated record header"
  length_bytes = data[pos:pos + 8]
  if masked_crc32c(length_bytes) != struct.unpack("<I", data[pos + 8:pos + 12])[0]:
    return -1, "record length fails its CRC-32C"
  end = pos + _HEADER + struct.unpack("<Q", length_bytes)[0] + _FOOTER
  if end > len(data):
    return -1, "truncated record"
  if masked_crc32c(data[pos + _HEADER:end - _FOOTER]) != struct.unpack(
      "<I", data[end - _FOOTER:end])[0]:
    return -1, "record data fails its CRC-32C"
  return end, ""


def _intact_records(path: str) -> tuple[list[tuple[int, int]], list[EventFileDamage]]:
  """The (start, end) byte ranges of the intact records of ``path``, and its damage."""
  with open(path, "rb") as f:
    data = f.read()
  records, damage, pos = [], [], 0
  while pos < len(data):
    end, reason = _record_at(data, pos)
    if end > 0:
      records.append((pos, end))
      pos = end
      continue
    nxt = pos + 1  # the next offset where an intact record starts
    while nxt < len(data) and _record_at(data, nxt)[0] < 0:
      nxt += 1
    damage.append(EventFileDamage(path, pos, nxt - pos, reason))
    pos = nxt
  return records, damage


_checked: dict[tuple[str, int, int], tuple[list[tuple[int, int]], list[EventFileDamage]]] = {}


def _checked_file(path: str) -> tuple[list[tuple[int, int]], list[EventFileDamage]]:
  """:func:`_intact_records`, once per version of the file in this process."""
  st = os.stat(path)
  key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
  if key not in _checked:
    _checked[key] = _intact_records(path)
  return _checked[key]


# The sweep's one HParams experiment summary (launch.tensorboard_views), written into
# the first run's directory: an event file of the sweep, not of that run.
SWEEP_SUMMARY_FILE = "events.out.tfevents.0.sweep_hparams"


def _event_files(logdir: str) -> list[str]:
  """The event files directly in ``logdir`` (TensorBoard's rule), by name."""
  if not os.path.isdir(logdir):
    return []
  return sorted(os.path.join(logdir, f) for f in os.listdir(logdir)
                if io_wrapper.IsSummaryEventsFile(os.path.join(logdir, f)))


def event_files(logdir: str) -> list[str]:
  """The event files directly in ``logdir``, by name (those TensorBoard reads as a run)."""
  return _event_files(logdir)


def has_event_files(logdir: str) -> bool:
  """Whether ``logdir`` holds an event file the run wrote (a run's events are not
  missing; the sweep's summary, :data:`SWEEP_SUMMARY_FILE`, does not count)."""
  return any(os.path.basename(f) != SWEEP_SUMMARY_FILE for f in _event_files(logdir))


def event_file_damage(logdir: str) -> list[EventFileDamage]:
  """Every damaged span of the event files directly in ``logdir`` (empty: none)."""
  return [d for path in _event_files(logdir) for d in _checked_file(path)[1]]


def load(logdir: str, problems: list[EventFileDamage] | None = None) -> EventAccumulator:
  """An EventAccumulator over the event files directly in ``logdir``, fully loaded.

  A damaged file is read from a copy that holds only its intact records, so the records
  after the damage are loaded too; the damage is appended to ``problems`` (if given)
  and logged as a warning.
  """
  damage = event_file_damage(logdir)
  if not damage:
    acc = EventAccumulator(logdir, size_guidance=_KEEP_ALL)
    acc.Reload()
    return acc
  for d in damage:
    logging.warning("damaged event file: %s", d)
  if problems is not None:
    problems.extend(damage)
  with tempfile.TemporaryDirectory() as copy:
    for path in _event_files(logdir):
      target = os.path.join(copy, os.path.basename(path))
      records, bad = _checked_file(path)
      if not bad:
        shutil.copyfile(path, target)
        continue
      with open(path, "rb") as f:
        data = f.read()
      with open(target, "wb") as f:
        f.writelines(data[a:b] for a, b in records)
    acc = EventAccumulator(copy, size_guidance=_KEEP_ALL)
    acc.Reload()
  return acc


def _events(logdir: str, problems: list[EventFileDamage] | None = None, *,
            purge: bool = True) -> list[event_pb2.Event]:
  """The events of ``logdir``'s event files (by name), from their intact records, as
  TensorBoard's accumulator keeps them: a ``SessionLog.START`` at step s (a resumed
  run, :class:`~experiments.common.evidence.tensorboard_writer.MetricWriter`) drops every event
  read so far at a step >= s (with ``purge``; only in files of version 2, the
  version every current writer writes). Reading the records checked by :func:`_checked_file`
  directly skips the accumulator's second CRC pass and its per-event bookkeeping, which
  took most of a report rebuild. Damage is reported as by :func:`load`."""
  damage = event_file_damage(logdir)
  for d in damage:
    logging.warning("damaged event file: %s", d)
  if problems is not None:
    problems.extend(damage)
  events: list[event_pb2.Event] = []
  version = 0.0
  for path in _event_files(logdir):
    records, _ = _checked_file(path)
    with open(path, "rb") as f:
      data = f.read()
    for a, b in records:
      event = event_pb2.Event.FromString(data[a + _HEADER:b - _FOOTER])
      if event.HasField("file_version"):
        version = float(event.file_version.rsplit(":", 1)[-1])
      if purge and version >= 2 and event.HasField("session_log") and (
          event.session_log.status == event_pb2.SessionLog.START):
        events = [e for e in events if e.step < event.step]
      events.append(event)
  return events


def _by_step(pairs) -> list[tuple[int, float]]:
  """One value per step, the last written (a resumed run rewrites steps), by step."""
  return sorted({step: value for step, value in pairs}.items())


def read_scalars(logdir: str, problems: list[EventFileDamage] | None = None
                 ) -> dict[str, list[tuple[int, float]]]:
  """``tag -> [(step, value), ...]`` sorted by step, one value per step (the last one
  written: a resumed run rewrites the steps an interrupted one logged past its
  checkpoint, and marks them superseded), from scalars or scalar-tensors. Damaged
  event files: see :func:`load`."""
  scalars: dict[str, list[tuple[int, float]]] = {}
  tensors: dict[str, list[tuple[int, Any]]] = {}
  for event in _events(logdir, problems):
    for value in event.summary.value:
      kind = value.WhichOneof("value")
      if kind == "simple_value":
        scalars.setdefault(value.tag, []).append((event.step, float(value.simple_value)))
      elif kind == "tensor":
        tensors.setdefault(value.tag, []).append((event.step, value.tensor))
  out = {tag: _by_step(pairs) for tag, pairs in scalars.items()}
  # Writers that attach scalar plugin metadata (tensorboard.summary.Writer, tensorboardX)
  # write scalars as tensors.
  for tag, pairs in tensors.items():
    if tag.startswith("_hparams_/") or tag in out:
      continue
    values = [(step, tensor_util.make_ndarray(t)) for step, t in pairs]
    if all(np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.number)
           for _, v in values):  # not a layout or text
      out[tag] = _by_step((step, float(v)) for step, v in values)
  return out


def read_histograms(logdir: str) -> dict[str, list[tuple[int, Any]]]:
  """``tag -> [(step, HistogramValue), ...]`` sorted by step."""
  acc = load(logdir)
  return {tag: sorted(((e.step, e.histogram_value) for e in acc.Histograms(tag)),
                      key=lambda t: t[0])
          for tag in acc.Tags().get("histograms", [])}


def _hparams_content(logdir: str) -> dict[str, bytes]:
  """The HParams plugin's raw records in ``logdir`` by tag (empty if none); as
  TensorBoard's accumulator, the first metadata of a tag is the one kept."""
  content: dict[str, bytes] = {}
  seen: set[str] = set()
  for event in _events(logdir, purge=False):  # metadata outlives a purge
    for value in event.summary.value:
      if value.HasField("metadata") and value.tag not in seen:
        seen.add(value.tag)
        plugin = value.metadata.plugin_data
        if plugin.plugin_name == hparams_metadata.PLUGIN_NAME:
          content[value.tag] = plugin.content
  return content


def _parse(content: dict[str, bytes], tag: str):
  """The parsed HParams record ``tag``, or None if absent."""
  raw = content.get(tag)
  return None if raw is None else plugin_data_pb2.HParamsPluginData.FromString(raw)


def read_hparams_session(logdir: str) -> dict[str, Any] | None:
  """The HParams session in ``logdir``: ``{"trial_id", "hparams": {name: value}, "status"}``.

  ``status`` is the session-end status name (e.g. ``"STATUS_SUCCESS"``) or None.
  """
  content = _hparams_content(logdir)
  start = _parse(content, hparams_metadata.SESSION_START_INFO_TAG)
  if start is None:
    return None
  info = start.session_start_info
  hparams = {}
  for name, value in info.hparams.items():
    kind = value.WhichOneof("kind")
    hparams[name] = getattr(value, kind) if kind else None
  result = {"trial_id": info.group_name, "hparams": hparams, "status": None}
  end = _parse(content, hparams_metadata.SESSION_END_INFO_TAG)
  if end is not None:
    result["status"] = api_pb2.Status.Name(end.session_end_info.status)
  return result


def read_hparams_experiment(logdir: str) -> dict[str, Any] | None:
  """The HParams experiment summary in ``logdir``: hparam names/domains and metric tags."""
  data = _parse(_hparams_content(logdir), hparams_metadata.EXPERIMENT_TAG)
  if data is None:
    return None
  exp = data.experiment
  return {"hparams": {h.name: [v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
                               for v in h.domain_discrete.values] for h in exp.hparam_infos},
          "metrics": [m.name.tag for m in exp.metric_infos]}
