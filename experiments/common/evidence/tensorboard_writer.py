"""TensorBoard event writing without TensorFlow: scalars, histograms, HParams.

``flax.metrics.tensorboard`` and ``tensorboard.plugins.hparams.api`` import TensorFlow, so
this writes the protos directly through tensorboard's own ``EventFileWriter``. Scalars are
bare ``simple_value`` summaries (TensorBoard files them under scalars; see the reader).

HParams layout (TensorBoard's hparams plugin reads ONE experiment summary per logdir
tree, from the first run that holds one): every run writes its own session
(:meth:`MetricWriter.write_hparams`) into its run directory; a sweep writes the
experiment summary (domains and metric tags) once, with :func:`write_hparams_experiment`,
into one of its runs' directories (``launch.tensorboard_views``): a file at the top of
the logdir would show as a run of its own, named ``.``.

Integer hparams are written as strings (:func:`shown_hparam`): the HParams table shows a
number with 5 significant digits (``toPrecision(5)`` in its frontend), so a seed 201
reads ``201.00`` and a stream 95680792 ``9.5681e+7``; a string shows as written.
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping, Sequence

import numpy as np
from absl import logging
from google.protobuf import struct_pb2
from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.plugins.hparams import api_pb2 as hparams_api_pb2
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.hparams import plugin_data_pb2 as hparams_plugin_data_pb2
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from experiments.common.evidence.tensorboard_reader import event_file_damage

HParamValue = bool | int | float | str


def histogram_proto(values: np.ndarray, bins: int = 30) -> HistogramProto:
  """A TensorBoard histogram of ``values`` (any shape, flattened, as float64)."""
  x = np.asarray(values, dtype=np.float64).ravel()
  x = x[np.isfinite(x)]
  if x.size == 0:
    return HistogramProto(min=0.0, max=0.0, num=0, sum=0.0, sum_squares=0.0,
                          bucket_limit=[0.0], bucket=[0.0])
  lo, hi = float(x.min()), float(x.max())
  if lo == hi:  # one value: TensorBoard needs a bucket of non-zero width
    lo, hi = lo - 0.5, hi + 0.5
  counts, edges = np.histogram(x, bins=bins, range=(lo, hi))
  return HistogramProto(min=float(x.min()), max=float(x.max()), num=float(x.size),
                        sum=float(x.sum()), sum_squares=float(np.dot(x, x)),
                        bucket_limit=edges[1:].tolist(), bucket=counts.astype(float).tolist())


class MetricWriter:
  """Writes one run's events to ``logdir``; a disabled writer (non-zero process) does nothing."""

  def __init__(self, logdir: str, *, enabled: bool = True):
    if enabled:
      # A resumed run adds a file beside its earlier ones: say if one of those is
      # damaged, as TensorBoard will stop reading it at the damage without a word.
      for damage in event_file_damage(logdir):
        logging.warning("damaged event file in this run's directory: %s. TensorBoard stops "
                        "reading that file there; the sweep report reads past the damage "
                        "and names it.", damage)
    self._writer = EventFileWriter(logdir) if enabled else None
    self.logdir = logdir
    self.scalar_tags: set[str] = set()  # tags this writer has logged a scalar of

  @property
  def enabled(self) -> bool:
    return self._writer is not None

  def _add(self, step: int, values: list[Summary.Value]) -> None:
    if self._writer is not None and values:
      self._writer.add_event(Event(wall_time=time.time(), step=int(step),
                                   summary=Summary(value=values)))

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    """One event holding ``tag -> float`` scalars at ``step``."""
    self.scalar_tags.update(scalars)
    self._add(step, [Summary.Value(tag=tag, simple_value=float(v)) for tag, v in scalars.items()])

  def write_histograms(self, step: int, arrays: Mapping[str, np.ndarray], bins: int = 30
                       ) -> None:
    """One event holding a histogram per ``tag -> array`` at ``step``."""
    self._add(step, [Summary.Value(tag=tag, histo=histogram_proto(np.asarray(a), bins))
                     for tag, a in arrays.items()])

  def mark_restart(self, step: int) -> None:
    """Marks a resumed run: events an earlier process logged at ``step`` or later are
    superseded (TensorBoard's restart convention, a ``SessionLog.START`` event; its
    readers purge them)."""
    if self._writer is not None:
      self._writer.add_event(Event(wall_time=time.time(), step=int(step),
                                   session_log=SessionLog(status=SessionLog.START)))

  def write_hparams(self, hparams: Mapping[str, HParamValue], trial_id: str,
                    start_time_secs: float | None = None) -> None:
    """This run's HParams session: its hparam values, named ``trial_id``."""
    if self._writer is None:
      return
    _check_hparams(hparams)
    summary = hparams_summary.hparams_pb(shown_hparams(hparams), trial_id=trial_id,
                                         start_time_secs=start_time_secs)
    self._writer.add_event(Event(wall_time=time.time(), step=0, summary=summary))

  def write_hparams_end(self, step: int, completed: bool,
                        end_time_secs: float | None = None) -> None:
    """Records this run's HParams session end: success, or still running for a stopped run.

    A run stopped early (preemption, ``--stop_at_step``) is resumable, so it is marked
    ``STATUS_RUNNING`` (the hparams API has no "paused"); its resumed run overwrites it.

    ``summary_v2`` has no TF-free session-end writer, so this builds the same proto that
    ``tensorboard.plugins.hparams.summary.session_end_pb`` would.
    """
    if self._writer is None:
      return
    status = (hparams_api_pb2.Status.STATUS_SUCCESS if completed
              else hparams_api_pb2.Status.STATUS_RUNNING)
    info = hparams_plugin_data_pb2.HParamsPluginData(
        session_end_info=hparams_plugin_data_pb2.SessionEndInfo(
            status=status, end_time_secs=time.time() if end_time_secs is None
            else end_time_secs))
    value = Summary.Value(tag=hparams_metadata.SESSION_END_INFO_TAG,
                          metadata=hparams_metadata.create_summary_metadata(info),
                          tensor=hparams_metadata.NULL_TENSOR)
    # At the run's last step, not 0: an out-of-order step makes readers purge that tag.
    self._writer.add_event(Event(wall_time=time.time(), step=int(step),
                                 summary=Summary(value=[value])))

  def flush(self) -> None:
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._writer = None


def _check_hparams(hparams: Mapping[str, Any]) -> None:
  for name, value in hparams.items():
    if not isinstance(value, (bool, int, float, str)):
      raise TypeError(f"hparam {name!r} must be bool/int/float/str, got {type(value).__name__}")


def shown_hparam(value: HParamValue) -> HParamValue:
  """``value`` as the HParams table should show it: an int as its digits (a string)."""
  return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def shown_hparams(hparams: Mapping[str, HParamValue]) -> dict[str, HParamValue]:
  """:func:`shown_hparam` of every value."""
  return {name: shown_hparam(v) for name, v in hparams.items()}


def hparams_experiment_summary(hparams: Mapping[str, Sequence[HParamValue]],
                               metrics: Sequence[str]) -> Summary:
  """The HParams experiment summary: ``hparams`` name -> the values swept (a discrete
  domain each, in the order given; ints shown as strings), ``metrics`` the scalar tags
  the table shows (a session's value is the last one logged)."""
  hp_list, orders = [], {}
  for name, values in hparams.items():
    values = list(dict.fromkeys(values))  # unique, in order
    for v in values:
      _check_hparams({name: v})
    # Discrete domains must be one type; ints are strings (shown_hparam), and a domain
    # mixing ints and floats is all floats.
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
      if any(isinstance(v, float) for v in values):
        values = [float(v) for v in values]
    numbers = [v for v in values if not isinstance(v, (bool, str))]
    if len(numbers) == len(values):
      values = sorted(values)
    orders[name] = list(dict.fromkeys(shown_hparam(v) for v in values))
    hp_list.append(hparams_summary.HParam(name, hparams_summary.Discrete(orders[name])))
  summary = hparams_summary.hparams_config_pb(
      hparams=hp_list, metrics=[hparams_summary.Metric(tag) for tag in metrics],
      time_created_secs=FIXED_WALL_TIME)
  # Discrete() sorts its values, which puts seed "10" before "2": the filter lists them
  # in the domain's order, so numbers keep numeric order and strings the order given.
  value = summary.value[0]
  data = hparams_plugin_data_pb2.HParamsPluginData.FromString(
      value.metadata.plugin_data.content)
  for info in data.experiment.hparam_infos:
    del info.domain_discrete.values[:]
    for v in orders[info.name]:
      info.domain_discrete.values.add().MergeFrom(_struct_value(v))
  value.metadata.plugin_data.content = data.SerializeToString(deterministic=True)
  return summary


def _struct_value(v: HParamValue) -> struct_pb2.Value:
  if isinstance(v, bool):
    return struct_pb2.Value(bool_value=v)
  if isinstance(v, str):
    return struct_pb2.Value(string_value=v)
  return struct_pb2.Value(number_value=float(v))


def write_hparams_experiment(logdir: str, hparams: Mapping[str, Sequence[HParamValue]],
                             metrics: Sequence[str]) -> None:
  """Writes :func:`hparams_experiment_summary` into ``logdir``, in a file of its own."""
  writer = EventFileWriter(logdir)
  writer.add_event(Event(wall_time=time.time(), step=0,
                         summary=hparams_experiment_summary(hparams, metrics)))
  writer.close()


# Generated views carry this wall time (and no time in their file names), so a rebuild
# from the same data writes the same bytes.
FIXED_WALL_TIME = 0.0


def write_event_file(path: str, events: Sequence[Event]) -> None:
  """Writes ``events`` to the event file ``path`` (replacing it), after the file-version
  record TensorBoard expects first; deterministic bytes (no clock is read)."""
  tmp = f"{path}.tmp"
  with open(tmp, "wb") as f:
    writer = RecordWriter(f)
    writer.write(Event(wall_time=FIXED_WALL_TIME, file_version="brain.Event:2")
                 .SerializeToString())
    for event in events:
      writer.write(event.SerializeToString(deterministic=True))
    writer.flush()
  os.replace(tmp, path)
