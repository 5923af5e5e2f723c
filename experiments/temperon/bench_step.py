"""Training wall-clock of each sweep arm's run, the arms interleaved in one process.

    python -m experiments.temperon.bench_step --out=experiments/temperon/report/bench_step.json

The sweep's per-run wall-clock (``cost/total_s``) is measured while other processes
share the machine and the arms run one after another, so load that changes over the
sweep lands on some arms more than others. This benchmark runs each arm's own jitted
train step (:func:`experiments.temperon.experiment.make_train_step`) for the arm's
whole ``num_steps`` on one fixed batch, no evaluation, the arms interleaved within each
round in chunks of ``num_steps / chunks`` steps (each arm's state carried from chunk to
chunk, so every arm runs its real sequence of phases), and records each arm's seconds
per run per round. A ratio that holds in every
round is not an artefact of load drift. The temperon appendix reads the JSON.
"""

from __future__ import annotations

import dataclasses
import json
import time

import jax
from absl import app, flags

from experiments.common.evidence.results import write_benchmark
from experiments.common.harness import run_metadata
from experiments.common.harness.config_flags import parse_flags
from experiments.temperon import experiment
from experiments.temperon.sweeps import ARMS, temperon

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines this script's flags; called only when it runs as a script, so that
  importing the module (a test, another script) defines no flag names."""
  flags.DEFINE_string("out", "", "Write the result here as JSON (else print it).")
  flags.DEFINE_integer("rounds", 3, "Rounds; each runs every arm's whole run once.")
  flags.DEFINE_integer("chunks", 10, "Each round advances the arms in turn, this many "
                       "chunks of num_steps / chunks steps each (finer interleaving).")


def main(argv):
  del argv
  sweep = temperon()
  runs = {}
  for arm in ARMS:
    config = dataclasses.replace(sweep.base, **arm.overrides)
    init, step, _ = experiment.make_train_step(config)
    batch = experiment.digits.train_batch(*experiment.task_data(config)[:2], seed=0,
                                          position=0, batch_size=config.batch_size)
    state = init(jax.random.PRNGKey(0))[0]
    jax.block_until_ready(step(state, batch, None))  # compile (donates state)
    runs[arm.name] = (config, init, step, batch)
  seconds: dict[str, list[float]] = {a.name: [] for a in ARMS}
  chunk = sweep.base.num_steps // FLAGS.chunks
  for _ in range(FLAGS.rounds):
    states = {n: jax.block_until_ready(init(jax.random.PRNGKey(0))[0])
              for n, (_, init, _, _) in runs.items()}
    spent = dict.fromkeys(runs, 0.0)
    for _ in range(FLAGS.chunks):  # every arm advances one chunk, in turn
      for name, (_, _, step, batch) in runs.items():
        state = states[name]
        t = time.perf_counter()
        for _ in range(chunk):
          state, metrics = step(state, batch, None)
        jax.block_until_ready(metrics)
        spent[name] += time.perf_counter() - t
        states[name] = state
    for name in runs:
      seconds[name].append(spent[name])
  result = {"s_per_run": seconds, "num_steps": sweep.base.num_steps,
            "device": jax.devices()[0].device_kind, "rounds": FLAGS.rounds,
            "chunks": FLAGS.chunks, "git": run_metadata.git_state()}
  write_benchmark(FLAGS.out, result, json.dumps(result, indent=1))


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=parse_flags)
