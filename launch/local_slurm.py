"""A real one-node SLURM cluster on this machine (munged, slurmctld, slurmd), for CI and tries.

    python -m launch.local_slurm start --dir=/tmp/slurm
    export SLURM_CONF=/tmp/slurm/slurm.conf               # for sinfo, sbatch, launch.sweep
    python -m launch.local_slurm stop --dir=/tmp/slurm
    python -m launch.local_slurm run --dir=/tmp/slurm -- python -m pytest -m slurm tests/launch

Needs root and the distribution's ``slurmctld``, ``slurmd``, ``slurm-client`` and
``munge`` packages (Debian: ``apt-get install slurmctld slurmd slurm-client munge``).
Everything the daemons write (config, munge key and socket, state, spool, pid and log
files) lies under ``--dir``; they listen on free ports and an own munge socket, so a
system SLURM or munge on the machine is left alone. The node is this host
(``hostname -s``, address 127.0.0.1) with one partition ``debug`` and, by default, twice
as many CPU slots as the cores this process may use (at least 4): the tests' tasks spend
much of their time waiting for signals and restarts, and a task that waits for a free
slot only lengthens CI. Process tracking is ``proctrack/linuxproc`` and task binding
``task/none`` (no cgroups needed, e.g. in containers); there is no accounting daemon,
so ``sacct`` is unavailable and ``squeue``/``scontrol show job`` are the scheduler's
record (finished jobs stay listed for ``MinJobAge`` seconds).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Sequence

from absl import app, flags

from experiments.common.harness.config_flags import parse_flags

FLAGS = flags.FLAGS

DAEMONS = ("slurmd", "slurmctld", "munged")  # stop order: reverse of start
PARTITION = "debug"
# Finished jobs stay in `scontrol show job` this long (the runner reads final states
# there, as there is no accounting database).
MIN_JOB_AGE_S = 600


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def node_memory_mb() -> int:
  """Total memory less 1 GiB, in MB (the node's ``RealMemory``)."""
  with open("/proc/meminfo") as f:
    for line in f:
      if line.startswith("MemTotal:"):
        return max(512, int(line.split()[1]) // 1024 - 1024)
  raise RuntimeError("no MemTotal in /proc/meminfo")


def slurm_conf(directory: str, *, node: str, cpus: int, memory_mb: int,
               ctld_port: int, slurmd_port: int) -> str:
  """The text of a minimal slurm.conf with every path under ``directory``."""
  d = os.path.abspath(directory)
  return "\n".join([
      "ClusterName=local",
      f"SlurmctldHost={node}(127.0.0.1)",
      f"SlurmctldPort={ctld_port}",
      f"SlurmdPort={slurmd_port}",
      "AuthType=auth/munge",
      "CredType=cred/munge",
      # cred_expire also delays a requeued job's restart (default 120 s).
      f"AuthInfo=socket={d}/munge/munge.socket,cred_expire=5",
      "SlurmUser=root",
      "SlurmdUser=root",
      f"StateSaveLocation={d}/state",
      f"SlurmdSpoolDir={d}/spool",
      f"SlurmctldPidFile={d}/slurmctld.pid",
      f"SlurmdPidFile={d}/slurmd.pid",
      f"SlurmctldLogFile={d}/slurmctld.log",
      f"SlurmdLogFile={d}/slurmd.log",
      "ProctrackType=proctrack/linuxproc",
      "TaskPlugin=task/none",
      "JobAcctGatherType=jobacct_gather/none",
      "AccountingStorageType=accounting_storage/none",
      "JobCompType=jobcomp/none",
      "SelectType=select/cons_tres",
      "SelectTypeParameters=CR_Core",
      "SchedulerType=sched/backfill",
      # Look at pending (e.g. requeued) jobs every few seconds, not every minute.
      "SchedulerParameters=sched_interval=2,bf_interval=2",
      "MpiDefault=none",
      "MailProg=/bin/true",
      "ReturnToService=2",
      # The node as configured even if slurmd counts the hardware differently.
      "SlurmdParameters=config_overrides",
      f"MinJobAge={MIN_JOB_AGE_S}",
      "KillWait=10",
      f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} "
      "State=UNKNOWN",
      f"PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP",
      "",
  ])


def _pid(directory: str, daemon: str) -> int | None:
  try:
    with open(os.path.join(directory, f"{daemon}.pid")) as f:
      return int(f.read().strip())
  except (OSError, ValueError):
    return None


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  # A zombie child of ours (the daemons fork away, so rarely) counts as gone.
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split(")")[-1].split()[0] != "Z"
  except OSError:
    return False


def _log_tails(directory: str, lines: int = 15) -> str:
  out = []
  for name in ("munged.log", "slurmctld.log", "slurmd.log"):
    path = os.path.join(directory, name)
    if os.path.exists(path):
      with open(path, errors="replace") as f:
        tail = f.read().splitlines()[-lines:]
      out.append(f"--- {path} ---\n" + "\n".join(tail))
  return "\n".join(out)


def node_state(env: dict[str, str]) -> str:
  """The node's state as ``sinfo`` reports it (``idle``, ``mix``, ``down*``...), or ''."""
  out = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=env, capture_output=True,
                       text=True, timeout=30)
  return out.stdout.strip() if out.returncode == 0 else ""


def default_cpus() -> int:
  """CPU slots of the node: twice the usable cores, at least 4 (see the module doc)."""
  return max(4, 2 * len(os.sched_getaffinity(0)))


def start(directory: str, *, cpus: int = 0, timeout_s: float = 90.0) -> str:
  """Writes the config, starts munged, slurmctld and slurmd, waits for the node to be idle.

  ``cpus``: the node's CPU slots (0: :func:`default_cpus`). Returns the slurm.conf path
  (export it as ``SLURM_CONF``). On failure stops whatever
  it started and raises RuntimeError with the daemons' log tails.
  """
  if os.geteuid() != 0:
    raise RuntimeError("a local SLURM cluster needs root (slurmd runs jobs as their user)")
  missing = [b for b in ("munged", "slurmctld", "slurmd", "sinfo", "sbatch")
             if shutil.which(b) is None]
  if missing:
    raise RuntimeError(f"not installed: {', '.join(missing)} (Debian: apt-get install -y "
                       "slurmctld slurmd slurm-client munge)")
  directory = os.path.abspath(directory)
  if any(_pid(directory, d) and _alive(_pid(directory, d)) for d in DAEMONS):
    raise RuntimeError(f"{directory} already has running daemons; stop them first")
  for sub in ("munge", "state", "spool"):
    os.makedirs(os.path.join(directory, sub), exist_ok=True)
  os.chmod(os.path.join(directory, "munge"), 0o700)
  key = os.path.join(directory, "munge", "munge.key")
  if not os.path.exists(key):
    with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
      f.write(os.urandom(1024))
  node = socket.gethostname().split(".")[0]
  try:  # jax.distributed's SLURM detection connects to the first node by this name
    socket.gethostbyname(node)
  except OSError as e:
    raise RuntimeError(f"this host's name {node!r} does not resolve ({e}); add it to "
                       "/etc/hosts") from e
  conf = os.path.join(directory, "slurm.conf")
  ctld_port = _free_port()
  while (slurmd_port := _free_port()) == ctld_port:
    pass
  with open(conf, "w") as f:
    f.write(slurm_conf(directory, node=node, cpus=cpus or default_cpus(),
                       memory_mb=node_memory_mb(), ctld_port=ctld_port,
                       slurmd_port=slurmd_port))
  env = {**os.environ, "SLURM_CONF": conf}
  commands = {
      # --force: run as root, and accept a world-writable /tmp above the socket.
      "munged": ["munged", "--force", f"--socket={directory}/munge/munge.socket",
                 f"--key-file={key}", f"--pid-file={directory}/munged.pid",
                 f"--log-file={directory}/munged.log",
                 f"--seed-file={directory}/munge/munged.seed"],
      "slurmctld": ["slurmctld", "-f", conf],
      "slurmd": ["slurmd", "-f", conf],
  }
  try:
    for daemon in reversed(DAEMONS):
      # Each daemonizes itself; the return code says whether it got that far.
      out = subprocess.run(commands[daemon], env=env, capture_output=True, text=True,
                           timeout=60)
      if out.returncode != 0:
        raise RuntimeError(f"{daemon} failed to start (rc={out.returncode}): "
                           f"{(out.stdout + out.stderr).strip()}")
      deadline = time.monotonic() + 20
      while not (_pid(directory, daemon) and _alive(_pid(directory, daemon))):
        if time.monotonic() > deadline:
          raise RuntimeError(f"{daemon} wrote no live pid file")
        time.sleep(0.1)
    deadline = time.monotonic() + timeout_s
    state = ""
    while (state := node_state(env)) != "idle":
      if time.monotonic() > deadline:
        raise RuntimeError(f"node {node} is {state or 'not listed'} after {timeout_s:.0f} s")
      time.sleep(0.5)
  except (RuntimeError, subprocess.SubprocessError, OSError) as e:
    stop(directory)
    raise RuntimeError(f"local SLURM cluster did not start: {e}\n{_log_tails(directory)}"
                       ) from e
  return conf


def stop(directory: str, *, timeout_s: float = 30.0) -> list[str]:
  """Cancels this cluster's jobs, then stops its daemons by the pids in their pid files.

  Returns the daemons that were running. Safe to call when nothing runs.
  """
  directory = os.path.abspath(directory)
  conf = os.path.join(directory, "slurm.conf")
  ctld = _pid(directory, "slurmctld")
  if os.path.exists(conf) and ctld and _alive(ctld) and shutil.which("scancel"):
    # Jobs of this cluster only (SLURM_CONF names it): their processes outlive slurmd.
    subprocess.run(["scancel", "--full", f"--user={os.geteuid()}"], capture_output=True,
                   env={**os.environ, "SLURM_CONF": conf}, timeout=30)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
      out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                           env={**os.environ, "SLURM_CONF": conf}, timeout=30)
      if out.returncode != 0 or not out.stdout.strip():
        break
      time.sleep(0.5)
  stopped = []
  for daemon in DAEMONS:
    pid = _pid(directory, daemon)
    if not pid or not _alive(pid):
      continue
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
      time.sleep(0.1)
    if _alive(pid):
      os.kill(pid, signal.SIGKILL)
    stopped.append(daemon)
  return stopped


def main(argv: Sequence[str]) -> int:
  if len(argv) < 2 or argv[1] not in ("start", "stop", "run"):
    raise app.UsageError("give an action: start, stop, or run -- <command>")
  action, command = argv[1], list(argv[2:])
  directory = FLAGS.dir
  if action != "run" and command:
    raise app.UsageError(f"unexpected arguments: {command}")
  if action == "start":
    t0 = time.monotonic()
    conf = start(directory, cpus=FLAGS.cpus)
    print(f"SLURM up in {time.monotonic() - t0:.1f} s; export SLURM_CONF={conf}")
    return 0
  if action == "stop":
    print(f"stopped: {', '.join(stop(directory)) or 'nothing was running'}")
    return 0
  if command[:1] == ["--"]:
    command = command[1:]
  if not command:
    raise app.UsageError("run needs a command after --")
  conf = start(directory, cpus=FLAGS.cpus)
  try:
    # SIGTERM (e.g. CI's timeout) becomes an exception, so the daemons are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return subprocess.run(command, env={**os.environ, "SLURM_CONF": conf}).returncode
  finally:
    stop(directory)


if __name__ == "__main__":
  flags.DEFINE_string("dir", None, "Directory for the config, state, spool and logs.")
  flags.mark_flag_as_required("dir")
  flags.DEFINE_integer("cpus", 0, "CPU slots of the node (0: twice the cores, at least 4).")
  app.run(lambda argv: sys.exit(main(argv)), flags_parser=parse_flags)
