"""Expand a declared sweep to a manifest and run it locally, on SLURM, or just print it.

    python -m launch.sweep --list                                # registered sweeps
    python -m launch.sweep --sweep=lm_recipes --dry_run          # print the commands
    python -m launch.sweep --sweep=lm_recipes                    # run locally, then report
    python -m launch.sweep --sweep=lm_recipes --target=slurm --slurm_partition=gpu \\
        --slurm_account=myproj --slurm_time=04:00:00 --slurm_gpus_per_task=1   # on SLURM
    python -m launch.sweep --sweep=lm_recipes --override=num_steps=50   # every run

Outputs under ``--sweep_dir`` (default ``runs/sweeps/<sweep>``): ``manifest.jsonl`` (one
run per line, with its flags and command), ``sweep.json`` (the declaration, the
``--override`` values applied over it, the git commit it ran from and, after a local
run, its measured duration), ``runs/<run_name>/``
(each run's TensorBoard events, config.json, checkpoints, launch.log),
``results.jsonl`` and, after the runs, ``REPORT.md`` with ``plots/``. On SLURM also
``slurm_array.sbatch``, ``commands.txt`` and ``slurm/`` (each task's output, and
``tasks.jsonl``: the scheduler's last record of each task).

A sweep records the commit its runs execute, so it refuses to start from a tree with
uncommitted changes to tracked files (``--allow_dirty`` overrides; the report then says
so). Regenerating a paper's committed evidence is ``--sweep_dir=<its report_dir>``.

One sweep at a time per directory: a sweep holds ``<sweep_dir>/.lock`` while it runs,
and a second one is refused, naming the holder. Ctrl-C stops a local sweep's runs once
and cleanly (each checkpoints; they are reported preempted, no report is built, and
the exit status is 130); a second Ctrl-C kills them. Rerunning the same command resumes
them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any, Callable, Sequence

from absl import app, flags

from experiments.common.harness import log_filters
from experiments.common.harness import workdir as workdir_lib
from experiments.common.harness.config_flags import parse_flags, parse_override
from experiments.common.harness.repo_paths import REPO_DIR, repo_relative
from experiments.common.harness.run_metadata import git_state
from experiments.common.sweeps.sweep_data import read_sweep_info
from experiments.common.sweeps.sweep_spec import Sweep
from launch import registry
from launch import sequential_runner
from launch import tensorboard_views
from launch.local_runner import RunOutcome, SweepInterrupted, default_parallelism, run_local
from launch.manifest import RunSpec, expand, swept_hparams, write_manifest
from launch.slurm import SlurmOptions, write_array_script
from launch.slurm_runner import run_slurm, scheduler_available

FLAGS = flags.FLAGS
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


def define_flags() -> None:
  """Defines this script's flags (only when run as a script: library use defines none)."""
  flags.DEFINE_enum("sweep", None, list(registry.names()), "Which declared sweep.")
  flags.DEFINE_bool("list", False, "Print every registered sweep with its run count and "
                    "the measured duration of its committed report; run nothing.")
  flags.DEFINE_string("sweep_dir", "", "Output directory (default runs/sweeps/<sweep>).")
  flags.DEFINE_enum("target", "local", ["local", "slurm"],
                    "local: run now with parallel processes; slurm: submit a job array "
                    "(one task per run), wait for it, resubmit preempted runs, report.")
  flags.DEFINE_bool("dry_run", False, "Print one command per run; write nothing.")
  flags.DEFINE_bool("allow_dirty", False, "Run although tracked files differ from the "
                    "commit (the report marks the commit dirty).")
  flags.DEFINE_multi_string("override", [], "name=value applied to every run's config "
                            "(repeatable), e.g. --override=num_steps=50.")
  flags.DEFINE_list("seeds", [], "Run only these of the sweep's declared seeds "
                    "(comma-separated; default all).")
  flags.DEFINE_bool("allow_calibration_seeds", False, "Let --seeds name the sweep's "
                    "calibration seeds (to reproduce a calibration run; the report keeps "
                    "them out of its statistics).")
  flags.DEFINE_integer("parallel", 0, "Local runs at a time (0: as many as fit by cores "
                       "and free memory).")
  flags.DEFINE_integer("cpus_per_run", 1, "Local: CPU cores pinned to each run.")
  flags.DEFINE_float("mem_per_run_gb", 2.0, "Local: memory budget per run.")
  flags.DEFINE_float("run_timeout_s", 0.0, "Local: kill a run after this many seconds "
                     "(0: no limit).")
  flags.DEFINE_bool("report", True, "Build REPORT.md when the runs finish.")
  flags.DEFINE_string("slurm_time", "02:00:00", "SLURM: --time per run.")
  flags.DEFINE_integer("slurm_cpus_per_task", 4, "SLURM: --cpus-per-task.")
  flags.DEFINE_string("slurm_mem", "16G", "SLURM: --mem per run.")
  flags.DEFINE_integer("slurm_gpus_per_task", 0, "SLURM: --gpus-per-task.")
  flags.DEFINE_integer("slurm_nodes", 1, "SLURM: nodes per run (multi-host).")
  flags.DEFINE_integer("slurm_ntasks_per_node", 1, "SLURM: processes per node.")
  flags.DEFINE_string("slurm_partition", "", "SLURM: --partition.")
  flags.DEFINE_string("slurm_account", "", "SLURM: --account.")
  flags.DEFINE_integer("slurm_max_concurrent", 0, "SLURM: array %limit (0: none).")
  flags.DEFINE_multi_string("slurm_sbatch_arg", [], "SLURM: any other sbatch option, "
                            "repeatable, e.g. --slurm_sbatch_arg=--qos=high.")
  flags.DEFINE_integer("slurm_signal_s", 120, "SLURM: SIGTERM to the run this many seconds "
                       "before the time limit, so it checkpoints and requeues (0: none).")
  flags.DEFINE_bool("slurm_submit", True, "SLURM: submit and wait; false: only write "
                    "slurm_array.sbatch (submit it yourself with sbatch).")
  flags.DEFINE_float("slurm_poll_s", 30.0, "SLURM: seconds between scheduler queries.")
  flags.DEFINE_integer("slurm_max_resubmits", 2, "SLURM: times a run that stopped without "
                       "a result (preempted, timed out) is submitted again.")


def parse_overrides(sweep: Sweep, overrides: Sequence[str]) -> dict[str, Any]:
  """``--override`` values (``name=value``) as config values of the sweep's base."""
  return dict(parse_override(o, sweep.base) for o in overrides)


def prepare(sweep: Sweep, sweep_dir: str, overrides: Sequence[str],
            seeds: Sequence[int] = (), *, allow_calibration_seeds: bool = False
            ) -> tuple[Sweep, list[RunSpec]]:
  """Expands the sweep with ``name=value`` overrides (validated against the config).

  ``seeds``, if given, must be a subset of the declared evaluation seeds (a quicker
  partial sweep), or of the calibration seeds with ``allow_calibration_seeds``.
  """
  extra = parse_overrides(sweep, overrides)
  calibration: list[int] = []
  if seeds:
    calibration = [s for s in sweep.calibration_seeds if s in seeds]
    if calibration and not allow_calibration_seeds:
      raise ValueError(f"seeds {calibration} are calibration seeds of sweep "
                       f"{sweep.name!r}; pass --allow_calibration_seeds to rerun them")
    unknown = sorted(set(seeds) - set(sweep.seeds) - set(sweep.calibration_seeds))
    if unknown:
      raise ValueError(f"seeds {unknown} are not declared by sweep {sweep.name!r} "
                       f"(declared: {list(sweep.seeds)})")
    evaluation = tuple(s for s in sweep.seeds if s in seeds)
    runs = expand(sweep, sweep_dir, extra, seeds=evaluation, calibration_runs=calibration)
    if evaluation:
      sweep = dataclasses.replace(sweep, seeds=evaluation)
    return sweep, runs
  return sweep, expand(sweep, sweep_dir, extra)


def dirty_tree_refusal(name: str, git: dict, allow_dirty: bool) -> str | None:
  """Why a sweep may not start from this tree (None: it may)."""
  if git.get("dirty") and not allow_dirty:
    return (f"refusing to run sweep {name}: tracked files differ from commit "
            f"{git['commit'][:12]} (see `git status`), so the runs would not be "
            "reproducible from it. Commit first, or pass --allow_dirty (the report will "
            "say the tree was dirty).")
  return None


def stale_run_dirs(runs: Sequence[RunSpec], sweep_dir: str) -> list[str]:
  """Run directories under ``sweep_dir/runs`` that are not runs of this manifest."""
  root = os.path.join(sweep_dir, "runs")
  if not os.path.isdir(root):
    return []
  names = {r.run_name for r in runs}
  return sorted(d for d in os.listdir(root)
                if os.path.isdir(os.path.join(root, d)) and d not in names)


def write_tensorboard_experiment(sweep: Sweep, runs: Sequence[RunSpec], sweep_dir: str) -> None:
  """The HParams experiment summary over ``runs`` (one per sweep, in the first run's
  directory: :func:`launch.tensorboard_views.write_experiment`); a sequential sweep
  rewrites it at each look, so it covers every run scheduled so far."""
  hparams = swept_hparams(sweep, runs) or {sweep.seed_field: [r.seed for r in runs]}
  tensorboard_views.write_experiment(sweep_dir, [r.run_name for r in runs], hparams,
                                     sweep.metrics)


def record_duration(sweep_dir: str, wall_s: float, runs: int, parallel: int) -> None:
  """Adds the measured wall-clock of a local run to ``sweep.json``."""
  path = os.path.join(sweep_dir, "sweep.json")
  info = read_sweep_info(sweep_dir)
  info["measured"] = {"wall_s": round(wall_s, 1), "runs_executed": runs,
                      "parallel": parallel, "cpus": len(os.sched_getaffinity(0)),
                      "date": time.strftime("%Y-%m-%d")}
  with open(path, "w") as f:
    json.dump(info, f, indent=2, sort_keys=True)


def measured_duration(sweep: Sweep) -> str:
  """The duration of the sweep's committed run, from its report's ``sweep.json``."""
  if not sweep.report_dir:
    return "no committed report"
  path = os.path.join(REPO_DIR, sweep.report_dir, "sweep.json")
  if not os.path.exists(path):
    return f"not run yet ({sweep.report_dir})"
  with open(path) as f:
    info = json.load(f)
  m = info.get("measured")
  if m:
    return (f"{m['wall_s'] / 60:.1f} min wall for {m['runs_executed']} runs, "
            f"{m['parallel']} at a time on {m['cpus']} cores ({m['date']}, "
            f"{sweep.report_dir})")
  rows = os.path.join(REPO_DIR, sweep.report_dir, "results.jsonl")
  if os.path.exists(rows):  # reports from before durations were recorded
    with open(rows) as f:
      total = sum(json.loads(line).get("wall_s", 0.0) for line in f if line.strip())
    return (f"sweep duration not recorded; its runs' wall times sum to "
            f"{total / 60:.1f} min ({sweep.report_dir})")
  return f"no duration recorded ({sweep.report_dir})"


def list_sweeps() -> str:
  lines = []
  for name in registry.names():
    sweep = registry.get(name)
    n = len(sweep.arms) * len(sweep.seeds)
    lines.append(f"{name}: {len(sweep.arms)} arms x {len(sweep.seeds)} seeds = {n} runs "
                 f"(python -m {sweep.module}); {measured_duration(sweep)}")
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  # Building the declarations validates RL configs with JAX, whose backend probe logs
  # "Unable to initialize backend 'tpu'" on every CPU machine.
  log_filters.quiet_library_info()
  if FLAGS.list:
    print(list_sweeps())
    return 0
  if FLAGS.sweep is None:
    raise app.UsageError("--sweep is required (or --list)")
  sweep = registry.get(FLAGS.sweep)
  sweep_dir = FLAGS.sweep_dir or os.path.join("runs", "sweeps", sweep.name)
  if sweep.sequential is not None:
    return main_sequential(sweep, sweep_dir)
  sweep, runs = prepare(sweep, sweep_dir, FLAGS.override, [int(x) for x in FLAGS.seeds],
                        allow_calibration_seeds=FLAGS.allow_calibration_seeds)
  if FLAGS.dry_run:
    print(f"# sweep {sweep.name}: {len(runs)} runs "
          f"({len(sweep.arms)} arms x {len(sweep.seeds)} seeds) -> {repo_relative(sweep_dir)}")
    for r in runs:
      print(r.shell_command())
    return 0
  return _start(sweep, sweep_dir,
                lambda overrides: _run_sweep(sweep, runs, sweep_dir, overrides))


def _start(sweep: Sweep, sweep_dir: str, run: Callable[[dict[str, Any]], int]) -> int:
  """``run(overrides)`` from a clean tree (2 if dirty, unless --allow_dirty) while this
  process holds ``<sweep_dir>/.lock`` (2 if another process holds it)."""
  refusal = dirty_tree_refusal(sweep.name, git_state(), FLAGS.allow_dirty)
  if refusal:
    print(refusal, file=sys.stderr)
    return 2
  overrides = parse_overrides(sweep, FLAGS.override)
  try:
    lock = workdir_lib.lock_directory(sweep_dir)  # held until this process exits
  except workdir_lib.DirectoryLocked as e:
    print(f"refusing to run sweep {sweep.name}: {repo_relative(sweep_dir)} is in use by "
          f"another launch.sweep ({e.holder}); two sweeps on one directory would each "
          "take the other's runs for failures. Wait for it, stop it, or choose another "
          "--sweep_dir.", file=sys.stderr)
    return 2
  try:
    return run(overrides)
  finally:
    lock.close()


def _interrupted(stop: SweepInterrupted) -> int:
  """Reports a Ctrl-C'd sweep: the runs stopped with a checkpoint, the rest not started."""
  _print_unfinished(stop.outcomes)
  print(f"interrupted: {len(stop.not_started)} run(s) not started; rerun the same "
        "command to resume the stopped runs and start the rest (no report built)",
        file=sys.stderr)
  return INTERRUPTED_EXIT_CODE


def _run_sweep(sweep: Sweep, runs: Sequence[RunSpec], sweep_dir: str,
               overrides: dict[str, Any]) -> int:
  """Writes the manifest, runs the sweep (locally or on SLURM) and reports it."""
  stale = stale_run_dirs(runs, sweep_dir)
  if stale:
    print(f"refusing to run sweep {sweep.name}: {os.path.join(sweep_dir, 'runs')} holds "
          f"run directories that are not in this sweep's manifest ({', '.join(stale[:5])}"
          f"{', ...' if len(stale) > 5 else ''}); TensorBoard and the evidence would mix "
          "them with these runs. Remove them or choose another --sweep_dir.",
          file=sys.stderr)
    return 2
  manifest = write_manifest(sweep, runs, sweep_dir, overrides=overrides)
  write_tensorboard_experiment(sweep, runs, sweep_dir)
  print(f"manifest: {repo_relative(manifest)} ({len(runs)} runs)")
  if FLAGS.target == "slurm":
    options = SlurmOptions(
        time=FLAGS.slurm_time, cpus_per_task=FLAGS.slurm_cpus_per_task, mem=FLAGS.slurm_mem,
        gpus_per_task=FLAGS.slurm_gpus_per_task, nodes=FLAGS.slurm_nodes,
        ntasks_per_node=FLAGS.slurm_ntasks_per_node, partition=FLAGS.slurm_partition,
        account=FLAGS.slurm_account, max_concurrent=FLAGS.slurm_max_concurrent,
        signal_s=FLAGS.slurm_signal_s, extra=tuple(FLAGS.slurm_sbatch_arg))
    if not FLAGS.slurm_submit:
      script = write_array_script(runs, sweep_dir, sweep.name, options)
      print(f"submit with: sbatch {script}")
      print(f"then: python -m launch.report --sweep_dir={repo_relative(sweep_dir)}")
      return 0
    unavailable = scheduler_available()
    if unavailable:
      print(f"cannot submit sweep {sweep.name} to SLURM: {unavailable}", file=sys.stderr)
      return 2
    outcomes = run_slurm(runs, sweep_dir, sweep.name, options, poll_s=FLAGS.slurm_poll_s,
                         max_resubmits=FLAGS.slurm_max_resubmits)
    failed = [o for o in outcomes if not o.completed]
    for o in failed:
      state = f"{o.record.state}, exit {o.record.exit_code}" if o.record else "unknown state"
      print(f"FAILED {o.run_name} ({state}); log: {repo_relative(o.log_path)}",
            file=sys.stderr)
    return _finish(sweep_dir, failed)
  parallel = FLAGS.parallel or default_parallelism(FLAGS.cpus_per_run, FLAGS.mem_per_run_gb)
  t0 = time.monotonic()
  try:
    outcomes = run_local(runs, parallel=parallel, cpus_per_run=FLAGS.cpus_per_run,
                         timeout_s=FLAGS.run_timeout_s or None)
  except SweepInterrupted as stop:
    return _interrupted(stop)
  executed = [o for o in outcomes if o.returncode is not None]
  if executed:
    record_duration(sweep_dir, time.monotonic() - t0, len(executed), parallel)
  return _finish(sweep_dir, _print_unfinished(outcomes))


def _print_unfinished(outcomes: Sequence[RunOutcome]) -> list[RunOutcome]:
  """Prints a line per run that failed or stopped early; returns them."""
  unfinished = [o for o in outcomes if o.status in ("failed", "preempted")]
  for o in unfinished:
    what = ("PREEMPTED (checkpointed, no results row: rerun the sweep to resume it)"
            if o.status == "preempted" else "FAILED")
    print(f"{what} {o.run_name} (rc={o.returncode}); log: {repo_relative(o.log_path)}",
          file=sys.stderr)
  return unfinished


def main_sequential(sweep: Sweep, sweep_dir: str) -> int:
  """A sweep with a sequential plan: look by look (:mod:`launch.sequential_runner`),
  locally; a rerun resumes from the last recorded look."""
  if FLAGS.seeds:
    raise app.UsageError(f"sweep {sweep.name} is sequential: its plan runs the declared "
                         "seeds in order, so --seeds does not apply")
  if FLAGS.target != "local":
    raise app.UsageError(f"sweep {sweep.name} is sequential, which runs locally only "
                         "(each look waits for the previous one's results)")
  sweep, runs = prepare(sweep, sweep_dir, FLAGS.override)
  records = sequential_runner.read_looks(sweep_dir)
  if FLAGS.dry_run:
    outcomes = sequential_runner.sweep_outcomes_now(sweep, sweep_dir, len(records))
    batch = sequential_runner.next_batch(sweep, runs, outcomes, len(records))
    print(f"# sequential sweep {sweep.name}: looks at {list(sweep.sequential.looks())} "
          f"seeds, {len(records)} recorded; next look: {len(batch)} runs "
          f"-> {repo_relative(sweep_dir)}")
    for r in batch:
      print(r.shell_command())
    return 0
  return _start(sweep, sweep_dir,
                lambda overrides: _run_sequential(sweep, sweep_dir, runs, overrides))


def _run_sequential(sweep: Sweep, sweep_dir: str, runs: Sequence[RunSpec],
                    overrides: dict[str, Any]) -> int:
  """Runs a sequential sweep's looks (:mod:`launch.sequential_runner`) and reports it."""
  stale = stale_run_dirs(runs, sweep_dir)
  if stale:
    print(f"refusing to run sweep {sweep.name}: {os.path.join(sweep_dir, 'runs')} holds "
          f"run directories that are not runs of this sweep ({', '.join(stale[:5])}"
          f"{', ...' if len(stale) > 5 else ''}). Remove them or choose another --sweep_dir.",
          file=sys.stderr)
    return 2
  parallel = FLAGS.parallel or default_parallelism(FLAGS.cpus_per_run, FLAGS.mem_per_run_gb)
  outcomes = []

  def prepare_look(scheduled: list[RunSpec]) -> None:
    manifest = write_manifest(sweep, scheduled, sweep_dir, overrides=overrides)
    write_tensorboard_experiment(sweep, scheduled, sweep_dir)
    print(f"manifest: {repo_relative(manifest)} ({len(scheduled)} runs so far)")

  def run_batch(scheduled: list[RunSpec]) -> None:
    outcomes.extend(run_local(scheduled, parallel=parallel, cpus_per_run=FLAGS.cpus_per_run,
                              timeout_s=FLAGS.run_timeout_s or None))

  t0 = time.monotonic()
  try:
    result = sequential_runner.run_sequential(sweep, sweep_dir, runs, run_batch,
                                              prepare_look)
  except SweepInterrupted as stop:
    return _interrupted(stop)
  executed = [o for o in outcomes if o.returncode is not None]
  if executed:
    record_duration(sweep_dir, time.monotonic() - t0, len(executed), parallel)
  failed = _print_unfinished(outcomes)
  if result.missing:
    print(f"look {len(result.looks) + 1} is not complete ({len(result.missing)} runs without "
          "a results row); rerun the sweep to resume it", file=sys.stderr)
  return _finish(sweep_dir, failed or result.missing)


def _finish(sweep_dir: str, failed: Sequence[object]) -> int:
  """The report (unless --noreport) and the TensorBoard commands; 1 if any run failed."""
  if FLAGS.report:
    from launch import report  # pylint: disable=import-outside-toplevel
    path = report.build_report(sweep_dir)
    print(f"report: {repo_relative(path)}")
  if FLAGS.report:  # the report builds the arm view
    arms = repo_relative(os.path.join(sweep_dir, tensorboard_views.ARMS_DIR))
    print(f"tensorboard --logdir {arms} --host 127.0.0.1 --port 6006   # one run per arm: "
          "mean and 95% band")
  print(f"tensorboard --logdir {repo_relative(os.path.join(sweep_dir, 'runs'))} "
        "--host 127.0.0.1 --port 6006   # every run")
  return 1 if failed else 0


if __name__ == "__main__":
  define_flags()
  app.run(lambda argv: sys.exit(main(argv)), flags_parser=parse_flags)
