"""Per-run options that are not part of an experiment's config: where to write, resume, etc."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

from experiments.common.harness.config_flags import check_fields, config_field


@dataclasses.dataclass(frozen=True)
class RunOptions:
  """Where a run writes and how it is launched (not part of the experiment's results)."""

  workdir: str = config_field(
      "", "Run directory: TensorBoard events, config.json, checkpoints/. Default: "
      "runs/<experiment>/<run_name> under the current directory.")
  run_name: str = config_field(
      "", "Name of this run (TensorBoard trial id, results row). Default: basename of workdir.")
  results_file: str = config_field(
      "", "JSONL file to append the final results row to. Default: <workdir>/results.jsonl.")
  resume: bool = config_field(
      False, "Continue from the latest checkpoint in --workdir (start fresh if there is none). "
      "Without it, a workdir that already holds checkpoints is an error.")
  resume_step: int = config_field(
      -1, "With --resume: continue from this checkpoint step instead of the newest intact "
      "one (e.g. the last healthy checkpoint before a divergence, which is always kept); "
      "the newer checkpoints are deleted. -1: the newest.", domain="[-1, inf)")
  stop_at_step: int = config_field(
      0, "If > 0, checkpoint and exit after this step as if preempted (no results row). "
      "For testing resume; the schedule still follows --num_steps.", domain="[0, inf)")
  coordinator_address: str = config_field(
      "", "host:port of process 0 for jax.distributed.initialize. Empty: auto-detect a "
      "cluster (SLURM/Open MPI/Cloud TPU/Kubernetes) or run single-process.")
  num_processes: int = config_field(
      0, "Number of processes in the job (with --coordinator_address).", domain="[0, inf)")
  process_id: int = config_field(
      -1, "This process's index in the job (with --coordinator_address).", domain="[-1, inf)")
  single_process: bool = config_field(
      False, "Never call jax.distributed.initialize, even if a cluster is detected.")

  def __post_init__(self):
    check_fields(self)


def default_run_name(config: Any, max_len: int = 48) -> str:
  """A run name from how ``config`` differs from its class's defaults.

  ``default`` for the defaults; else ``field=value`` pairs joined by ``,`` in field
  order (``recipe=mxfp8,seed=1``); past ``max_len`` characters, the first pairs and a
  hash of the whole config, so different configs never share a default directory.
  """
  if config is None:
    return "default"
  defaults = type(config)()
  changed = [f"{f.name}={getattr(config, f.name)}" for f in dataclasses.fields(config)
             if getattr(config, f.name) != getattr(defaults, f.name)]
  if not changed:
    return "default"
  name = ",".join(changed).replace(os.sep, "_")
  if len(name) <= max_len:
    return name
  digest = hashlib.sha1(json.dumps(dataclasses.asdict(config), sort_keys=True,
                                   default=str).encode()).hexdigest()[:8]
  return f"{name[:max_len - 9]}-{digest}"


def check_run_name(name: str) -> None:
  """Raises ValueError unless ``name`` is one plain path component: it names the run's
  directory under ``runs/<experiment>/``, and ``../x`` or ``a/b`` would write outside
  it or into another run's."""
  seps = {os.sep, os.altsep} - {None}
  if name in (".", "..") or any(sep in name for sep in seps) or "\0" in name:
    raise ValueError(f"run_name {name!r} is not a plain name (one path component: no "
                     f"{' or '.join(sorted(seps))}, not '.' or '..'); pass another "
                     "--run_name, or --workdir to choose the directory")


def resolve_run_options(options: RunOptions, experiment: str, config: Any = None
                        ) -> RunOptions:
  """Fills the defaults that depend on each other and makes paths absolute.

  The default workdir is ``runs/<experiment>/<run_name>``, the run name defaulting to
  :func:`default_run_name` of ``config`` (so runs that differ, e.g. by ``--recipe``, get
  their own directories). orbax refuses relative checkpoint paths, so every path is
  made absolute here, once.
  """
  if options.num_processes < 0:
    raise ValueError(f"num_processes must be >= 0, got {options.num_processes}")
  if options.stop_at_step < 0:
    raise ValueError(f"stop_at_step must be >= 0, got {options.stop_at_step}")
  if options.resume_step < -1:
    raise ValueError(f"resume_step must be >= -1 (-1: the newest), got {options.resume_step}")
  if options.resume_step >= 0 and not options.resume:
    raise ValueError(f"resume_step={options.resume_step} needs --resume")
  if options.process_id < -1:
    raise ValueError(f"process_id must be >= -1, got {options.process_id}")
  run_name = options.run_name
  if run_name:
    check_run_name(run_name)
  workdir = options.workdir
  if not workdir:
    workdir = os.path.join("runs", experiment, run_name or default_run_name(config))
  workdir = os.path.abspath(workdir)
  run_name = run_name or os.path.basename(workdir.rstrip(os.sep))
  results_file = os.path.abspath(options.results_file or os.path.join(workdir, "results.jsonl"))
  return dataclasses.replace(options, workdir=workdir, run_name=run_name,
                             results_file=results_file)
