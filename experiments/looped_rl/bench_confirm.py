"""ScaleRLT's rollout throughput claim: deferred vs dense decoding, decided by rounds.

    python -m experiments.looped_rl.bench_confirm               # runs it, writes report_bench/
    python -m experiments.looped_rl.bench_confirm --report_only  # rebuilds REPORT.md

Declared in :mod:`experiments.looped_rl.sweeps` (``ROLLOUT_*``) before the first round:
the shapes, the calls per round, the claims (on ``rollout/log_s``, the log of a
round's fastest rollout) and the sequential plan over rounds. The process pins itself
to one CPU (``--cpu``, default the last one) and builds, for each declared shape, the
deferred (KV-cached :func:`models.looped.rollout`) and dense
(:func:`models.sampling.sample` on the dense pass) rollouts of the looped_rl sweep's
model as :func:`experiments.looped_rl.bench_rollout.rollout_fns` does. Then, look by
look (:mod:`experiments.common.sweeps.bench_sequential`, the machinery of the QLoRA speed
claims), it times the next batch of rounds (each round calls every method
``ROLLOUT_REPEATS`` times in an order rotated from round to round and keeps the fastest
call), decides every undecided claim on all rounds so far with the repeated intervals
of :mod:`experiments.common.sweeps.sequential` (rounds in place of seeds; pairs are rounds),
and stops when every claim is decided or at the cap. ``bench_rollout.json`` records
every round's times, each look's load average and decisions, the declaration, the
commit and whether the tree was dirty; ``REPORT.md`` is built from it alone (and the
hand-written ``FINDINGS.md``), so it rebuilds byte for byte.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from typing import Any

from absl import app, flags

from experiments.common.harness import run_metadata
from experiments.common.harness.config_flags import parse_flags
from experiments.common.sweeps import bench_sequential
from experiments.common.sweeps.sequential import SequentialPlan
from experiments.looped_rl import sweeps

FLAGS = flags.FLAGS

JSON_FILE = "bench_rollout.json"


def method_name(path: str, prompt_len: int, num_new: int) -> str:
  """``deferred_p8_n5``: a rollout path at a shape."""
  return f"{path}_p{prompt_len}_n{num_new}"


def _claims() -> list[dict[str, Any]]:
  return [dataclasses.asdict(c) for c in sweeps.ROLLOUT_CLAIMS]


def _declaration() -> dict[str, Any]:
  return {"plan": dataclasses.asdict(sweeps.ROLLOUT_PLAN), "claims": _claims(),
          "shapes": [list(s) for s in sweeps.ROLLOUT_SHAPES],
          "batch": sweeps.ROLLOUT_BATCH, "recipe": sweeps.ROLLOUT_RECIPE,
          "repeats": sweeps.ROLLOUT_REPEATS}


def run(out_dir: str, cpu: int, batch: int | None = None) -> dict[str, Any]:
  """Runs the benchmark look by look; returns (and writes) the JSON record. ``batch``:
  the declared rows per rollout unless given (a test's small one)."""
  with bench_sequential.pinned(cpu) as (cpu, allowed):
    import jax  # pylint: disable=import-outside-toplevel
    from experiments.looped_rl.bench_rollout import rollout_fns  # pylint: disable=import-outside-toplevel
    batch = sweeps.ROLLOUT_BATCH if batch is None else batch
    t0 = time.perf_counter()
    fns = {}
    for prompt_len, num_new in sweeps.ROLLOUT_SHAPES:
      for path, fn in rollout_fns(sweeps.ROLLOUT_RECIPE, prompt_len, num_new,
                                  batch).items():
        fns[method_name(path, prompt_len, num_new)] = fn
    record: dict[str, Any] = {
        "declaration": _declaration(), "batch_run": batch,
        "git": run_metadata.git_state(), "backend": jax.default_backend(),
        "jax": jax.__version__, "machine": platform.machine(),
        "cpus_allowed": len(allowed), "pinned_cpu": cpu,
        "compile_s": round(time.perf_counter() - t0, 1)}
    bench_sequential.run_looks(fns, _claims(), sweeps.ROLLOUT_PLAN,
                               sweeps.ROLLOUT_REPEATS, record)
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, JSON_FILE), "w") as f:
    json.dump(record, f, indent=1, sort_keys=True)
    f.write("\n")
  return record


def build_report(out_dir: str) -> str:
  """Writes ``<out_dir>/REPORT.md`` from ``bench_rollout.json`` (and ``FINDINGS.md``)."""
  with open(os.path.join(out_dir, JSON_FILE)) as f:
    record = json.load(f)
  decl = record["declaration"]
  plan = SequentialPlan(**decl["plan"])
  log_s = bench_sequential.log_times(record["per_round_s"])
  now = bench_sequential.outcomes(decl["claims"], plan, log_s, len(record["looks"]))
  git = record["git"]
  methods = list(record["per_round_s"])
  rounds = len(log_s[methods[0]])
  shapes = ", ".join(f"prompt {p} + {n} new tokens" for p, n in decl["shapes"])
  lines = [
      "# Benchmark `looped_rl` rollout, deferred vs dense", "",
      "ScaleRLT's rollout throughput gain of deferred over dense computation, decided "
      "by rounds of an interleaved timing on one pinned core (issue 50), not by seeds of "
      "a training run. Declared in `experiments/looped_rl/sweeps.py` (`ROLLOUT_*`) "
      "before the first round.", "",
      "## Claims", "",
      "Paired by round: the difference of log rollout times `deferred − dense` at the "
      "same shape (a log ratio; below 0: deferred is faster), decided with a sequential "
      "plan over rounds exactly as a sequential sweep decides over seeds: looks at "
      f"{', '.join(map(str, plan.looks()))} rounds, O'Brien-Fleming-type spending at "
      f"level {plan.alpha:g}, repeated intervals (docs/sweeps.md, \"Sequential "
      "sweeps\"). The ratio column is exp of the mean log ratio (deferred / dense time) "
      "with its repeated 95% interval; the throughput gain is its inverse.", ""]
  lines += bench_sequential.claims_lines(decl["claims"], now, plan,
                                         lambda c: f"margin {c['margin']:g}")
  lines += [
      "", "## Setup", "",
      "- benchmark: `python -m experiments.looped_rl.bench_confirm` (the looped_rl "
      f"sweep's model, recipe `{decl['recipe']}`, random weights; {record['batch_run']} "
      f"rows per rollout; shapes: {shapes}; each path as "
      "`experiments.looped_rl.bench_rollout.rollout_fns` builds it)",
      f"- methods: {', '.join(f'`{m}`' for m in methods)}; per round each is called "
      f"{decl['repeats']} times in an order rotated from round to round and its fastest "
      "call kept",
      f"- git commit `{git['commit']}`" + (" (**dirty**: tracked files differed from the "
                                           "commit)" if git.get("dirty") else
                                           " (clean tree)"),
      f"- {record['backend']}, jax {record['jax']}, {record['machine']}; pinned to CPU "
      f"{record['pinned_cpu']} of {record['cpus_allowed']} (the machine is shared: the "
      "load averages are in the looks table); compiling took "
      f"{record['compile_s']:.1f} s"]
  lines += bench_sequential.distribution_free_lines(decl["claims"], log_s, now)
  lines += bench_sequential.looks_lines(record)
  lines += ["", "## Rollout times", "", f"Over the {rounds} rounds: the median of the "
            "per-round fastest rollout, and the per-round ratio dense / deferred at the "
            "same shape (the deferred path's throughput gain; median [min, max]).", "",
            "| shape | deferred ms | dense ms | dense / deferred |", "|---|---|---|---|"]
  for prompt_len, num_new in decl["shapes"]:
    deferred = method_name("deferred", prompt_len, num_new)
    dense = method_name("dense", prompt_len, num_new)
    t_def, *_ = bench_sequential.ratio_row(record["per_round_s"], deferred, dense)
    t_dense, gain, low, high = bench_sequential.ratio_row(record["per_round_s"], dense,
                                                         deferred)
    lines.append(f"| prompt {prompt_len} + {num_new} new | {1e3 * t_def:.1f} | "
                 f"{1e3 * t_dense:.1f} | {gain:.3f} [{low:.3f}, {high:.3f}] |")
  lines += bench_sequential.reproduce_lines("experiments.looped_rl.bench_confirm", record)
  return bench_sequential.write_report(out_dir, lines)


def define_flags() -> None:
  """Defines this script's flags; called only when it runs as a script, so that
  importing the module (a test, another script) defines no flag names."""
  bench_sequential.define_flags(sweeps.ROLLOUT_REPORT_DIR, "bench_rollout.json")


main = bench_sequential.main_of(run, build_report)


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=parse_flags)
