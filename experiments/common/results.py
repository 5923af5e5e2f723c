"""The results table: one JSON row per finished run, appended to a JSONL file.

A row is written once, by the process that completes the run (a resumed run's row
carries the whole run's metrics: the loop restores them from its checkpoint), and the
run directory is then marked completed (:func:`experiments.common.workdir.mark_completed`),
so neither a rerun nor a ``--resume`` of it writes a second row. Non-finite numbers are
written as JSON ``null`` (JSON has no NaN or Inf); readers treat them as missing.
"""

from __future__ import annotations

import fcntl
import json
import math
import dataclasses
import os
import time
from typing import Any

import jax

from experiments.common import run_metadata
from experiments.common import workdir as workdir_lib
from experiments.common.repo_paths import repo_relative
from experiments.common.train_loop import train_tag


def _jsonable(value: Any) -> Any:
  """``value`` with every non-finite float (at any depth) replaced by None."""
  if isinstance(value, float):
    return value if math.isfinite(value) else None
  if isinstance(value, dict):
    return {k: _jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  return value


def append_result(path: str, row: dict[str, Any]) -> None:
  """Appends ``row`` as one line to the JSONL file at ``path`` (safe across processes).

  Parallel sweep runs share one results file, so the write holds an exclusive lock and
  is a single ``write`` of a complete line.
  """
  if not isinstance(row, dict):
    raise TypeError(f"row must be a dict, got {type(row).__name__}")
  line = json.dumps(_jsonable(row), sort_keys=True, allow_nan=False) + "\n"
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      f.write(line)
      f.flush()
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


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


# Results metrics under these namespaces are logged step by step by the loop already.
_STEP_NAMESPACES = ("train", "eval", "perf", "rl", "export", "sync", "numerics")


def finish_run(writer: Any, results_file: str, summary: dict[str, Any], *,
               completed: bool, step: int, workdir: str | None = None) -> None:
  """Closes a run: for a completed run, its summary scalars, the HParams end record,
  one results row and (with ``workdir``) the completion mark.

  The summary metrics the loop does not log per step (``reward/mean_over_training``,
  ``cost/total_s``, ``steps_to/0.97``, ...) are written as scalars at the final step,
  so TensorBoard's HParams table can show them as metric columns. Only a finished run
  closes its HParams session: readers keep the first end record of a tag, so a stopped
  run that is later resumed must not have written one (and it writes no results row
  either).
  """
  if completed:
    final = {k: float(v) for k, v in summary.get("metrics", {}).items()
             if k.split("/", 1)[0] not in _STEP_NAMESPACES
             and isinstance(v, (int, float)) and math.isfinite(v)}
    writer.write_scalars(step, final)
    writer.write_hparams_end(step, completed=True)
    append_result(results_file, summary)
    if workdir is not None:
      workdir_lib.mark_completed(workdir, step=step, results_file=repo_relative(results_file),
                                 run_name=summary.get("run_name", ""))
  writer.close()


def loop_metrics(result: Any) -> dict[str, float]:
  """A finished loop's final metrics as ``train/<name>`` and ``eval/<name>``."""
  return {**{train_tag(k): v for k, v in result.train_metrics.items()},
          **{f"eval/{k}": v for k, v in result.eval_metrics.items()}}


def run_summary(experiment: str, options: Any, config: Any, result: Any, *,
                start_time: float, num_params: int, resumed_from_step: int,
                metrics: dict[str, float] | None = None, **extra: Any) -> dict[str, Any]:
  """The results row of one run: identity, config, final metrics, speed, provenance.

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
      **extra,
  }
