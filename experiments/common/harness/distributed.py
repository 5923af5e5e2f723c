"""Multi-host setup: when to call ``jax.distributed.initialize``, the data mesh, batch sharding.

A plain local run does nothing here. Under a cluster launcher the environment says so and
``jax.distributed.initialize()`` (no arguments) auto-detects the rest. Explicit
``--coordinator_address/--num_processes/--process_id`` (the local multi-process launcher,
tests) take precedence. CPU processes talk through gloo collectives.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import jax
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA_AXIS = "data"


def detect_cluster(env: Mapping[str, str] | None = None) -> str | None:
  """Names the multi-process cluster launcher found in ``env`` (default os.environ), or None.

  Mirrors the environment JAX's own auto-detection reads; a launcher that starts a single
  process (a SLURM job-array task, a one-host TPU VM) counts as no cluster.
  """
  env = os.environ if env is None else env

  def count(name: str) -> int:
    try:
      return int(env.get(name, "1").split("(")[0])
    except ValueError:
      return 1

  if "SLURM_JOB_ID" in env and "SLURM_STEP_NODELIST" in env and count("SLURM_NTASKS") > 1:
    return "slurm"
  if "OMPI_MCA_orte_hnp_uri" in env and count("OMPI_COMM_WORLD_SIZE") > 1:
    return "openmpi"
  hosts = env.get("TPU_WORKER_HOSTNAMES", "")
  if "," in hosts or "MEGASCALE_COORDINATOR_ADDRESS" in env:
    return "cloud_tpu"
  if "KUBERNETES_SERVICE_HOST" in env and "JOB_COMPLETION_INDEX" in env:
    return "kubernetes"
  return None


def initialize(coordinator_address: str = "", num_processes: int = 0, process_id: int = -1,
               *, single_process: bool = False,
               env: Mapping[str, str] | None = None) -> bool:
  """Calls ``jax.distributed.initialize`` when this is a multi-process run.

  Must run before any JAX computation. Returns True if it initialized.

  Raises:
    ValueError: explicit arguments are incomplete.
  """
  explicit = bool(coordinator_address)
  if explicit and (num_processes < 1 or not 0 <= process_id < num_processes):
    raise ValueError(
        f"--coordinator_address needs --num_processes >= 1 and 0 <= --process_id < "
        f"num_processes; got num_processes={num_processes}, process_id={process_id}")
  if single_process:
    return False
  cluster = None if explicit else detect_cluster(env)
  if not explicit and cluster is None:
    return False
  if jax.distributed.is_initialized():
    return True
  # Only affects the CPU client (GPU/TPU ignore it); without it CPU processes cannot
  # run cross-process collectives.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if explicit:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
  else:
    jax.distributed.initialize()
  logging.info("jax.distributed initialized (%s): process %d of %d, local devices %s, "
               "global device count %d", cluster or "explicit", jax.process_index(),
               jax.process_count(), jax.local_devices(), jax.device_count())
  return True


def is_writer() -> bool:
  """Only process 0 writes logs, results and run metadata."""
  return jax.process_index() == 0


def data_mesh() -> Mesh:
  """A 1-D mesh over every device of the job, axis ``"data"``."""
  return Mesh(np.asarray(jax.devices()), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over ``"data"``."""
  return NamedSharding(mesh, P(DATA_AXIS))


def local_rows(global_batch_size: int) -> slice:
  """The rows of a global batch this process feeds (contiguous, process-major).

  Raises:
    ValueError: the batch does not split evenly over the devices.
  """
  devices = jax.device_count()
  if global_batch_size % devices:
    raise ValueError(f"global batch size {global_batch_size} is not divisible by the "
                     f"{devices} devices of the data mesh")
  per_process = global_batch_size // jax.process_count()
  start = jax.process_index() * per_process
  return slice(start, start + per_process)


def shard_batch(global_batch: Any, mesh: Mesh) -> Any:
  """Turns a host batch (the same global batch on every process) into sharded jax.Arrays.

  Each process contributes only its own rows, so this is also correct when processes
  generate just their slice.
  """
  sharding = batch_sharding(mesh)

  def put(x: np.ndarray) -> jax.Array:
    x = np.asarray(x)
    rows = local_rows(x.shape[0])
    return jax.make_array_from_process_local_data(sharding, x[rows], x.shape)

  return jax.tree.map(put, global_batch)
