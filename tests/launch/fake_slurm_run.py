"""A stand-in for an experiment in the SLURM runner tests (no JAX, starts in milliseconds).

    python tests/launch/fake_slurm_run.py --mode=MODE --workdir=W --run_name=N --results_file=R

Each attempt appends the SLURM task it ran as to ``W/attempts`` and writes its pid to
``W/pid``. Modes, for the first
attempt (later attempts always complete, appending ``{"run_name": N}`` to R):
  wait_term  write ``W/ready`` (holding the array task id), wait for SIGTERM, exit 75
  stop_once  exit 0 without a results row (a run that checkpointed on SIGTERM and stopped)
  fail       exit 3 (every attempt)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

PREEMPTED = 75  # experiments.common.harness.preemption.PREEMPTED_EXIT_CODE (not imported: no JAX)


def main() -> int:
  parser = argparse.ArgumentParser()
  for name in ("mode", "workdir", "run_name", "results_file"):
    parser.add_argument(f"--{name}", required=True)
  args, _ = parser.parse_known_args()
  os.makedirs(args.workdir, exist_ok=True)
  task = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
  attempts = os.path.join(args.workdir, "attempts")
  first = not os.path.exists(attempts)
  with open(os.path.join(args.workdir, "pid"), "w") as f:
    f.write(str(os.getpid()))
  with open(attempts, "a") as f:
    f.write(json.dumps({"task": task, "restart": os.environ.get("SLURM_RESTART_COUNT", "0"),
                        "job": os.environ["SLURM_JOB_ID"]}) + "\n")
  if args.mode == "fail":
    return 3
  if first and args.mode == "stop_once":
    return 0
  if first and args.mode == "wait_term":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(PREEMPTED))
    with open(os.path.join(args.workdir, "ready"), "w") as f:
      f.write(task)
    time.sleep(240)
    return 1  # never signalled
  with open(args.results_file, "a") as f:
    f.write(json.dumps({"run_name": args.run_name}) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
