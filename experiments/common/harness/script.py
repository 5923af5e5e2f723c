"""An experiment's command line: flags -> config -> one run -> where its results are.

Each ``experiments/<paper>/__main__.py`` is ``script.run(ConfigClass, EXPERIMENT,
train_and_evaluate)``: one flag per config field and per :class:`RunOptions` field
(all listed by ``--help``), the run, then its final metrics and the paths of its
events, config record, checkpoints and results row, with the ``tensorboard`` command.
"""

from __future__ import annotations

import errno
import os
import shlex
import sys
from typing import Any, Callable

from absl import app, flags

from experiments.common.harness import distributed
from experiments.common.harness import log_filters
from experiments.common.harness import private_dirs
from experiments.common.harness import workdir as workdir_lib
from experiments.common.harness.checkpoint import Checkpointer, CheckpointError
from experiments.common.harness.config_flags import (ConfigError, config_from_flags, define_flags,
                                                     parse_flags)
from experiments.common.harness.preemption import PREEMPTED_EXIT_CODE
from experiments.common.harness.run_options import RunOptions, resolve_run_options

# Exit statuses of an experiment script (documented in the README):
# 0 completed (or already completed: nothing trained, its results row restored if it
# was lost); 1 an error; 2 a usage or config error, or a refusal, before training;
# 75 stopped early with a checkpoint (preempted by SIGTERM or Ctrl-C: rerun with
# --resume); 74 (EX_IOERR) out of disk space; 130 a second Ctrl-C, or one before the
# loop (no new checkpoint).
DISK_FULL_EXIT_CODE = 74
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as a shell reports a Ctrl-C

TrainFn = Callable[[Any, RunOptions], dict[str, Any]]


def define_script_flags(*classes: type, flag_values: flags.FlagValues = flags.FLAGS
                        ) -> None:
  """An entry point's flags: one per field of each config class, listed by ``--help``.

  ``--help`` shows the main module's key flags; a script run as ``python -m pkg`` is
  ``pkg/__main__.py``, so the flags are registered as key flags of that file.
  """
  for cls in classes:
    for name in define_flags(cls, flag_values):
      flag_values.register_key_flag_for_module(sys.argv[0], flag_values[name])


def _shown(path: str) -> str:
  """``path`` relative to the current directory when it lies inside it."""
  rel = os.path.relpath(path)
  return path if rel.startswith(os.pardir) else rel


def print_run(summary: dict[str, Any], options: RunOptions) -> None:
  """The run's final metrics and where everything it wrote is."""
  workdir = options.workdir
  print(f"\nrun {summary['run_name']}: {'completed' if summary['completed'] else 'stopped'} "
        f"at step {summary['step']}")
  for name, value in sorted(summary["metrics"].items()):
    print(f"  {name:30s} {value:.4f}")
  if "steps_per_s" in summary:
    print(f"  {'steps/s':30s} {summary['steps_per_s']:.2f}")
  print(f"TensorBoard events: {_shown(workdir)}")
  print(f"config + git commit: {_shown(os.path.join(workdir, 'config.json'))}")
  print(f"checkpoints:        {_shown(os.path.join(workdir, 'checkpoints'))}")
  if summary["completed"]:
    print(f"results row:        {_shown(options.results_file)}")
  else:
    print(f"no results row (stopped early); continue with: {resume_command()}")
  print(f"view: tensorboard --logdir {_shown(view_dir(workdir, summary['experiment']))} "
        f"--host 127.0.0.1 --port 6006   (this run: {os.path.basename(workdir)})")


def view_dir(workdir: str, experiment: str) -> str:
  """The directory to point TensorBoard at for a run: its experiment's directory when
  the run sits in the default layout (``runs/<experiment>/<run>``: TensorBoard then
  names each run after its directory and fills the HParams table from all of them),
  else the run's own directory (never an arbitrary parent)."""
  parent = os.path.dirname(os.path.abspath(workdir))
  return parent if os.path.basename(parent) == experiment else workdir


def main_for(config_cls: type, experiment: str, train_and_evaluate: TrainFn
             ) -> Callable[[list[str]], None]:
  """The absl ``main`` of an experiment: the compilation cache
  (:func:`turn_on_compilation_cache`), the run (:func:`train_or_exit`), and
  :func:`print_run` on the writing process."""

  def main(argv: list[str]) -> None:
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    log_filters.quiet_library_info()
    turn_on_compilation_cache(experiment)
    try:
      config = config_from_flags(config_cls)
      options = resolve_run_options(config_from_flags(RunOptions), experiment, config)
    except (ValueError, TypeError) as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
    summary = train_or_exit(train_and_evaluate, config, options)
    if distributed.is_writer():
      print_run(summary, options)
    if not summary["completed"]:
      sys.exit(PREEMPTED_EXIT_CODE)

  return main


def train_or_exit(train_and_evaluate: TrainFn, config: Any, options: RunOptions
                  ) -> dict[str, Any]:
  """``train_and_evaluate(config, options)``, or the script's exit on what a user can act
  on (see the exit statuses above), with one line saying what happened and what to do;
  anything else propagates (exit 1, with its traceback)."""
  try:
    return train_and_evaluate(config, options)
  except workdir_lib.RunAlreadyCompleted as e:
    print(e)
    sys.exit(0)
  except (workdir_lib.WorkdirInUse, workdir_lib.RunRefused, workdir_lib.NotWritable,
          ConfigError, CheckpointError, FileExistsError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  except KeyboardInterrupt:
    # Ctrl-C inside the loop checkpoints (a preemption); this is one outside it, or
    # a second one that stopped the checkpoint: say where the run can go on from.
    print(f"interrupted (Ctrl-C) with no new checkpoint; last good checkpoint: "
          f"{_last_checkpoint(options.workdir)}. Continue with: {resume_command()}",
          file=sys.stderr)
    sys.exit(INTERRUPTED_EXIT_CODE)
  except BaseException as e:  # pylint: disable=broad-except
    if _disk_full(e):
      print(f"error: no space left on device while writing the run in "
            f"{options.workdir}; last good checkpoint: {_last_checkpoint(options.workdir)}. "
            f"Free space, then continue with: {resume_command()} (cause: "
            f"{_first_line(e)[:160]})", file=sys.stderr)
      sys.exit(DISK_FULL_EXIT_CODE)
    raise


_NOT_RESUMED = ("resume", "noresume", "stop_at_step", "resume_step")


def resume_command(argv: list[str] | None = None, module: str | None = None) -> str:
  """The command that continues this run: this process's command line (``argv``,
  default ``sys.argv``; ``module``, default the ``-m`` module it runs) with
  ``--resume``, so it names the same flags and therefore the same run directory (a bare
  ``--resume`` resumes the default config's run, another one). ``--stop_at_step`` and
  ``--resume_step`` are left out: the first would stop nothing again, the second would
  go back past the checkpoints written since."""
  argv = list(sys.argv if argv is None else argv)
  if module is None:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    module = spec.name.removesuffix(".__main__") if spec is not None else None
  program = f"python -m {module}" if module else f"python {shlex.quote(argv[0])}"
  given, args = [], iter(argv[1:])
  for arg in args:
    name = arg.split("=", 1)[0].lstrip("-")
    if name not in _NOT_RESUMED:
      given.append(arg)
    elif "=" not in arg and name not in ("resume", "noresume"):
      next(args, None)  # ``--stop_at_step 4``: its value is the next argument
  return " ".join([program, *map(shlex.quote, given), "--resume"])


def _first_line(e: BaseException) -> str:
  text = str(e).strip()
  return (text.splitlines()[0][:200] if text else type(e).__name__)


def _disk_full(e: BaseException) -> bool:
  """Whether ``e`` (or an exception it came from) is a full disk: ENOSPC, or the
  message a library wraps it in."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
      return True
    if "No space left on device" in str(e):
      return True
    e = e.__cause__ or e.__context__
  return False


def _last_checkpoint(workdir: str) -> str:
  try:
    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"))
    steps = checkpointer.all_steps()
    checkpointer.close()
  except Exception:  # pylint: disable=broad-except  (reporting only)
    return "unknown"
  return f"step {steps[-1]} in {os.path.join(workdir, 'checkpoints')}" if steps else "none"


def turn_on_compilation_cache(experiment: str) -> str | None:
  """Turns on JAX's persistent compilation cache for this process and returns its
  directory, or turns the cache off with one warning and returns None when that
  directory is not private to this user.

  The directory is ``$JAX_COMPILATION_CACHE_DIR`` when set, else this user's
  ``<cache home>/lowprec/jax_cache_<experiment>``
  (:func:`experiments.common.harness.private_dirs.default_cache_dir`: created 0700). JAX loads
  whatever executable it finds there without checking who wrote it, so a directory
  another user owns or can write (or swap: a writable directory above it without the
  sticky bit) would let them choose the native code this run executes; such a
  directory is not used (:func:`experiments.common.harness.private_dirs.unsafe_reason`). A
  remote cache (``gs://...``) is used as given.

  Every experiment script does this first: a sweep's runs of one arm compile the same
  programs (only data values differ by seed), and a resumed run the programs its first
  part compiled, so each later run loads them instead of compiling them again (JAX's
  default floor: programs that took 1 s or more to compile; only process 0 of a
  multi-process job writes). A hit is the executable the same lowered program compiles
  to, so results are unchanged; only ``perf/first_step_s`` drops. Script-only: library
  callers (tests) are unaffected."""
  import jax  # pylint: disable=import-outside-toplevel
  explicit = os.environ.get("JAX_COMPILATION_CACHE_DIR", "")
  try:
    if "://" in explicit:
      directory = explicit
    elif explicit:
      directory = private_dirs.private_directory(explicit)
    else:
      directory = private_dirs.default_cache_dir(f"jax_cache_{experiment}")
  except OSError as e:
    jax.config.update("jax_enable_compilation_cache", False)
    print(f"warning: compilation cache off: {e}. Set JAX_COMPILATION_CACHE_DIR to a "
          "directory only you can write to keep it on.", file=sys.stderr)
    return None
  jax.config.update("jax_compilation_cache_dir", directory)
  return directory


def run(config_cls: type, experiment: str, train_and_evaluate: TrainFn) -> None:
  """Defines the flags and runs :func:`main_for` (call from ``__main__`` only)."""
  define_script_flags(config_cls, RunOptions)
  app.run(main_for(config_cls, experiment, train_and_evaluate), flags_parser=parse_flags)
