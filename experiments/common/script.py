"""An experiment's command line: flags -> config -> one run -> where its results are.

Each ``experiments/<paper>/__main__.py`` is ``script.run(ConfigClass, EXPERIMENT,
train_and_evaluate)``: one flag per config field and per :class:`RunOptions` field
(all listed by ``--help``), the run, then its final metrics and the paths of its
events, config record, checkpoints and results row, with the ``tensorboard`` command.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

from absl import app, flags

from experiments.common import distributed
from experiments.common import log_filters
from experiments.common.config_flags import config_from_flags, define_flags
from experiments.common.run_options import RunOptions, resolve_run_options

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
    print("no results row (stopped early); continue with --resume")
  # The parent directory: TensorBoard then names the run after its directory and fills
  # the HParams table from every run's session there.
  print(f"view: tensorboard --logdir {_shown(os.path.dirname(workdir))} --host 127.0.0.1 "
        f"--port 6006   (this run: {os.path.basename(workdir)})")


def main_for(config_cls: type, experiment: str, train_and_evaluate: TrainFn, *,
             setup: Callable[[], None] | None = None) -> Callable[[list[str]], None]:
  """The absl ``main`` of an experiment: ``setup()`` (script-only settings), the run,
  and :func:`print_run` on the writing process."""

  def main(argv: list[str]) -> None:
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    log_filters.quiet_library_info()
    if setup is not None:
      setup()
    config = config_from_flags(config_cls)
    options = resolve_run_options(config_from_flags(RunOptions), experiment, config)
    summary = train_and_evaluate(config, options)
    if distributed.is_writer():
      print_run(summary, options)

  return main


def run(config_cls: type, experiment: str, train_and_evaluate: TrainFn, *,
        setup: Callable[[], None] | None = None) -> None:
  """Defines the flags and runs :func:`main_for` (call from ``__main__`` only)."""
  define_script_flags(config_cls, RunOptions)
  app.run(main_for(config_cls, experiment, train_and_evaluate, setup=setup))
