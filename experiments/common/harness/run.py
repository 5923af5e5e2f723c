"""One run of an experiment: what every experiment's ``train_and_evaluate`` repeats.

    with run_lib.open_run(EXPERIMENT, config, options) as run:
      start = run.restore(fresh, metadata={"vocab_size": v})   # or resumed
      result = run_loop(start=start, ..., settings=run.settings(config.num_steps),
                        writer=run.writer, checkpointer=run.checkpointer)
      summary = run_summary(EXPERIMENT, options, config, result, start_time=run.t0, ...)
      run.finish(summary, completed=result.completed, step=result.snapshot.step)

:func:`open_run` claims and locks the run directory (refusing a completed run of
another config, a live holder, a resume of another config:
:func:`experiments.common.harness.workdir.claim`), opens the checkpointer (with the config its
checkpoints carry) and the TensorBoard writer; :meth:`Run.restore` resumes or starts
fresh and writes the run's metadata and, for a fresh run, its HParams session;
:meth:`Run.settings` builds the loop's schedule from the config's periodic fields
(``log_every``, ``eval_every``, ..., declared with
:func:`experiments.common.harness.train_loop.periodic_field`) and the options'
``stop_at_step``; :meth:`Run.finish` closes the checkpointer and
writes the final scalars, the results row and the completion mark. A paper supplies its
model, data, step and metrics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from typing import Any, Callable, Iterator, Mapping

from absl import logging

from experiments.common.evidence.results import finish_run, run_summary
from experiments.common.evidence.tensorboard_writer import MetricWriter
from experiments.common.harness import run_metadata
from experiments.common.harness import workdir as workdir_lib
from experiments.common.harness.checkpoint import Checkpointer, Snapshot
from experiments.common.harness.train_loop import (LoopResult, LoopSettings, periodic_settings,
                                                   restore_or_initialize)


@dataclasses.dataclass
class Run:
  """An open run (see the module docstring); ``checkpointer`` is None for a run that
  checkpoints nothing (an evaluation of seconds)."""

  experiment: str
  config: Any
  options: Any
  writer: MetricWriter
  checkpointer: Checkpointer | None
  writer_process: bool
  hparams: Mapping[str, Any] | None
  t0: float = dataclasses.field(default_factory=time.time)
  start: Snapshot | None = None

  def restore(self, fresh: Callable[[], Snapshot], *,
              metadata: Mapping[str, Any] | Callable[[Snapshot], Mapping[str, Any]] = (),
              ) -> Snapshot:
    """The snapshot to train from: the checkpoint a resume asks for, else ``fresh()``;
    then the run's metadata (``config.json``, with ``metadata``, or ``metadata(start)``)
    and, for a fresh run, its HParams session."""
    self.start = restore_or_initialize(self.checkpointer, self.options.resume, fresh,
                                       resume_step=self.options.resume_step)
    self.record(metadata(self.start) if callable(metadata) else metadata,
                hparams=self.start.step == 0)
    return self.start

  def record(self, metadata: Mapping[str, Any] = (), *, hparams: bool = True) -> None:
    """Writes ``config.json`` (with ``metadata``) and, with ``hparams``, the HParams
    session (a run that restores nothing calls this instead of :meth:`restore`)."""
    if not self.writer_process:
      return
    run_metadata.write_run_metadata(self.options.workdir, self.config, self.options,
                                    {"experiment": self.experiment, **dict(metadata)})
    if hparams:
      self.writer.write_hparams(
          dict(self.hparams) if self.hparams is not None
          else dataclasses.asdict(self.config), trial_id=self.options.run_name)

  def settings(self, num_steps: int, **overrides: Any) -> LoopSettings:
    """The loop's schedule: the config's periodic fields, the options' stop step,
    ``overrides`` for the rest (``max_healthy_loss``, ``every_step_scalars``, ...)."""
    # A config without histograms (it declares no histogram_every) draws none.
    fields = {"histogram_every": 0, **periodic_settings(self.config)}
    stop, first = self.options.stop_at_step, 0 if self.start is None else self.start.step
    if stop and not first < stop < num_steps:
      logging.warning("--stop_at_step=%d does nothing: this run goes from step %d to %d "
                      "and completes", stop, first, num_steps)
    return LoopSettings(num_steps=num_steps, stop_at_step=self.options.stop_at_step,
                        **{**fields, **overrides})

  def finish_evaluation(self, metrics: dict[str, float], *, num_params: int
                        ) -> dict[str, Any]:
    """Closes a run that trains nothing (an evaluation): ``metrics`` as scalars at
    step 1 (the HParams metrics) and one results row; returns the summary."""
    result = LoopResult(snapshot=Snapshot(None, None, 1, 0), completed=True,
                        train_metrics={}, eval_metrics={}, steps_per_s=math.nan,
                        wall_s=time.time() - self.t0)
    summary = run_summary(self.experiment, self.options, self.config, result,
                          start_time=self.t0, num_params=num_params, resumed_from_step=0,
                          metrics=metrics)
    return self.finish(summary, completed=True, step=1)

  def finish(self, summary: dict[str, Any], *, completed: bool, step: int
             ) -> dict[str, Any]:
    """Closes the run: the checkpointer, then (the writing process) the summary scalars,
    the HParams end, the results row and the completion mark; returns ``summary``."""
    if self.checkpointer is not None:
      self.checkpointer.close()
    if self.writer_process:
      finish_run(self.writer, self.options.results_file, summary, completed=completed,
                 step=step, workdir=self.options.workdir)
    else:
      self.writer.close()
    return summary


@contextlib.contextmanager
def open_run(experiment: str, config: Any, options: Any, *, checkpoints: bool = True,
             hparams: Mapping[str, Any] | None = None, writer_process: bool = True
             ) -> Iterator[Run]:
  """Claims ``options.workdir`` for one run of ``config`` and yields the open :class:`Run`.

  Args:
    experiment: the experiment's name (recorded in ``config.json``).
    config, options: the run's config and resolved :class:`RunOptions`.
    checkpoints: False for a run that checkpoints nothing.
    hparams: the HParams session's values (default: every config field).
    writer_process: False on the non-writing processes of a multi-process job.
  """
  directory = os.path.join(options.workdir, "checkpoints")
  completed = workdir_lib.completion_record(options.workdir) is not None
  if writer_process and not completed:
    # One line naming the directory, not orbax's traceback from inside its manager.
    workdir_lib.check_run_dir_writable(options.workdir)
  # A completed run is only read (claim refuses it), and may sit on a read-only mount.
  checkpointer = (Checkpointer(directory, config=config)
                  if checkpoints and (not completed or os.path.isdir(directory)) else None)
  with workdir_lib.claim(options.workdir, results_file=options.results_file,
                         resume=options.resume, config=config, checkpointer=checkpointer,
                         writer_process=writer_process):
    writer = MetricWriter(options.workdir, enabled=writer_process)
    yield Run(experiment, config, options, writer, checkpointer, writer_process, hparams)
