"""Expand a declared sweep to a manifest and run it locally, on SLURM, or just print it.

    python -m launch.sweep --sweep=lm_recipes --dry_run          # print the commands
    python -m launch.sweep --sweep=lm_recipes                    # run locally, then report
    python -m launch.sweep --sweep=lm_recipes --target=slurm     # write a job-array script
    python -m launch.sweep --sweep=lm_recipes --override=num_steps=50   # every run

Outputs under ``--sweep_dir`` (default ``runs/sweeps/<sweep>``): ``manifest.jsonl`` (one
run per line, with its flags and command), ``sweep.json``, ``runs/<run_name>/`` (each
run's TensorBoard events, config.json, checkpoints, launch.log), ``results.jsonl`` and,
after a local run, ``REPORT.md`` with ``plots/``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Sequence

from absl import app, flags, logging

from launch import sweeps

FLAGS = flags.FLAGS
from launch.local_runner import default_parallelism, run_local
from launch.slurm import SlurmOptions, write_array_script
from launch.sweep_spec import Sweep, RunSpec, expand, swept_hparams, write_manifest
from experiments.common.config_flags import parse_override
from experiments.common.tensorboard_writer import write_hparams_experiment

def define_flags() -> None:
  """Defines this script's flags (only when run as a script: library use defines none)."""
  flags.DEFINE_enum("sweep", None, list(sweeps.names()), "Which declared sweep.")
  flags.DEFINE_string("sweep_dir", "", "Output directory (default runs/sweeps/<sweep>).")
  flags.DEFINE_enum("target", "local", ["local", "slurm"],
                    "local: run now with parallel processes; slurm: write an sbatch "
                    "job-array script (submit it yourself).")
  flags.DEFINE_bool("dry_run", False, "Print one command per run; write nothing.")
  flags.DEFINE_multi_string("override", [], "name=value applied to every run's config "
                            "(repeatable), e.g. --override=num_steps=50.")
  flags.DEFINE_list("seeds", [], "Run only these of the sweep's declared seeds "
                    "(comma-separated; default all).")
  flags.DEFINE_integer("parallel", 0, "Local runs at a time (0: as many as fit by cores "
                       "and free memory).")
  flags.DEFINE_integer("cpus_per_run", 1, "Local: CPU cores pinned to each run.")
  flags.DEFINE_float("mem_per_run_gb", 2.0, "Local: memory budget per run.")
  flags.DEFINE_float("run_timeout_s", 0.0, "Local: kill a run after this many seconds "
                     "(0: no limit).")
  flags.DEFINE_bool("report", True, "Local: build REPORT.md when the runs finish.")
  flags.DEFINE_string("slurm_time", "02:00:00", "SLURM: --time per run.")
  flags.DEFINE_integer("slurm_cpus_per_task", 4, "SLURM: --cpus-per-task.")
  flags.DEFINE_string("slurm_mem", "16G", "SLURM: --mem per run.")
  flags.DEFINE_integer("slurm_gpus_per_task", 0, "SLURM: --gpus-per-task.")
  flags.DEFINE_integer("slurm_nodes", 1, "SLURM: nodes per run (multi-host).")
  flags.DEFINE_integer("slurm_ntasks_per_node", 1, "SLURM: processes per node.")
  flags.DEFINE_string("slurm_partition", "", "SLURM: --partition.")
  flags.DEFINE_string("slurm_account", "", "SLURM: --account.")
  flags.DEFINE_integer("slurm_max_concurrent", 0, "SLURM: array %limit (0: none).")

def prepare(sweep: Sweep, sweep_dir: str, overrides: Sequence[str],
            seeds: Sequence[int] = ()) -> tuple[Sweep, list[RunSpec]]:
  """Expands the sweep with ``name=value`` overrides (validated against the config).

  ``seeds``, if given, must be a subset of the declared seeds (a quicker partial sweep).
  """
  extra = dict(parse_override(o, sweep.base) for o in overrides)
  if seeds:
    unknown = sorted(set(seeds) - set(sweep.seeds))
    if unknown:
      raise ValueError(f"seeds {unknown} are not declared by sweep {sweep.name!r} "
                       f"(declared: {list(sweep.seeds)})")
    sweep = dataclasses.replace(sweep, seeds=tuple(s for s in sweep.seeds if s in seeds))
  return sweep, expand(sweep, sweep_dir, extra)


def write_tensorboard_experiment(sweep: Sweep, runs: Sequence[RunSpec], sweep_dir: str) -> None:
  """The HParams experiment summary at the root of the runs' logdir (one per sweep)."""
  hparams = swept_hparams(sweep, runs) or {sweep.seed_field: list(sweep.seeds)}
  write_hparams_experiment(os.path.join(sweep_dir, "runs"), hparams, sweep.metrics)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  sweep = sweeps.get(FLAGS.sweep)
  sweep_dir = os.path.abspath(FLAGS.sweep_dir or os.path.join("runs", "sweeps", sweep.name))
  sweep, runs = prepare(sweep, sweep_dir, FLAGS.override, [int(x) for x in FLAGS.seeds])
  if FLAGS.dry_run:
    print(f"# sweep {sweep.name}: {len(runs)} runs "
          f"({len(sweep.arms)} arms x {len(sweep.seeds)} seeds) -> {sweep_dir}")
    for r in runs:
      print(r.shell_command())
    return 0
  manifest = write_manifest(sweep, runs, sweep_dir)
  write_tensorboard_experiment(sweep, runs, sweep_dir)
  print(f"manifest: {manifest} ({len(runs)} runs)")
  if FLAGS.target == "slurm":
    script = write_array_script(runs, sweep_dir, sweep.name, SlurmOptions(
        time=FLAGS.slurm_time, cpus_per_task=FLAGS.slurm_cpus_per_task, mem=FLAGS.slurm_mem,
        gpus_per_task=FLAGS.slurm_gpus_per_task, nodes=FLAGS.slurm_nodes,
        ntasks_per_node=FLAGS.slurm_ntasks_per_node, partition=FLAGS.slurm_partition,
        account=FLAGS.slurm_account, max_concurrent=FLAGS.slurm_max_concurrent))
    print(f"submit with: sbatch {script}")
    print(f"then: python -m launch.report --sweep_dir={sweep_dir}")
    return 0
  parallel = FLAGS.parallel or default_parallelism(FLAGS.cpus_per_run, FLAGS.mem_per_run_gb)
  outcomes = run_local(runs, parallel=parallel, cpus_per_run=FLAGS.cpus_per_run,
                       timeout_s=FLAGS.run_timeout_s or None)
  failed = [o for o in outcomes if o.returncode not in (0, None)]
  for o in failed:
    print(f"FAILED {o.run_name} (rc={o.returncode}); log: {o.log_path}", file=sys.stderr)
  if FLAGS.report:
    from launch import report  # pylint: disable=import-outside-toplevel
    path = report.build_report(sweep_dir)
    print(f"report: {path}")
  print(f"tensorboard --logdir {os.path.join(sweep_dir, 'runs')} --host 127.0.0.1 --port 6006")
  return 1 if failed else 0


if __name__ == "__main__":
  define_flags()
  flags.mark_flag_as_required("sweep")
  app.run(lambda argv: sys.exit(main(argv)))
