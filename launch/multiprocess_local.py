"""Starts one command as N cooperating CPU processes on this machine (multi-host, locally).

    python -m launch.multiprocess_local --num_processes=2 -- \\
        python -m experiments.lm --workdir=runs/lm/mp2 --num_steps=50

Each process gets ``--coordinator_address=127.0.0.1:<free port> --num_processes=N
--process_id=i`` appended and ``JAX_PLATFORMS=cpu``; the entry point then calls
``jax.distributed.initialize`` with gloo CPU collectives. This is how CI exercises the
multi-host code path without a cluster.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import NamedTuple, Sequence

from absl import app, flags

from experiments.common.harness.config_flags import parse_flags


def free_port() -> int:
  """A TCP port that was free on 127.0.0.1 a moment ago."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class ProcessResult(NamedTuple):
  process_id: int
  returncode: int
  output: str


def run_processes(command: Sequence[str], num_processes: int, *, timeout_s: float = 300.0,
                  env: dict[str, str] | None = None, port: int | None = None
                  ) -> list[ProcessResult]:
  """Runs ``command`` as ``num_processes`` processes of one JAX job; waits for all.

  If any process fails or the deadline passes, the rest are killed (a collective would
  otherwise wait forever for the missing peer). Returns each process's rc and output.
  """
  if num_processes < 1:
    raise ValueError(f"num_processes must be >= 1, got {num_processes}")
  port = port or free_port()
  full_env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})}
  procs = []
  for i in range(num_processes):
    args = [*command, f"--coordinator_address=127.0.0.1:{port}",
            f"--num_processes={num_processes}", f"--process_id={i}"]
    procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  env=full_env, text=True))
  deadline = time.monotonic() + timeout_s
  outputs: dict[int, str] = {}
  failed = False
  try:
    while len(outputs) < num_processes:
      for i, p in enumerate(procs):
        if i in outputs:
          continue
        if p.poll() is not None:
          outputs[i] = p.stdout.read()
          failed |= p.returncode != 0
      if failed or time.monotonic() > deadline:
        break
      time.sleep(0.1)
  finally:
    for i, p in enumerate(procs):
      if p.poll() is None:
        p.kill()
        p.wait()
      if i not in outputs:
        outputs[i] = p.stdout.read() + "\n[killed: peer failed or timeout]"
      p.stdout.close()
  return [ProcessResult(i, procs[i].returncode, outputs[i]) for i in range(num_processes)]


def main(argv: list[str]) -> int:
  command = argv[1:]
  if command and command[0] == "--":
    command = command[1:]
  if not command:
    raise app.UsageError("give the command after --, e.g. -- python -m experiments.lm")
  results = run_processes(command, flags.FLAGS.num_processes,
                          timeout_s=flags.FLAGS.timeout_s)
  for r in results:
    print(f"===== process {r.process_id} (rc={r.returncode}) =====\n{r.output}")
  return max(abs(r.returncode) for r in results)


if __name__ == "__main__":
  flags.DEFINE_integer("num_processes", 2, "How many processes to start.")
  flags.DEFINE_float("timeout_s", 600.0, "Kill every process after this many seconds.")
  app.run(lambda argv: sys.exit(main(argv)), flags_parser=parse_flags)
