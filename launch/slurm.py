"""A SLURM job-array script for a sweep: array task i runs manifest line i.

Every run is started as a job step (``srun``), so ``scancel --signal=TERM <job>_<i>``
reaches it; a run spanning several tasks (``ntasks > 1``) then detects SLURM and calls
``jax.distributed.initialize()``, which reads ranks and the coordinator from SLURM. The
script ``cd``s to this checkout and runs the interpreter that wrote it, so both (and the
sweep directory) must be on a filesystem the compute nodes share.

Preemption: the script asks for ``--requeue`` and ``--signal=B:TERM@<signal_s>``. When
the batch shell gets SIGTERM (the time limit is ``signal_s`` away, or an operator's
``scancel --batch --signal=TERM``) it passes SIGTERM on to the run's processes. A run that
gets SIGTERM checkpoints and exits with :data:`PREEMPTED_EXIT_CODE`; if its task is still
RUNNING (not being cancelled, timed out or preempted by the scheduler) the script then
requeues it (``scontrol requeue``), and it restarts from the checkpoint (every manifest
command carries ``--resume``). Any other status ends the task with it; the launcher
(:mod:`launch.slurm_runner`) submits again what stopped resumably without a result.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from typing import Sequence

from experiments.common.harness.preemption import PREEMPTED_EXIT_CODE
from experiments.common.harness.repo_paths import REPO_DIR
from launch.manifest import RunSpec


@dataclasses.dataclass(frozen=True)
class SlurmOptions:
  """Resources per array task (one run), and how a task is preempted.

  ``signal_s``: seconds before the time limit at which the batch shell gets SIGTERM
  (``--signal=B:TERM@signal_s``; 0: none), time for the run to checkpoint. SLURM may
  send it up to a minute early. ``extra``: further sbatch options, each ``--name=value``
  (e.g. ``--qos=high``, ``--constraint=a100``).
  """

  time: str = "02:00:00"
  cpus_per_task: int = 4
  mem: str = "16G"
  gpus_per_task: int = 0
  nodes: int = 1
  ntasks_per_node: int = 1
  partition: str = ""
  account: str = ""
  max_concurrent: int = 0  # 0: no limit on simultaneously running array tasks
  signal_s: int = 120
  extra: tuple[str, ...] = ()

  def __post_init__(self):
    for name in ("cpus_per_task", "nodes", "ntasks_per_node"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
    for name in ("gpus_per_task", "max_concurrent", "signal_s"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
    for arg in self.extra:
      if not arg.startswith("--") or any(c.isspace() for c in arg):
        raise ValueError(f"extra sbatch option {arg!r} is not of the form --name[=value]")

  @property
  def num_tasks(self) -> int:
    return self.nodes * self.ntasks_per_node


def array_spec(indices: Sequence[int], max_concurrent: int = 0) -> str:
  """``--array`` value for these task indices: ``0-3,5`` (plus ``%limit``)."""
  if not indices:
    raise ValueError("no array indices")
  idx = sorted(set(indices))
  if idx[0] < 0:
    raise ValueError(f"array indices must be >= 0, got {idx[0]}")
  parts, lo = [], idx[0]
  for prev, cur in zip(idx, idx[1:] + [None]):
    if cur != prev + 1:
      parts.append(str(lo) if lo == prev else f"{lo}-{prev}")
      lo = cur
  return ",".join(parts) + (f"%{max_concurrent}" if max_concurrent else "")


def _directives(options: SlurmOptions, job_name: str, num_runs: int, sweep_dir: str
                ) -> list[str]:
  """The script's ``#SBATCH`` lines."""
  o = options
  lines = [
      "#!/bin/bash",
      f"#SBATCH --job-name={job_name}",
      f"#SBATCH --array={array_spec(range(num_runs), o.max_concurrent)}",
      f"#SBATCH --output={sweep_dir}/slurm/%A_%a.out",
      "#SBATCH --open-mode=append",
      "#SBATCH --requeue",
      f"#SBATCH --time={o.time}",
      f"#SBATCH --nodes={o.nodes}",
      f"#SBATCH --ntasks-per-node={o.ntasks_per_node}",
      f"#SBATCH --cpus-per-task={o.cpus_per_task}",
      f"#SBATCH --mem={o.mem}",
  ]
  if o.signal_s:
    lines.append(f"#SBATCH --signal=B:TERM@{o.signal_s}")
  if o.gpus_per_task:
    lines.append(f"#SBATCH --gpus-per-task={o.gpus_per_task}")
  if o.partition:
    lines.append(f"#SBATCH --partition={o.partition}")
  if o.account:
    lines.append(f"#SBATCH --account={o.account}")
  lines += [f"#SBATCH {arg}" for arg in o.extra]
  return lines


def _task_lines(options: SlurmOptions, commands: str, workdirs: str) -> list[str]:
  """The array task's shell: run line i of ``commands`` in its workdir, pass SIGTERM
  on, and requeue a preempted run that is still RUNNING."""
  o = options
  # srun explicitly gets --cpus-per-task: "The number of cpus per task specified for
  # salloc or sbatch is not automatically inherited by srun" (srun(1), SLURM 22.05).
  srun = "srun --cpus-per-task=${SLURM_CPUS_PER_TASK}"
  if o.num_tasks > 1:
    srun += " --kill-on-bad-exit=1"  # a lone surviving process would wait in a collective
  return [
      "set -uo pipefail",
      f"cd {shlex.quote(REPO_DIR)}",
      f'CMD=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" {shlex.quote(commands)})',
      f'WORKDIR=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" {shlex.quote(workdirs)})',
      'TASK="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
      "# The run's output where the local runner puts it (the scheduler's own messages",
      "# stay in slurm/<job>_<task>.out).",
      'mkdir -p "${WORKDIR}" && exec >>"${WORKDIR}/launch.log" 2>&1',
      'echo "array task ${TASK} (job ${SLURM_JOB_ID}, restart ${SLURM_RESTART_COUNT:-0}) '
      'on $(hostname) at $(date -Is): ${CMD}"',
      "# SIGTERM to this shell (time limit near, or a preemption notice): pass it on to",
      "# the run's processes, which checkpoint and exit "
      f"{PREEMPTED_EXIT_CODE}.",
      'term_seen=""',
      'on_term() { term_seen=1; echo "batch shell got SIGTERM: signalling the run"; '
      'scancel --signal=TERM "${TASK}"; }',
      "trap on_term TERM",
      # A job step, so `scancel --signal=TERM <task>` reaches the run itself.
      f'{srun} bash -c "exec ${{CMD}}" &',
      "child=$!",
      'wait "${child}"; rc=$?',
      "# A trap makes wait return early (status > 128): wait again for the run's status.",
      'while [ "${rc}" -gt 128 ] && [ -n "${term_seen}" ]; do',
      '  term_seen=""; wait "${child}"; rc=$?',
      "done",
      'echo "run exited with status ${rc} at $(date -Is)"',
      "# Requeue only a task still RUNNING: one being cancelled (scancel), timed out or",
      "# preempted by the scheduler is not this script's to bring back.",
      "state=$(scontrol -o show job \"${TASK}\" 2>/dev/null | grep -o 'JobState=[A-Z_]*')",
      f'if [ "${{rc}}" -eq {PREEMPTED_EXIT_CODE} ] && '
      '[ "${state}" = JobState=RUNNING ]; then',
      "  trap - TERM",
      '  echo "preempted: requeueing ${TASK}; it resumes from its last checkpoint"',
      '  scontrol requeue "${TASK}" && exit 0',
      '  echo "scontrol requeue failed; the launcher resubmits the run"',
      f'elif [ "${{rc}}" -eq {PREEMPTED_EXIT_CODE} ]; then',
      '  echo "stopped with the task ${state#JobState=}: not requeueing it"',
      "fi",
      'exit "${rc}"',
  ]


def write_array_script(runs: Sequence[RunSpec], sweep_dir: str, job_name: str,
                       options: SlurmOptions = SlurmOptions()) -> str:
  """Writes ``commands.txt`` (line i: run i's shell command) and ``slurm_array.sbatch``.

  Also ``slurm/workdirs.txt`` (line i: run i's workdir). Returns the sbatch script path;
  ``sbatch <path>`` submits every run, ``sbatch --array=1,3 <path>`` some. A run's output
  is appended to ``<workdir>/launch.log`` (as the local runner does), across requeues;
  the scheduler's messages go to ``<sweep_dir>/slurm/<job>_<task>.out``.
  """
  if not runs:
    raise ValueError("no runs to write")
  if sorted(r.index for r in runs) != list(range(len(runs))):
    raise ValueError("runs must be a whole manifest (indices 0..n-1)")
  sweep_dir = os.path.abspath(sweep_dir)
  os.makedirs(os.path.join(sweep_dir, "slurm"), exist_ok=True)
  commands = os.path.join(sweep_dir, "commands.txt")
  workdirs = os.path.join(sweep_dir, "slurm", "workdirs.txt")
  with open(commands, "w") as f, open(workdirs, "w") as w:
    for r in sorted(runs, key=lambda r: r.index):
      # The interpreter that wrote the script (its environment has the project installed).
      f.write(r.shell_command().replace("python", shlex.quote(sys.executable), 1) + "\n")
      if "\n" in r.workdir:
        raise ValueError(f"workdir {r.workdir!r} contains a newline")
      w.write(r.workdir + "\n")
  lines = (_directives(options, job_name, len(runs), sweep_dir)
           + _task_lines(options, commands, workdirs))
  path = os.path.join(sweep_dir, "slurm_array.sbatch")
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  os.chmod(path, 0o755)
  return path
