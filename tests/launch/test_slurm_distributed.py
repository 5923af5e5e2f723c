"""``srun -n2`` of an experiment: jax.distributed set up from SLURM's environment by JAX's
own cluster detection, two CPU processes over gloo, equal to one process bit for bit
(the SLURM twin of tests/experiments/common/test_distributed.py's gloo test)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from experiments.common.evidence.tensorboard_reader import read_scalars
from experiments.common.harness.repo_paths import REPO_DIR

pytestmark = pytest.mark.slurm

TINY = ["--num_steps=6", "--warmup_steps=1", "--seq_len=32", "--batch_size=8",
        "--d_model=32", "--num_layers=1", "--num_heads=2", "--d_ff=64", "--eval_batches=2",
        "--eval_every=3", "--max_chars=100000", "--log_every=1", "--recipe=fp32",
        "--checkpoint_every=3", "--histogram_every=0"]


def _logged(workdir):
  return {tag: values for tag, values in read_scalars(str(workdir)).items()
          if not tag.startswith("perf/")}


def test_srun_two_tasks_match_one_process_with_two_devices(tmp_path, slurm_env):
  command = [sys.executable, "-m", "experiments.lm", *TINY]
  env = {**slurm_env, "JAX_PLATFORMS": "cpu"}
  two = subprocess.run(
      ["srun", "--ntasks=2", "--cpus-per-task=1", "--mem=2G", "--time=10",
       "--kill-on-bad-exit=1", "--job-name=srun-distributed-test", *command,
       f"--workdir={tmp_path / 'two'}"], cwd=REPO_DIR, env=env, capture_output=True,
      text=True, timeout=300)
  out = two.stdout + two.stderr
  assert two.returncode == 0, out[-4000:]
  # Initialized from SLURM's environment (no --coordinator_address): JAX's detection.
  assert "jax.distributed initialized (slurm): process 0 of 2" in out, out[-3000:]
  assert "jax.distributed initialized (slurm): process 1 of 2" in out
  assert out.count("completed at step 6") == 1  # only process 0 reports
  events = [f for f in os.listdir(tmp_path / "two") if f.startswith("events.out")]
  assert len(events) == 1

  # One process, two virtual devices, no SLURM in sight: the same SPMD program.
  local_env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
  local_env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
  subprocess.run([*command, f"--workdir={tmp_path / 'one'}"], cwd=REPO_DIR, env=local_env,
                 check=True, capture_output=True, timeout=300)
  two_logged, one_logged = _logged(tmp_path / "two"), _logged(tmp_path / "one")
  assert len(two_logged["train/loss"]) == 6
  assert two_logged == one_logged
