"""The export's own cost: the jitted export step against the jitted update step.

    python -m experiments.fair_cast.bench_export          # writes report/bench_export.json
    python -m experiments.fair_cast.bench_export --rounds=3 --repeats=3 --out=/tmp/b.json

The per-update time of a sweep (``perf/update_s``) includes sampling, the host-side
export metrics of :class:`experiments.fair_cast.experiment.ExportMonitor` and the
update, measured while other runs share the cores, so the export's cost rests on this
script instead. In one process it builds the fair_cast sweep's model (random weights,
the masters on the bf16 grid: the time does not depend on their values), one batch of
the sweep's shape (16 problems x 8 samples, random tokens and advantages) and:

* ``update``: the learner's jitted GRPO step exactly as the RL loop runs it
  (:func:`experiments.common.trainers.rl.loop.learner_step_fns`: forward, backward, Adam);
* ``export/<rounding>``: the jitted export of the masters to bf16 with that rounding
  (:func:`numerics.export.export`; error feedback with its residual state);
* ``host_metrics``: one call of the sweep's ``ExportMonitor.on_sync`` at an update
  without the lag k* (unchanged fraction, ulp distance, drift, visible displacement,
  step rms: host-side NumPy, the same for every rounding).

Everything is compiled first; then, for ``rounds`` rounds, each (the order rotated per
round) is called ``repeats`` times and its minimum kept
(:func:`numerics.benchmarking.interleaved`). Printed and written: each one's time (the
median over rounds of its per-round minimum) and its ratio to ``update`` within each
round (median [min, max] over rounds).

Measured with ``--rounds=5 --repeats=5`` (``report/bench_export.json``; 2 CPU cores
shared with three running sweeps, load average 6.5; 0.10M parameters, 128 sequences
of 13 tokens per update): update 39.8 ms; export nearest 0.33 ms (x0.008 of an update,
[0.006, 0.011] over rounds), stochastic 0.39 ms (x0.010 [0.009, 0.014]), error
feedback 0.50 ms (x0.012 [0.010, 0.014]); the host metrics 1.9 ms (x0.047). So the
export itself costs about 1% of an update at this size, and the unbiased exports
about 0.2-0.4% of an update more than nearest.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from typing import Any, Callable

from absl import app, flags
import jax
import jax.numpy as jnp

from experiments.common.data import arithmetic_task as task
from experiments.common.evidence.results import write_benchmark
from experiments.common.harness import run_metadata
from experiments.common.harness.config_flags import parse_flags
from experiments.common.trainers.rl.loop import learner_step_fns
from experiments.fair_cast.experiment import ExportMonitor, FairCastConfig
from experiments.fair_cast.sweeps import ROUNDINGS, fair_cast
from lowprec.numerics.benchmarking import interleaved, ratio_summary
from lowprec.numerics.rl import sampler_copy

BASELINE = "update"


def _fns(config: FairCastConfig) -> tuple[dict[str, Callable[[], Any]], int]:
  """The timed calls (compiled) and the model's parameter count."""
  model = config.learner_model()
  apply = lambda prm, t, k: model.apply({"params": prm}, t, k)
  key = jax.random.PRNGKey(0)
  prompt_len, num_new = task.prompt_length(config.digits), task.answer_length(config.digits)
  rows = config.prompts_per_update * config.group_size
  params = model.init(key, jnp.zeros((1, prompt_len + num_new), jnp.int32), key)["params"]
  master = config.initial_master(params)
  k_tok, k_adv = jax.random.split(jax.random.PRNGKey(1))
  tokens = jax.random.randint(k_tok, (rows, prompt_len + num_new), 0, task.VOCAB_SIZE)
  behaviour = jnp.full((rows, num_new), -1.0, jnp.float32)
  adv = jax.random.normal(k_adv, (rows,), jnp.float32)
  mask = jnp.ones((rows, num_new), jnp.float32)
  fns: dict[str, Callable[[], Any]] = {}

  optimizer = config.optimizer()
  _, update = learner_step_fns(config, apply, optimizer)
  opt_state = optimizer.init(master)
  served0 = jax.jit(config.exporter().export)(
      master, config.exporter().init(master), key)[0]
  fns[BASELINE] = lambda: update(master, opt_state, tokens, behaviour, adv, mask,
                                 served0)[0]
  for rounding in ROUNDINGS:
    exporter = dataclasses.replace(config, export_rounding=rounding).exporter()
    export = jax.jit(exporter.export)
    state = exporter.init(master)
    fns[f"export/{rounding}"] = (
        lambda export=export, state=state: export(master, state, key)[0])

  monitor = ExportMonitor(config)
  copy = lambda params, version: sampler_copy.SamplerCopy(
      params, jnp.asarray(version, jnp.int32), jnp.asarray(version + 1, jnp.int32))
  monitor.on_sync(0, master, None, copy(served0, 0))
  previous = copy(served0, 0)
  # An update that is not a lag update (k* is computed every lag_every updates).
  update_no_lag = 1 if config.lag_every > 1 else 0
  fns["host_metrics"] = lambda: monitor.on_sync(update_no_lag, master, previous,
                                                copy(served0, 1))
  for fn in fns.values():
    jax.block_until_ready(fn())  # compile
  return fns, sum(int(x.size) for x in jax.tree.leaves(master))


def run(config: FairCastConfig, rounds: int, repeats: int) -> dict[str, Any]:
  """The measurements as a JSON-able dict (see the module docstring)."""
  t0 = time.perf_counter()
  fns, num_params = _fns(config)
  compile_s = time.perf_counter() - t0
  load_before = [round(x, 2) for x in os.getloadavg()]
  times = interleaved(fns, rounds, repeats)
  return {
      "config": {k: getattr(config, k) for k in (
          "d_model", "num_layers", "num_heads", "d_ff", "digits", "prompts_per_update",
          "group_size", "learning_rate", "export_format")},
      "num_params": int(num_params), "rounds": rounds, "repeats": repeats,
      "baseline": BASELINE, "backend": jax.default_backend(), "jax": jax.__version__,
      "cpus": len(os.sched_getaffinity(0)), "machine": platform.machine(),
      "load_average_before": load_before, "compile_s": compile_s,
      "git": run_metadata.git_state(),  # commit and dirty flag
      "times": ratio_summary(times, BASELINE), "per_round_s": times,
      "load_average_after": [round(x, 2) for x in os.getloadavg()]}


def format_table(result: dict[str, Any]) -> str:
  lines = [f"{result['num_params']} parameters; min of {result['repeats']} calls per "
           f"round, {result['rounds']} rounds; ratio to {result['baseline']}: median "
           "[min, max] over rounds"]
  for name, s in result["times"].items():
    lines.append(f"  {name:24s} {s['ms']:9.3f} ms   x{s['ratio']:.4f} "
                 f"[{s['ratio_min']:.4f}, {s['ratio_max']:.4f}]")
  return "\n".join(lines)


def define_flags() -> None:
  """The script's flags (defined only when it runs, so that importing this module
  beside another benchmark script with the same flag names is fine)."""
  flags.DEFINE_integer("rounds", 10, "Interleaved rounds.")
  flags.DEFINE_integer("repeats", 7, "Timed calls per step per round (min).")
  flags.DEFINE_string("out", "experiments/fair_cast/report/bench_export.json",
                      "Where to write the JSON ('' : nowhere).")


def main(argv):
  del argv
  f = flags.FLAGS
  result = run(fair_cast().base, f.rounds, f.repeats)
  write_benchmark(f.out, result, format_table(result))


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=parse_flags)
