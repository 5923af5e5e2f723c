"""A sweep's two TensorBoard views: its per-seed runs and the arm view.

    python -m launch.tensorboard_views --sweep_dir=experiments/fair_cast/report_confirm

**Per-seed runs** (``<sweep_dir>/runs/<run_name>/``, written by the runs). The HParams
experiment summary (the table's columns and the values each filter offers) covers every
run of the manifest and is one file, ``EXPERIMENT_FILE``, in the first run's directory.
TensorBoard's HParams plugin takes the summary from the first run that holds one
(``backend_context._find_experiment_tag``); a summary file at the top of ``runs/`` made
a run of its own, named ``.``, and a summary per look of a sequential sweep offered only
the first look's seeds. :func:`write_experiment` removes such files.

**Arm view** (``<sweep_dir>/arms/<arm>/``, :func:`write_arm_view`): one run per arm
holding, for every curve and metric the report reads, the mean over the arm's
completed evaluation runs at each step they all logged, under the same tag as the
per-seed runs (a chart of ``eval/loss`` compares the arms' means; at most ``MAX_POINTS``
points per curve, evenly spaced, the last step always kept), and the 95%
t-interval over those runs as ``<tag>/ci95_lo`` and ``<tag>/ci95_hi`` (an arm with one
run has none): one run per arm keeps a sweep's view within the 40 runs TensorBoard's
Scalars dashboard selects, and tags beside the mean are what the Custom Scalars
dashboard's margin charts draw as a shaded band (its layout is written too). Each arm is
an HParams session (its swept config fields, its number of runs; the declared metrics,
their bounds as further columns). ``launch.report`` rebuilds the view with the report,
from the per-seed events alone; its bytes are a function of them (fixed wall times and
file names).
"""

from __future__ import annotations

import collections
import math
import os
import shutil
import sys
from typing import Any, Mapping, Sequence

from absl import app, flags
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import metadata as layout_metadata
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.plugins.hparams import api_pb2
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util import tensor_util

from experiments.common.evidence.stats import mean_interval
from experiments.common.evidence.tensorboard_reader import (SWEEP_SUMMARY_FILE, event_files,
                                                            read_hparams_experiment, read_scalars)
from experiments.common.evidence.tensorboard_writer import (FIXED_WALL_TIME, HParamValue,
                                                            hparams_experiment_summary,
                                                            shown_hparams, write_event_file)
from experiments.common.harness import log_filters
from experiments.common.harness.config_flags import parse_flags
from experiments.common.sweeps.sweep_data import (config_value, read_manifest, read_sweep_info,
                                                  read_sweep_results, run_dir)
from launch.manifest import swept_values

EXPERIMENT_FILE = SWEEP_SUMMARY_FILE
ARMS_DIR = "arms"
ARM_FILE = "events.out.tfevents.0.arm_view"
LOWER, UPPER = "/ci95_lo", "/ci95_hi"
CONFIDENCE = 0.95
# Points per curve in the arm view: a chart TensorBoard draws shows no more detail, and
# ~20 sweeps' views stay within the repository's evidence budget.
MAX_POINTS = 50
Curve = list[tuple[int, float]]


def remove_root_summaries(logdir: str) -> list[str]:
  """Removes the event files directly in ``logdir`` (the experiment summaries earlier
  sweeps wrote there, the ``.`` run); returns their names."""
  names = [os.path.basename(p) for p in event_files(logdir)]
  for name in names:
    os.remove(os.path.join(logdir, name))
  return names


def write_experiment(sweep_dir: str, run_names: Sequence[str],
                     hparams: Mapping[str, Sequence[HParamValue]],
                     metrics: Sequence[str]) -> str:
  """The per-seed runs' one HParams experiment summary (see the module docstring), in
  ``runs/<run_names[0]>/``, replacing any earlier one; returns its path."""
  runs = os.path.join(sweep_dir, "runs")
  os.makedirs(runs, exist_ok=True)
  remove_root_summaries(runs)
  directory = run_dir(sweep_dir, run_names[0])
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, EXPERIMENT_FILE)
  write_event_file(path, [Event(wall_time=FIXED_WALL_TIME, step=0, summary=_deterministic(
      hparams_experiment_summary(hparams, metrics)))])
  return path


def read_experiment(sweep_dir: str) -> dict[str, Any] | None:
  """The per-seed runs' HParams experiment summary (in the manifest's first run), as
  :func:`experiments.common.evidence.tensorboard_reader.read_hparams_experiment` reads it."""
  manifest = read_manifest(sweep_dir)
  return read_hparams_experiment(run_dir(sweep_dir, manifest[0]["run_name"])) if manifest \
      else None


def sweep_hparams(sweep_dir: str) -> dict[str, list[Any]]:
  """The fields the manifest's configs vary (every run's value), else the seeds."""
  info = read_sweep_info(sweep_dir)
  manifest = read_manifest(sweep_dir)
  return (swept_values([m["config"] for m in manifest])
          or {info["seed_field"]: [m["seed"] for m in manifest]})


def mend_runs(sweep_dir: str) -> None:
  """Brings a committed sweep's per-seed runs to today's layout: one experiment summary
  over every run (:func:`write_experiment`), integer hparams shown as integers in every
  session (:func:`stringify_session`)."""
  manifest = read_manifest(sweep_dir)
  write_experiment(sweep_dir, [m["run_name"] for m in manifest], sweep_hparams(sweep_dir),
                   read_sweep_info(sweep_dir)["metrics"])
  for m in manifest:
    ints = {k for k, v in m["config"].items() if isinstance(v, int) and not isinstance(v, bool)}
    for path in event_files(run_dir(sweep_dir, m["run_name"])):
      stringify_session(path, ints)


def stringify_session(path: str, names: set[str]) -> bool:
  """Rewrites the HParams session start in the event file ``path`` so that the hparams
  ``names`` (integers) hold their digits as strings (written before the writer showed
  ints as strings); every other record is copied byte for byte. Returns whether the
  file changed."""
  records, changed = [], False
  for record in RawEventFileLoader(path).Load():
    event = Event.FromString(record)
    for value in event.summary.value:
      if value.tag != hparams_metadata.SESSION_START_INFO_TAG:
        continue
      data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
      for name, v in data.session_start_info.hparams.items():
        if name in names and v.WhichOneof("kind") == "number_value":
          v.string_value = str(int(v.number_value))
          changed = True
      value.metadata.plugin_data.content = data.SerializeToString(deterministic=True)
      record = event.SerializeToString()
    records.append(record)
  if changed:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
      writer = RecordWriter(f)
      for record in records:
        writer.write(record)
      writer.flush()
    os.replace(tmp, path)
  return changed


def view_tags(info: Mapping[str, Any]) -> list[str]:
  """The tags the report reads: its curves, its metrics, its claims' metrics."""
  tags = [*info.get("curves", []), *info.get("metrics", []),
          *(c["metric"] for c in info.get("claims", []))]
  return list(dict.fromkeys(tags))


def kept_steps(steps: Sequence[int], points: int = MAX_POINTS) -> list[int]:
  """At most ``points`` of the sorted ``steps``, evenly spaced, first and last kept."""
  if len(steps) <= points:
    return list(steps)
  return [steps[round(i * (len(steps) - 1) / (points - 1))] for i in range(points)]


def arm_curves(curves: Sequence[Curve]) -> list[tuple[int, float, float, float, int]]:
  """``[(step, mean, lo, hi, n)]`` over ``curves`` (one per run) at the steps every one
  of them logged (:func:`kept_steps` of them); ``lo``/``hi`` the 95% t-interval (nan
  for one run)."""
  by_step = [dict(c) for c in curves if c]
  if not by_step:
    return []
  out = []
  for step in kept_steps(sorted(set.intersection(*[set(d) for d in by_step]))):
    i = mean_interval([d[step] for d in by_step], CONFIDENCE)
    out.append((step, i.mean, i.ci_low, i.ci_high, i.n))
  return out


def _scalar(tag: str, value: float) -> Summary.Value:
  return Summary.Value(tag=tag, simple_value=value)


def _layout(curves: Sequence[str], metrics: Sequence[str]) -> Summary.Value:
  """The Custom Scalars layout: a margin chart (mean, shaded band) per tag, the curves
  first, then the metrics that are no curve (an empty category is left out)."""
  def chart(tag: str) -> layout_pb2.Chart:
    return layout_pb2.Chart(title=tag, margin=layout_pb2.MarginChartContent(series=[
        layout_pb2.MarginChartContent.Series(value=tag, lower=tag + LOWER,
                                             upper=tag + UPPER)]))
  others = [t for t in metrics if t not in curves]
  layout = layout_pb2.Layout(category=[
      layout_pb2.Category(title=title, chart=[chart(t) for t in tags])
      for title, tags in (("curves: mean over seeds, 95% band", curves),
                          ("metrics: mean over seeds, 95% band", others)) if tags])
  meta = SummaryMetadata.FromString(layout_metadata.create_summary_metadata()
                                    .SerializeToString())
  return Summary.Value(tag=layout_metadata.CONFIG_SUMMARY_TAG, metadata=meta,
                       tensor=tensor_util.make_tensor_proto(layout.SerializeToString()))


def _arm_hparams(info: Mapping[str, Any], arm: str, n: int) -> dict[str, HParamValue]:
  fields = sorted({k for a in info["arms"] for k in a["overrides"]}
                  | set(info.get("overrides") or {}))
  values = {f: config_value(info, arm, f) for f in fields}
  return {"arm": arm, "runs": n, **{f: v for f, v in values.items()
                                    if isinstance(v, (bool, int, float, str))}}


def _arm_events(tags: Sequence[str], curves: Mapping[str, Sequence[Curve]]) -> list[Event]:
  by_step: dict[int, list[Summary.Value]] = collections.defaultdict(list)
  for tag in tags:
    for step, mean, lo, hi, n in arm_curves(curves.get(tag, [])):
      by_step[step].append(_scalar(tag, mean))
      if n >= 2 and math.isfinite(lo):
        by_step[step] += [_scalar(tag + LOWER, lo), _scalar(tag + UPPER, hi)]
  return [Event(wall_time=FIXED_WALL_TIME, step=step, summary=Summary(value=values))
          for step, values in sorted(by_step.items())]


def evaluation_runs(sweep_dir: str) -> dict[str, list[str]]:
  """``arm -> [run_name]``: the completed (results row) non-calibration runs, in
  manifest order; every declared arm has an entry."""
  info = read_sweep_info(sweep_dir)
  rows = read_sweep_results(sweep_dir).rows
  out: dict[str, list[str]] = {a["name"]: [] for a in info["arms"]}
  for m in read_manifest(sweep_dir):
    if not m.get("calibration") and m["run_name"] in rows:
      out[m["arm"]].append(m["run_name"])
  return out


def write_arm_view(sweep_dir: str,
                   scalars_by_run: Mapping[str, Mapping[str, Curve]] | None = None) -> str:
  """Writes the arm view (see the module docstring) to ``<sweep_dir>/arms``, replacing
  it; returns that directory. ``scalars_by_run``: run name -> its scalars where the
  caller has read them already (others are read here)."""
  info = read_sweep_info(sweep_dir)
  tags = view_tags(info)
  metrics = [t for t in tags if t in set(info["metrics"])
             | {c["metric"] for c in info.get("claims", [])}]
  root = os.path.join(sweep_dir, ARMS_DIR)
  if os.path.isdir(root):
    shutil.rmtree(root)
  runs = {a: names for a, names in evaluation_runs(sweep_dir).items() if names}
  columns = [m + suffix for m in info["metrics"] for suffix in ("", LOWER, UPPER)]
  sessions = {a: _arm_hparams(info, a, len(names)) for a, names in runs.items()}
  domains: dict[str, list[HParamValue]] = collections.defaultdict(list)
  for hp in sessions.values():
    for k, v in hp.items():
      domains[k].append(v)
  for i, (arm, names) in enumerate(runs.items()):
    scalars = [scalars_by_run[n] if scalars_by_run and n in scalars_by_run
               else read_scalars(run_dir(sweep_dir, n)) for n in names]
    curves = {t: [s[t] for s in scalars if t in s] for t in tags}
    head = []
    if i == 0:  # the view's experiment summary and layout live in its first run
      head.append(Summary(value=[*hparams_experiment_summary(domains, columns).value,
                                 _layout(info.get("curves", []), metrics)]))
    head.append(hparams_summary.hparams_pb(shown_hparams(sessions[arm]), trial_id=arm,
                                           start_time_secs=FIXED_WALL_TIME))
    head = [_deterministic(h) for h in head]
    body = _arm_events(tags, curves)
    last = body[-1].step if body else 0
    events = [Event(wall_time=FIXED_WALL_TIME, step=0, summary=s) for s in head]
    events += body + [Event(wall_time=FIXED_WALL_TIME, step=last,
                            summary=_session_end())]
    os.makedirs(os.path.join(root, arm))
    write_event_file(os.path.join(root, arm, ARM_FILE), events)
  return root


def _deterministic(summary: Summary) -> Summary:
  """``summary`` with its HParams records serialized in a fixed order (a session's
  hparams are a protobuf map, which serializes in an order that varies by process)."""
  for value in summary.value:
    plugin = value.metadata.plugin_data
    if plugin.plugin_name == hparams_metadata.PLUGIN_NAME:
      plugin.content = plugin_data_pb2.HParamsPluginData.FromString(
          plugin.content).SerializeToString(deterministic=True)
  return summary


def _session_end() -> Summary:
  info = plugin_data_pb2.HParamsPluginData(session_end_info=plugin_data_pb2.SessionEndInfo(
      status=api_pb2.Status.STATUS_SUCCESS, end_time_secs=FIXED_WALL_TIME))
  return Summary(value=[Summary.Value(tag=hparams_metadata.SESSION_END_INFO_TAG,
                                      metadata=hparams_metadata.create_summary_metadata(info),
                                      tensor=hparams_metadata.NULL_TENSOR)])


def define_flags() -> None:
  """Defines this script's flags (only when run as a script)."""
  flags.DEFINE_string("sweep_dir", None, "The sweep directory.", required=True)


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  log_filters.quiet_library_info()
  sweep_dir = flags.FLAGS.sweep_dir
  mend_runs(sweep_dir)
  print(write_arm_view(sweep_dir))
  return 0


if __name__ == "__main__":
  define_flags()
  app.run(lambda argv: sys.exit(main(argv)), flags_parser=parse_flags)
