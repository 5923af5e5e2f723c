"""The results table: one JSON row per finished run, appended to a JSONL file."""

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
from experiments.common.repo_paths import repo_relative
from experiments.common.train_loop import train_tag


def _jsonable(value: Any) -> Any:
  if isinstance(value, float) and not math.isfinite(value):
    return repr(value)  # JSON has no NaN/Inf; keep them visible as strings
  return value


def append_result(path: str, row: dict[str, Any]) -> None:
  """Appends ``row`` as one line to the JSONL file at ``path`` (safe across processes).

  Parallel sweep runs share one results file, so the write holds an exclusive lock and
  is a single ``write`` of a complete line.
  """
  if not isinstance(row, dict):
    raise TypeError(f"row must be a dict, got {type(row).__name__}")
  line = json.dumps({k: _jsonable(v) for k, v in row.items()}, sort_keys=True,
                    default=_jsonable) + "\n"
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      f.write(line)
      f.flush()
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def read_results(path: str) -> list[dict[str, Any]]:
  """Reads every row of a results JSONL file (missing file: empty list)."""
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for lineno, line in enumerate(f, 1):
      line = line.strip()
      if not line:
        continue
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: not a JSON row: {e}") from e
  return rows


# Results metrics under these namespaces are logged step by step by the loop already.
_STEP_NAMESPACES = ("train", "eval", "perf", "rl", "export", "sync", "numerics")


def finish_run(writer: Any, results_file: str, summary: dict[str, Any], *,
               completed: bool, step: int) -> None:
  """Closes a run: for a completed run, its summary scalars, the HParams end record and
  one results row.

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
