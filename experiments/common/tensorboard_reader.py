"""Reads a run's TensorBoard events back (for tests and the sweep report)."""

from __future__ import annotations

from typing import Any

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import api_pb2
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.util import tensor_util

# 0 keeps every event: the defaults reservoir-sample (e.g. 1 histogram per tag).
_KEEP_ALL = {"scalars": 0, "tensors": 0, "histograms": 0, "images": 0,
             "compressedHistograms": 0}


def load(logdir: str) -> EventAccumulator:
  """An EventAccumulator over the event files directly in ``logdir``, fully loaded."""
  acc = EventAccumulator(logdir, size_guidance=_KEEP_ALL)
  acc.Reload()
  return acc


def _by_step(pairs) -> list[tuple[int, float]]:
  """One value per step, the last written (a resumed run rewrites steps), by step."""
  return sorted({step: value for step, value in pairs}.items())


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
  """``tag -> [(step, value), ...]`` sorted by step, one value per step (the last one
  written: a resumed run rewrites the steps an interrupted one logged past its
  checkpoint, and marks them superseded), from scalars or scalar-tensors."""
  acc = load(logdir)
  tags = acc.Tags()
  out: dict[str, list[tuple[int, float]]] = {}
  for tag in tags.get("scalars", []):
    out[tag] = _by_step((e.step, float(e.value)) for e in acc.Scalars(tag))
  # Writers that attach scalar plugin metadata (tensorboard.summary.Writer, tensorboardX)
  # land under tensors in the classic accumulator.
  for tag in tags.get("tensors", []):
    if tag.startswith("_hparams_/") or tag in out:
      continue
    events = acc.Tensors(tag)
    values = [(e.step, tensor_util.make_ndarray(e.tensor_proto)) for e in events]
    if all(np.ndim(v) == 0 for _, v in values):
      out[tag] = _by_step((s, float(v)) for s, v in values)
  return out


def read_histograms(logdir: str) -> dict[str, list[tuple[int, Any]]]:
  """``tag -> [(step, HistogramValue), ...]`` sorted by step."""
  acc = load(logdir)
  return {tag: sorted(((e.step, e.histogram_value) for e in acc.Histograms(tag)),
                      key=lambda t: t[0])
          for tag in acc.Tags().get("histograms", [])}


def _hparams_content(logdir: str) -> dict[str, bytes]:
  """The HParams plugin's raw records in ``logdir`` by tag (empty if none)."""
  try:
    return load(logdir).PluginTagToContent(hparams_metadata.PLUGIN_NAME)
  except KeyError:
    return {}


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
