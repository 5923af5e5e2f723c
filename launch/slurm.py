"""A SLURM job-array script for a sweep: array task i runs manifest line i.

Single-node runs need nothing else. A run spanning several tasks (``ntasks > 1``) is
started with ``srun``; the entry point then detects SLURM and calls
``jax.distributed.initialize()``, which reads ranks and the coordinator from SLURM.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from typing import Sequence

from experiments.common.repo_paths import REPO_DIR
from launch.manifest import RunSpec


@dataclasses.dataclass(frozen=True)
class SlurmOptions:
  """Resources per array task (one run)."""

  time: str = "02:00:00"
  cpus_per_task: int = 4
  mem: str = "16G"
  gpus_per_task: int = 0
  nodes: int = 1
  ntasks_per_node: int = 1
  partition: str = ""
  account: str = ""
  max_concurrent: int = 0  # 0: no limit on simultaneously running array tasks

  def __post_init__(self):
    for name in ("cpus_per_task", "nodes", "ntasks_per_node"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def write_array_script(runs: Sequence[RunSpec], sweep_dir: str, job_name: str,
                       options: SlurmOptions = SlurmOptions()) -> str:
  """Writes ``commands.txt`` (one shell command per line) and ``slurm_array.sbatch``.

  Returns the sbatch script path; submit it with ``sbatch <path>``.
  """
  if not runs:
    raise ValueError("no runs to write")
  sweep_dir = os.path.abspath(sweep_dir)
  os.makedirs(os.path.join(sweep_dir, "slurm"), exist_ok=True)
  commands = os.path.join(sweep_dir, "commands.txt")
  with open(commands, "w") as f:
    for r in sorted(runs, key=lambda r: r.index):
      # The interpreter that wrote the script (its environment has the project installed).
      f.write(r.shell_command().replace("python", shlex.quote(sys.executable), 1) + "\n")
  array = f"0-{len(runs) - 1}" + (f"%{options.max_concurrent}" if options.max_concurrent else "")
  lines = [
      "#!/bin/bash",
      f"#SBATCH --job-name={job_name}",
      f"#SBATCH --array={array}",
      f"#SBATCH --output={sweep_dir}/slurm/%A_%a.out",
      f"#SBATCH --time={options.time}",
      f"#SBATCH --nodes={options.nodes}",
      f"#SBATCH --ntasks-per-node={options.ntasks_per_node}",
      f"#SBATCH --cpus-per-task={options.cpus_per_task}",
      f"#SBATCH --mem={options.mem}",
  ]
  if options.gpus_per_task:
    lines.append(f"#SBATCH --gpus-per-task={options.gpus_per_task}")
  if options.partition:
    lines.append(f"#SBATCH --partition={options.partition}")
  if options.account:
    lines.append(f"#SBATCH --account={options.account}")
  multi_task = options.nodes * options.ntasks_per_node > 1
  lines += [
      "set -euo pipefail",
      f"cd {shlex.quote(REPO_DIR)}",
      f'CMD=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" {shlex.quote(commands)})',
      'echo "array task ${SLURM_ARRAY_TASK_ID} on $(hostname): ${CMD}"',
      # Every command carries --resume: a requeued (preempted) task continues its run.
      "srun bash -c \"${CMD}\"" if multi_task else "bash -c \"${CMD}\"",
  ]
  path = os.path.join(sweep_dir, "slurm_array.sbatch")
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  os.chmod(path, 0o755)
  return path
