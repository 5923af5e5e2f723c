"""A stand-in run for the local runner's interrupt tests (no JAX: starts in milliseconds).

    python tests/launch/fake_run.py WORKDIR [--term_delay=S]

Like a run: takes WORKDIR's lock (an exclusive ``flock`` on ``WORKDIR/.lock``, holder
line as :func:`experiments.common.harness.workdir.lock_directory` writes it); a rerun of a run
that checkpointed (``WORKDIR/checkpointed`` exists) completes at once (exit 0).
Otherwise it writes ``WORKDIR/ready`` and waits; on SIGTERM it logs ``SIGTERM
received``, waits ``S`` seconds (a slow checkpoint; the lock stays held), writes
``WORKDIR/checkpointed`` and exits 75 (preempted). SIGINT is Python's default
(KeyboardInterrupt), so a run that a terminal's Ctrl-C reached says so in its log.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import socket
import sys
import time

PREEMPTED = 75  # experiments.common.harness.preemption.PREEMPTED_EXIT_CODE


def main() -> int:
  parser = argparse.ArgumentParser()
  parser.add_argument("workdir")
  parser.add_argument("--term_delay", type=float, default=0.0)
  args = parser.parse_args()
  os.makedirs(args.workdir, exist_ok=True)
  lock = open(os.path.join(args.workdir, ".lock"), "a+")
  try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    print("workdir in use", flush=True)
    return 2
  lock.truncate(0)
  lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
  lock.flush()
  done = os.path.join(args.workdir, "checkpointed")
  if os.path.exists(done):
    print("resumed and completed", flush=True)
    return 0
  terms = []
  signal.signal(signal.SIGTERM, lambda *_: terms.append(time.monotonic()))
  with open(os.path.join(args.workdir, "ready"), "w") as f:
    f.write(str(os.getpid()))
  while not terms:
    time.sleep(0.05)
  print("SIGTERM received", flush=True)
  time.sleep(args.term_delay)
  with open(done, "w") as f:
    f.write(str(len(terms)))
  return PREEMPTED


if __name__ == "__main__":
  sys.exit(main())
