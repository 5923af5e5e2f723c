"""Closing a run: its results row (one JSON row per finished run, appended to a JSONL
file: :mod:`experiments.common.evidence.results_file`) and its completion mark.

A row is written once, by the process that completes the run (a resumed run's row
carries the whole run's metrics: the loop restores them from its checkpoint): the run
directory is first marked completed (:func:`experiments.common.harness.workdir.mark_completed`,
which keeps a copy of the row), then the row is appended unless the file already holds
it, so neither a rerun nor a ``--resume`` of it trains again, and a rerun that finds
the row missing from the results file or damaged there (a kill or a full disk between
the mark and the row) appends the kept copy (:func:`experiments.common.harness.workdir.claim`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any

import jax

from experiments.common.harness import run_metadata
from experiments.common.harness import workdir as workdir_lib
from experiments.common.harness.repo_paths import repo_relative
# Re-exported: the results table's readers and writers import them from here.
from experiments.common.evidence.results_file import (  # pylint: disable=unused-import
    append_result, append_result_unless_present, jsonable, read_results)
from experiments.common.harness.train_loop import train_tag


def write_benchmark(path: str, result: dict[str, Any], table: str) -> None:
  """A benchmark script's ending: prints ``table``, and writes ``result`` as JSON to
  ``path`` (indented, sorted keys; nowhere when ``path`` is empty), with the git state
  it ran from under ``"git"`` (commit, and whether tracked files differed from it)."""
  print(table)
  if path:
    result = {**result, "git": result.get("git") or run_metadata.git_state()}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
      json.dump(result, f, indent=1, sort_keys=True)
      f.write("\n")
    print(f"wrote {path}")


def benchmark_provenance(bench: dict[str, Any]) -> str:
  """How a benchmark JSON records its code: ``commit `abc1234`, clean tree`` (or
  *dirty*), or what it lacks (JSONs written before :func:`write_benchmark` recorded the
  git state have at most a ``git_commit``, and no dirty flag)."""
  git = bench.get("git") or {}
  commit = git.get("commit") or bench.get("git_commit")
  if not commit or commit == "unknown":
    return "commit and dirty flag not recorded"
  dirty = git.get("dirty")
  state = ("dirty flag not recorded" if dirty is None else
           "**dirty**: tracked files differed from it" if dirty else "clean tree")
  return f"commit `{commit[:7]}`, {state}"


def finish_run(writer: Any, results_file: str, summary: dict[str, Any], *,
               completed: bool, step: int, workdir: str | None = None) -> None:
  """Closes a run: for a completed run, its summary scalars, the HParams end record,
  one results row and (with ``workdir``) the completion mark.

  The summary metrics this process's writer has not logged (``reward/mean_over_training``,
  ``cost/total_s``, ``export/lag_second_half``, ...) are written as scalars at the final
  step, so TensorBoard's HParams table shows every metric of the results row as a
  column and the events hold every metric a report's claims read. Only a finished run
  closes its HParams session: readers keep the first end record of a tag, so a stopped
  run that is later resumed must not have written one (and it writes no results row
  either).
  """
  if completed:
    final = {k: float(v) for k, v in summary.get("metrics", {}).items()
             if k not in writer.scalar_tags
             and isinstance(v, (int, float)) and math.isfinite(v)}
    writer.write_scalars(step, final)
    writer.write_hparams_end(step, completed=True)
    # The mark (with a copy of the row) first, then the row unless the file holds it:
    # a run killed, or out of disk, between the two is finished by its rerun, which
    # finds the mark and puts the kept row back (workdir.claim), so every kill point
    # leaves one row. The other order left a row without a mark, and a --resume then
    # appended a second one.
    if workdir is not None:
      workdir_lib.mark_completed(workdir, step=step, results_file=repo_relative(results_file),
                                 run_name=summary.get("run_name", ""), row=jsonable(summary))
    append_result_unless_present(results_file, summary)
  writer.close()


def loop_metrics(result: Any) -> dict[str, float]:
  """A finished loop's final metrics as ``train/<name>`` and ``eval/<name>``."""
  return {**{train_tag(k): v for k, v in result.train_metrics.items()},
          **{f"eval/{k}": v for k, v in result.eval_metrics.items()}}


def run_summary(experiment: str, options: Any, config: Any, result: Any, *,
                start_time: float, num_params: int, resumed_from_step: int,
                metrics: dict[str, float] | None = None, **extra: Any) -> dict[str, Any]:
  """The results row of one run: identity, config, final metrics, speed, provenance
  (``git``: this process's code; ``git_segments``: each segment's, from the loop).

  ``metrics`` defaults to :func:`loop_metrics`; ``extra`` adds experiment-specific
  fields (e.g. multiply-accumulate counts).
  """
  return {
      "experiment": experiment, "run_name": options.run_name,
      "workdir": repo_relative(options.workdir), "completed": result.completed,
      "step": result.snapshot.step, "config": dataclasses.asdict(config),
      "metrics": loop_metrics(result) if metrics is None else metrics,
      "steps_per_s": result.steps_per_s, "wall_s": time.time() - start_time,
      "num_params": int(num_params), "resumed_from_step": resumed_from_step,
      "git": run_metadata.git_state(), "backend": jax.default_backend(),
      # per process that trained part of the run: its first step and the code it ran
      "git_segments": list((result.snapshot.record or {}).get("segments", [])),
      **extra,
  }
