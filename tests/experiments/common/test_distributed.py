"""Multi-host: cluster detection, and two gloo CPU processes == one process with both shards."""

import os
import subprocess
import sys

import numpy as np
import pytest

from experiments.common.evidence.tensorboard_reader import read_scalars
from experiments.common.harness import distributed
from launch.multiprocess_local import run_processes

from experiments.common.harness.repo_paths import REPO_DIR as REPO


@pytest.mark.parametrize("env,expected", [
    ({}, None),
    ({"SLURM_JOB_ID": "1", "SLURM_STEP_NODELIST": "n1", "SLURM_NTASKS": "1"}, None),
    ({"SLURM_JOB_ID": "1", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_NTASKS": "2"}, "slurm"),
    ({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "4"}, None),  # sbatch shell, not an srun step
    ({"OMPI_MCA_orte_hnp_uri": "x", "OMPI_COMM_WORLD_SIZE": "2"}, "openmpi"),
    ({"TPU_WORKER_HOSTNAMES": "a,b"}, "cloud_tpu"),
    ({"TPU_WORKER_HOSTNAMES": "a"}, None),
    ({"KUBERNETES_SERVICE_HOST": "h", "JOB_COMPLETION_INDEX": "0"}, "kubernetes"),
])
def test_detect_cluster(env, expected):
  assert distributed.detect_cluster(env) == expected


def test_initialize_noop_locally_and_validates():
  assert distributed.initialize(env={}) is False
  assert distributed.initialize(single_process=True, env={"TPU_WORKER_HOSTNAMES": "a,b"}) is False
  with pytest.raises(ValueError, match="num_processes"):
    distributed.initialize("127.0.0.1:1234", num_processes=2, process_id=2)


TINY = ["--num_steps=6", "--warmup_steps=1", "--seq_len=32", "--batch_size=8",
        "--d_model=32", "--num_layers=1", "--num_heads=2", "--d_ff=64", "--eval_batches=2",
        "--eval_every=3", "--max_chars=100000", "--log_every=1", "--recipe=fp32",
        "--checkpoint_every=3", "--histogram_every=0"]


def _cmd(workdir):
  return [sys.executable, "-m", "experiments.lm", f"--workdir={workdir}", *TINY]


def _losses(workdir):
  s = read_scalars(str(workdir))
  return [v for _, v in s["train/loss"]], [v for _, v in s["eval/loss"]]


def test_two_gloo_processes_match_one_process(tmp_path):
  env = {"PYTHONPATH": REPO}
  two = run_processes(_cmd(tmp_path / "two"), 2, timeout_s=150, env=env)
  for r in two:
    assert r.returncode == 0, r.output[-3000:]
  assert "process 1 of 2" in two[1].output
  # Only process 0 writes: one event file, one results row.
  events = [f for f in os.listdir(tmp_path / "two") if f.startswith("events.out")]
  assert len(events) == 1
  assert len(open(tmp_path / "two" / "results.jsonl").read().splitlines()) == 1
  assert (tmp_path / "two" / "checkpoints" / "6").is_dir()

  # One process, two (virtual) devices: the same SPMD program, so bit-identical.
  base_env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
  env2 = {**base_env, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
  subprocess.run(_cmd(tmp_path / "one2"), env=env2, check=True, timeout=150,
                 capture_output=True)
  # One process, one device with the whole batch: same math, other reduction order.
  subprocess.run(_cmd(tmp_path / "one1"), env=base_env, check=True, timeout=150,
                 capture_output=True)
  train2, eval2 = _losses(tmp_path / "two")
  train_12, eval_12 = _losses(tmp_path / "one2")
  train_11, eval_11 = _losses(tmp_path / "one1")
  assert len(train2) == 6
  assert train2 == train_12 and eval2 == eval_12
  np.testing.assert_allclose(train2, train_11, rtol=2e-6)
  np.testing.assert_allclose(eval2, eval_11, rtol=2e-6)
