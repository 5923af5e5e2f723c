"""Helpers of the SLURM tests: signal a task as an operator would, wait for a file."""

from __future__ import annotations

import os
import subprocess
import time


def scancel_briefly(env: dict[str, str], *args: str) -> None:
  """``scancel ARGS``, stopped after 3 s.

  SLURM 22.05's scancel, signalling a task of an array that still has pending tasks, may
  answer "Job is in transitional state, retrying" after delivering the signal and retry
  for ~95 s; a retry then signals the task's next attempt too (seen on the CI cluster).
  A requeued task restarts no sooner than 6 s later (cred_expire=5 in
  launch/local_slurm.py), so stopping scancel at 3 s keeps the signal to the attempt it
  was meant for. Its status is not checked: the tests check the outcomes.
  """
  proc = subprocess.Popen(["scancel", *args], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  try:
    proc.wait(timeout=3)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()


def wait_until(predicate, what: str, timeout_s: float = 240, poll_s: float = 0.1):
  """Polls ``predicate()`` until it returns something truthy, which is returned."""
  deadline = time.monotonic() + timeout_s
  while True:
    value = predicate()
    if value:
      return value
    if time.monotonic() > deadline:
      raise AssertionError(f"{what}: not after {timeout_s:.0f} s")
    time.sleep(poll_s)


def read_text(path: str) -> str:
  """The file's text, or '' while it does not exist."""
  try:
    with open(path, errors="replace") as f:
      return f.read()
  except FileNotFoundError:
    return ""


def checkpoint_steps(workdir: str) -> list[int]:
  """Finished checkpoint steps under ``workdir/checkpoints`` (orbax renames on commit)."""
  try:
    return sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints"))
                  if d.isdigit())
  except FileNotFoundError:
    return []
