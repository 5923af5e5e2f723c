"""Thins a sweep's committed TensorBoard events to the tags its report reads.

    python -m launch.thin_events --sweep_dir=experiments/stale_sampler/report \
        --keep=train/reward,eval/greedy_accuracy --keep_prefix=accuracy/ --every=4

An RL run logs ~20 scalars at every update (215 KB of events for 384 updates), more
than the repository's evidence budget holds for a 60-run sweep. This rewrites each
run's event files in place, keeping every event that is not a summary (file version,
restart markers), every HParams record, and each summary value whose tag is in
``--keep`` or starts with a ``--keep_prefix`` and whose step is a multiple of
``--every``; values are copied byte for byte (same step, wall time and proto). Thin
before building the report (``launch.report`` rebuilds it from what is committed, and
the rebuild test checks that), and say in its findings what was thinned.
``results.jsonl`` keeps every run's final metrics whatever is dropped. A ``--keep``
tag that would lose every value (all logged off the kept steps, e.g. at update + 1) is
refused before any file is rewritten.
"""

from __future__ import annotations

import glob
import os
from typing import Iterable

from absl import app
from absl import flags
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.summary.writer.record_writer import RecordWriter

from experiments.common.harness.config_flags import parse_flags

_HPARAMS_PREFIX = "_hparams_/"


def thin_event_file(path: str, keep: Iterable[str], keep_prefixes: Iterable[str] = (),
                    every: int = 1) -> tuple[int, int]:
  """Rewrites the event file ``path`` keeping only what the module docstring says;
  returns (bytes before, bytes after)."""
  if every < 1:
    raise ValueError(f"every must be >= 1, got {every}")
  keep, prefixes = set(keep), tuple(keep_prefixes)
  kept = lambda tag, step: tag.startswith(_HPARAMS_PREFIX) or (
      (tag in keep or tag.startswith(prefixes)) and step % every == 0)
  before = os.path.getsize(path)
  tmp = f"{path}.thin.tmp"
  with open(tmp, "wb") as f:
    writer = RecordWriter(f)
    for record in RawEventFileLoader(path).Load():
      event = Event.FromString(record)
      if event.HasField("summary"):
        values = [v for v in event.summary.value if kept(v.tag, event.step)]
        if not values:
          continue
        if len(values) != len(event.summary.value):
          del event.summary.value[:]
          event.summary.value.extend(values)
          record = event.SerializeToString()
      writer.write(record)
    writer.flush()
  os.replace(tmp, path)
  return before, os.path.getsize(path)


def _tags_emptied(paths: Iterable[str], keep: Iterable[str], every: int) -> list[str]:
  """The ``keep`` tags that have values in ``paths`` but none at a multiple of
  ``every`` (thinning would drop them entirely)."""
  seen: set[str] = set()
  kept: set[str] = set()
  keep = set(keep)
  for path in paths:
    for record in RawEventFileLoader(path).Load():
      event = Event.FromString(record)
      for v in event.summary.value:
        if v.tag in keep:
          seen.add(v.tag)
          if event.step % every == 0:
            kept.add(v.tag)
  return sorted(seen - kept)


def thin_sweep(sweep_dir: str, keep: Iterable[str], keep_prefixes: Iterable[str] = (),
               every: int = 1) -> tuple[int, int]:
  """:func:`thin_event_file` on every event file under ``sweep_dir``; total bytes
  (before, after)."""
  keep, keep_prefixes = list(keep), list(keep_prefixes)
  if not keep and not keep_prefixes:
    raise ValueError("nothing to keep: name tags (--keep) or prefixes (--keep_prefix)")
  paths = [p for p in sorted(glob.glob(os.path.join(sweep_dir, "**",
                                                    "events.out.tfevents.*"),
                                       recursive=True)) if not p.endswith(".tmp")]
  lost = _tags_emptied(paths, keep, every)
  if lost:  # checked before any file is rewritten: thinning is in place
    raise ValueError(f"--every={every} would drop every value of the kept tags "
                     f"{lost} (logged at steps that are not multiples of {every}); "
                     "nothing was rewritten")
  total_before = total_after = 0
  for path in paths:
    before, after = thin_event_file(path, keep, keep_prefixes, every)
    total_before, total_after = total_before + before, total_after + after
  return total_before, total_after


def define_flags() -> None:
  """Defines this script's flags (only when run as a script: importers keep their names)."""
  flags.DEFINE_string("sweep_dir", None, "The sweep directory to thin.")
  flags.DEFINE_list("keep", [], "Scalar tags to keep.")
  flags.DEFINE_list("keep_prefix", [], "Keep every tag with one of these prefixes.")
  flags.DEFINE_integer("every", 1, "Keep values only at steps that are multiples of this.",
                       lower_bound=1)


def main(argv):
  del argv
  if not flags.FLAGS.sweep_dir or not os.path.isdir(flags.FLAGS.sweep_dir):
    raise app.UsageError(f"--sweep_dir must be a directory, got {flags.FLAGS.sweep_dir!r}")
  before, after = thin_sweep(flags.FLAGS.sweep_dir, flags.FLAGS.keep, flags.FLAGS.keep_prefix,
                             flags.FLAGS.every)
  print(f"events under {flags.FLAGS.sweep_dir}: {before} -> {after} bytes")


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=parse_flags)
