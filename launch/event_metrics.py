"""The metrics a sweep's report and HParams table read, in its runs' TensorBoard events.

    python -m launch.event_metrics --sweep_dir=experiments/fair_cast/report          # check
    python -m launch.event_metrics --sweep_dir=experiments/fair_cast/report --write  # mend

TensorBoard's HParams table takes a run's metric columns (the sweep's declared
``metrics``) from its events, the last scalar of each tag, not from ``results.jsonl``;
the claims read metrics too. A run's results row can hold such a metric while its
events lack it (runs written before ``finish_run`` logged every row metric: Fair Cast's
``export/lag_second_half`` was one), and its column is then empty in every row.
:func:`missing` lists them per run; ``--write`` adds each as a scalar at the run's final
step, in one new event file per run (``events.out.tfevents.<...>.row_metrics``), the
value taken from the run's results row unchanged. Row metrics that no column or claim
reads are left out (a sweep may have thinned its per-step tags, ``launch.thin_events``).
The report reads its numbers from ``results.jsonl``, so it rebuilds byte for byte.
``--write`` also brings the per-seed runs to today's HParams layout
(:func:`launch.tensorboard_views.mend_runs`: one experiment summary over every run, in
the first run's directory, none at the top of ``runs/``; integer hparams as integers)
when the sweep directory lacks it.
"""

from __future__ import annotations

import math
import os
import sys

from absl import app
from absl import flags
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from experiments.common.evidence.tensorboard_reader import (event_files, read_hparams_experiment,
                                                            read_scalars)
from experiments.common.harness import log_filters
from experiments.common.harness.config_flags import parse_flags
from experiments.common.harness.repo_paths import repo_relative
from experiments.common.sweeps.sweep_data import (read_manifest, read_sweep_info,
                                                  read_sweep_results, run_dir)
from launch import tensorboard_views

SUFFIX = ".row_metrics"
# The file's name carries no wall time: a rerun of --write on the same data writes the
# same bytes under the same name.
_WALL_TIME = 0.0


def _row_metrics(row: dict) -> dict[str, float]:
  metrics = row.get("metrics") if isinstance(row.get("metrics"), dict) else {}
  return {k: float(v) for k, v in metrics.items()
          if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def read_tags(sweep_dir: str) -> set[str]:
  """The metrics the sweep's HParams table and its claims read."""
  info = read_sweep_info(sweep_dir)
  return set(info.get("metrics", [])) | {c["metric"] for c in info.get("claims", [])}


def missing(sweep_dir: str) -> dict[str, dict[str, float]]:
  """``{run_name: {tag: value}}``: for each completed run, the finite results-row values
  of :func:`read_tags` metrics that its events lack."""
  tags = read_tags(sweep_dir)
  out = {}
  for name, row in read_sweep_results(sweep_dir).rows.items():
    logdir = run_dir(sweep_dir, name)
    have = set(read_scalars(logdir)) if os.path.isdir(logdir) else set()
    lacking = {k: v for k, v in _row_metrics(row).items() if k in tags and k not in have}
    if lacking:
      out[name] = lacking
  return out


def has_experiment(sweep_dir: str) -> bool:
  """Whether the per-seed runs hold one HParams experiment summary, in the first run's
  directory, and nothing at the top of ``runs/`` (:mod:`launch.tensorboard_views`)."""
  manifest = read_manifest(sweep_dir)
  first = run_dir(sweep_dir, manifest[0]["run_name"]) if manifest else ""
  return (not event_files(os.path.join(sweep_dir, "runs"))
          and read_hparams_experiment(first) is not None)


def write_missing(sweep_dir: str) -> dict[str, dict[str, float]]:
  """Adds :func:`missing`'s metrics to each run's events at its final step (and the
  experiment summary when absent); returns the metrics added."""
  if not has_experiment(sweep_dir):
    tensorboard_views.mend_runs(sweep_dir)
  rows = read_sweep_results(sweep_dir).rows
  lacking = missing(sweep_dir)
  for name, metrics in sorted(lacking.items()):
    logdir = run_dir(sweep_dir, name)
    step = int(rows[name].get("step", 0))
    writer = EventFileWriter(logdir, filename_suffix=SUFFIX)
    writer.add_event(Event(wall_time=_WALL_TIME, step=step, summary=Summary(value=[
        Summary.Value(tag=tag, simple_value=value) for tag, value in sorted(metrics.items())])))
    writer.close()
  return lacking


def define_flags() -> None:
  """Defines this script's flags (only when run as a script: importers keep their names)."""
  flags.DEFINE_string("sweep_dir", None, "The sweep directory.", required=True)
  flags.DEFINE_bool("write", False, "Add the missing metrics to the runs' events.")


def main(argv) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  log_filters.quiet_library_info()
  sweep_dir = flags.FLAGS.sweep_dir
  read_manifest(sweep_dir)  # a clear error when this is no sweep directory
  had_experiment = has_experiment(sweep_dir)
  lacking = write_missing(sweep_dir) if flags.FLAGS.write else missing(sweep_dir)
  if not had_experiment:
    print(f"{repo_relative(sweep_dir)}/runs: the HParams experiment summary "
          f"{'written' if flags.FLAGS.write else 'is missing'}")
  tags = sorted({t for m in lacking.values() for t in m})
  verb = "added to" if flags.FLAGS.write else "missing from"
  print(f"{repo_relative(sweep_dir)}: {len(tags)} metric(s) of the HParams table or the "
        f"claims {verb} the events "
        f"of {len(lacking)} run(s){': ' + ', '.join(tags) if tags else ''}")
  return 1 if (lacking or not had_experiment) and not flags.FLAGS.write else 0


if __name__ == "__main__":
  define_flags()
  app.run(lambda argv: sys.exit(main(argv)), flags_parser=parse_flags)
