"""The QLoRA speed claims' confirmatory round: a sequential benchmark on one pinned core.

    python -m experiments.qlora.bench_confirm            # runs it, writes report_confirm/
    python -m experiments.qlora.bench_confirm --report_only   # rebuilds REPORT.md

Declared in :mod:`experiments.qlora.sweeps` (``SPEED_*``) before the first round: the
methods, the calls per round, the claims (on ``step/log_s``, the log of a round's
fastest step) and the sequential plan over rounds. The process pins itself to one CPU
(``--cpu``, default the last one) and builds each method's jitted train step as
:mod:`experiments.qlora.bench_step` does (the sweep's model, random weights, one batch).
Then, look by look, it times the next batch of rounds (each round calls every method
``SPEED_REPEATS`` times, in an order rotated from round to round, and keeps the fastest
call), decides every undecided claim on all rounds so far with the repeated intervals
of :mod:`experiments.common.sweeps.sequential` (rounds in place of seeds; pairs are rounds),
and stops when every claim is decided or at the cap. ``bench_speed.json`` records every
round's times, each look's load average and decisions, the declaration, the commit and
whether the tree was dirty; ``REPORT.md`` is built from it alone (and the
hand-written ``FINDINGS.md``), so it rebuilds byte for byte.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import time
from typing import Any

import numpy as np

from absl import app, flags

from experiments.common.harness import run_metadata
from experiments.common.harness.config_flags import parse_flags
from experiments.common.sweeps import bench_sequential
from experiments.common.sweeps.confirmatory import fixed_verdict
from experiments.common.sweeps.sequential import SequentialPlan
from experiments.qlora import sweeps
from experiments.qlora.appendix import NO_SLOWDOWN, speed_verdict

FLAGS = flags.FLAGS

JSON_FILE = "bench_speed.json"
PILOT_FILE = "experiments/qlora/report/bench_step.json"


def _claims() -> list[dict[str, Any]]:
  return [dataclasses.asdict(c) for c in sweeps.SPEED_CLAIMS]


def _declaration() -> dict[str, Any]:
  return {"plan": dataclasses.asdict(sweeps.SPEED_PLAN), "claims": _claims(),
          "methods": list(sweeps.SPEED_METHODS), "repeats": sweeps.SPEED_REPEATS,
          "baseline": sweeps.BASELINE}


def outcomes(log_s: dict[str, list[float]], looks_done: int) -> list:
  """Every claim's sequential outcome on the rounds so far (rounds are the pairs)."""
  return bench_sequential.outcomes(_claims(), sweeps.SPEED_PLAN, log_s, looks_done)


def run(out_dir: str, cpu: int, config: Any = None) -> dict[str, Any]:
  """Runs the benchmark look by look; returns (and writes) the JSON record. ``config``:
  the sweep's model (``QLoRAConfig()``) unless given (a test's tiny one)."""
  with bench_sequential.pinned(cpu) as (cpu, allowed):
    return _run_pinned(out_dir, cpu, allowed, config)


def _run_pinned(out_dir: str, cpu: int, allowed: list[int], config: Any) -> dict[str, Any]:
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from experiments.qlora import bench_step  # pylint: disable=import-outside-toplevel
  from experiments.qlora.experiment import ARCH_FIELDS, QLoRAConfig  # pylint: disable=import-outside-toplevel
  config = QLoRAConfig() if config is None else config
  model = config.model(bench_step.VOCAB)
  key = jax.random.PRNGKey(0)
  params = jax.jit(model.init)(key, jnp.zeros((1, config.seq_len), jnp.int32), key)["params"]
  tokens = np.asarray(jax.random.randint(jax.random.PRNGKey(1),
                                         (config.batch_size, config.seq_len + 1), 0,
                                         bench_step.VOCAB))
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
  t0 = time.perf_counter()
  fns = bench_step._step_fns(config, params, batch, sweeps.SPEED_METHODS)  # pylint: disable=protected-access
  record: dict[str, Any] = {
      "declaration": _declaration(),
      "config": {k: getattr(config, k) for k in ARCH_FIELDS + ("rank", "alpha",
                                                                 "nf4_block_size",
                                                                 "double_quant")},
      "git": run_metadata.git_state(), "backend": jax.default_backend(),
      "jax": jax.__version__, "machine": platform.machine(), "cpus_allowed": len(allowed),
      "pinned_cpu": cpu, "compile_s": round(time.perf_counter() - t0, 1)}
  bench_sequential.run_looks(fns, _claims(), sweeps.SPEED_PLAN, sweeps.SPEED_REPEATS,
                             record)
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, JSON_FILE), "w") as f:
    json.dump(record, f, indent=1, sort_keys=True)
    f.write("\n")
  return record


def _pilot_lines() -> list[str]:
  """The pilot benchmark's per-round log ratios by the confirmatory claims' tests
  (fixed-n, descriptive: the pilot declared 'every round on one side' instead)."""
  from experiments.common.harness.repo_paths import REPO_DIR  # pylint: disable=import-outside-toplevel
  with open(os.path.join(REPO_DIR, PILOT_FILE)) as f:
    pilot = json.load(f)
  per_round = pilot["per_round_s"]
  rows = []
  for i, c in enumerate(_claims(), start=1):
    arm = {r: math.log(t) for r, t in enumerate(per_round[c["arm"]])}
    base = {r: math.log(t) for r, t in enumerate(per_round[c["baseline"]])}
    cell, verdict = fixed_verdict(c["kind"], float(c["margin"] or 0.0), arm, base, False)
    # The pilot's declared rule (experiments.qlora.appendix.speed_verdict): the NF4
    # step slower in every round; the hoisted one within 2% in every round.
    nf4 = c["arm"] if c["kind"] == "worse" else c["baseline"]
    ratios = [math.exp(a - b) for a, b in zip(
        [math.log(t) for t in per_round[nf4]],
        [math.log(t) for t in per_round[sweeps.BASELINE]])]
    declared = (speed_verdict(ratios, 1.0, "slower") if c["kind"] == "worse"
                else speed_verdict(ratios, NO_SLOWDOWN, "removes"))
    rows.append((i, cell, verdict, declared))
  return rows


def build_report(out_dir: str) -> str:
  """Writes ``<out_dir>/REPORT.md`` from ``bench_speed.json`` (and ``FINDINGS.md``)."""
  with open(os.path.join(out_dir, JSON_FILE)) as f:
    record = json.load(f)
  decl = record["declaration"]
  plan = SequentialPlan(**decl["plan"])
  log_s = bench_sequential.log_times(record["per_round_s"])
  looks_done = len(record["looks"])
  now = outcomes(log_s, looks_done)
  git = record["git"]
  cfg = record["config"]
  rounds = len(log_s[decl["baseline"]])
  lines = [
      "# Benchmark `qlora` speed, confirmatory round", "",
      "The QLoRA speed claims decided by rounds of an interleaved timing on one pinned "
      "core (issue 36), not by seeds of a training run. Declared in "
      "`experiments/qlora/sweeps.py` (`SPEED_*`) before the first round.", "",
      f"- benchmark: `python -m experiments.qlora.bench_confirm` (the sweep's model: "
      f"d_model {cfg['d_model']}, {cfg['num_layers']} blocks, d_ff {cfg['d_ff']}, batch "
      f"{cfg['batch_size']} x {cfg['seq_len']}; each method's jitted train step as "
      "`experiments.qlora.bench_step` builds it)",
      f"- methods: {', '.join(f'`{m}`' for m in decl['methods'])} (baseline "
      f"`{decl['baseline']}`); per round each is called {decl['repeats']} times in an "
      "order rotated from round to round and its fastest call kept",
      f"- git commit `{git['commit']}`" + (" (**dirty**: tracked files differed from the "
                                           "commit)" if git.get("dirty") else
                                           " (clean tree)"),
      f"- {record['backend']}, jax {record['jax']}, {record['machine']}; pinned to CPU "
      f"{record['pinned_cpu']} of {record['cpus_allowed']} (the machine is shared: the "
      "load averages are in the looks table); compiling took "
      f"{record['compile_s']:.1f} s", "",
      "## Claims", "",
      f"Paired by round: the difference of log step times `method − {decl['baseline']}` "
      "(a log ratio), decided with a sequential plan over rounds exactly as a sequential "
      f"sweep decides over seeds: looks at {', '.join(map(str, plan.looks()))} rounds, "
      f"O'Brien-Fleming-type spending at level {plan.alpha:g}, repeated intervals "
      "(docs/sweeps.md, \"Sequential sweeps\"). The ratio column is exp of the mean log "
      "ratio with its repeated 95% interval.", "",
  ]
  lines += bench_sequential.claims_lines(
      decl["claims"], now, plan, lambda c: f"margin {c['margin']:g} = log 1.02")
  lines += bench_sequential.distribution_free_lines(decl["claims"], log_s, now)
  lines += bench_sequential.looks_lines(record)
  lines += ["", "## Step times", "", f"Over the {rounds} rounds: the median of the "
            "per-round fastest step, and the per-round ratio to the baseline (median "
            "[min, max]).", "", "| method | ms per step | ratio to baseline |",
            "|---|---|---|"]
  for m in decl["methods"]:
    t, ratio, low, high = bench_sequential.ratio_row(record["per_round_s"], m,
                                                     decl["baseline"])
    lines.append(f"| `{m}` | {1e3 * t:.1f} | {ratio:.3f} [{low:.3f}, {high:.3f}] |")
  lines += ["", "## Pilot and confirmatory, side by side", "",
            "The pilot (`experiments/qlora/report/bench_step.json`: 10 rounds, 7 calls, "
            "both cores, not pinned) declared 'held when every round's ratio is on the "
            "claimed side' and found neither claim decided. Its rounds by this round's "
            "test, fixed-n (descriptive: not how the pilot was declared), beside the "
            "confirmatory verdict:", "",
            "| claim | pilot: mean log ratio [95%], fixed n | pilot by this test | pilot's "
            "declared verdict | confirmatory verdict | verdict changed? |",
            "|---|---|---|---|---|---|"]
  for (i, cell, verdict, declared), o in zip(_pilot_lines(), now):
    same = declared.split(" (")[0] == o.verdict.split(" (")[0] or (
        declared.startswith("not decided") and o.verdict.startswith("not decided"))
    lines.append(f"| {i} | {cell} | {verdict} | {declared} | **{o.verdict}** | "
                 f"{'no' if same else '**yes**'} |")
  lines += bench_sequential.reproduce_lines("experiments.qlora.bench_confirm", record)
  return bench_sequential.write_report(out_dir, lines)


def define_flags() -> None:
  """Defines this script's flags; called only when it runs as a script, so that
  importing the module (a test, another script) defines no flag names."""
  bench_sequential.define_flags(sweeps.SPEED_REPORT_DIR, "bench_speed.json")


main = bench_sequential.main_of(run, build_report)


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=parse_flags)
