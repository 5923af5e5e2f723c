"""The SLURM pieces that need no cluster: the job script's control flow (run under bash
with stand-in srun/scontrol/scancel), the scheduler records the runner parses, the
resubmit rule, the options and the local cluster's config."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time

import pytest

from launch.local_slurm import slurm_conf
from launch.manifest import RunSpec
from launch.slurm import SlurmOptions, array_spec, write_array_script
from launch.slurm_runner import TaskRecord, parse_scontrol_jobs, resumable
from tests.launch.slurm_tools import read_text, wait_until

FAKE = os.path.join("tests", "launch", "fake_slurm_run.py")


@pytest.mark.parametrize("indices,limit,expected", [
    ([0, 1, 2, 3], 0, "0-3"),
    ([3, 1, 0, 5, 6], 2, "0-1,3,5-6%2"),
    ([4], 0, "4"),
    ([2, 2, 7], 0, "2,7"),
])
def test_array_spec(indices, limit, expected):
  assert array_spec(indices, limit) == expected


def test_array_spec_rejects_empty_and_negative():
  with pytest.raises(ValueError, match="no array indices"):
    array_spec([])
  with pytest.raises(ValueError, match=">= 0"):
    array_spec([-1, 0])


# `scontrol -o show job <array>` output from the CI cluster (SLURM 22.05), most fields
# left out. Pending tasks share one line; started tasks have their own ids.
QUEUED = """\
JobId=13 ArrayJobId=13 ArrayTaskId=2-3%1 ArrayTaskThrottle=1 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901753 Nice=0 Account=(null) QOS=(null) JobState=PENDING Reason=JobArrayTaskLimit Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A AllocNode:Sid=localhost:32295 ReqNodeList=(null) ExcNodeList=(null) NodeList= NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
JobId=15 ArrayJobId=13 ArrayTaskId=1 ArrayTaskThrottle=1 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901753 Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A NodeList=vm BatchHost=vm NumNodes=1
JobId=14 ArrayJobId=13 ArrayTaskId=0 ArrayTaskThrottle=1 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901753 Nice=0 Account=(null) QOS=(null) JobState=COMPLETED Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:02 TimeLimit=365-00:00:00 TimeMin=N/A
"""
ENDED = """\
JobId=9 ArrayJobId=9 ArrayTaskId=1 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901755 Nice=0 Account=(null) QOS=(null) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=75:0 RunTime=00:00:01 TimeLimit=365-00:00:00 TimeMin=N/A
JobId=10 ArrayJobId=9 ArrayTaskId=0 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901755 Nice=0 Account=(null) QOS=(null) JobState=COMPLETED Reason=None Dependency=(null) Requeue=1 Restarts=1 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A
"""


def test_parse_scontrol_jobs():
  records = {r.task_id: r for r in parse_scontrol_jobs(QUEUED)}
  assert sorted(records) == [0, 1, 2, 3]
  assert records[2] == TaskRecord("13", 2, "13", "PENDING", "0:0", 0, "00:00:00", "",
                                  "JobArrayTaskLimit")
  assert records[3].state == "PENDING" and records[3].task == "13_3"
  assert (records[1].job_id, records[1].state, records[1].node) == ("15", "RUNNING", "vm")
  assert (records[0].job_id, records[0].state, records[0].exit_status) == (
      "14", "COMPLETED", 0)
  ended = {r.task_id: r for r in parse_scontrol_jobs(ENDED)}
  assert (ended[1].state, ended[1].exit_code, ended[1].exit_status) == ("FAILED", "75:0", 75)
  assert (ended[0].task, ended[0].state, ended[0].restarts) == ("9_0", "COMPLETED", 1)


def test_parse_skips_other_jobs_and_expands_pending_specs():
  assert parse_scontrol_jobs("JobId=9 JobName=interactive JobState=RUNNING Restarts=0") == []
  line = "JobId=5 ArrayJobId=5 ArrayTaskId=0-6:3,9 JobState=PENDING ExitCode=0:0 Restarts=0"
  assert [r.task_id for r in parse_scontrol_jobs(line)] == [0, 3, 6, 9]


def _record(state, exit_code="0:0"):
  return TaskRecord("1", 0, "2", state, exit_code, 0, "00:00:01", "vm", "None")


@pytest.mark.parametrize("record,expected", [
    (None, True),                             # forgotten by the controller
    (_record("COMPLETED"), True),             # exited 0 after checkpointing on SIGTERM
    (_record("FAILED", "75:0"), True),        # preempted, its requeue was refused
    (_record("TIMEOUT", "0:15"), True),
    (_record("PREEMPTED"), True),
    (_record("NODE_FAIL"), True),
    (_record("FAILED", "1:0"), False),        # a real failure
    (_record("OUT_OF_MEMORY", "0:125"), False),
    (_record("CANCELLED", "75:0"), False),    # its user cancelled it
])
def test_resumable(record, expected):
  assert resumable(record) is expected


def test_options_validate():
  with pytest.raises(ValueError, match="cpus_per_task"):
    SlurmOptions(cpus_per_task=0)
  with pytest.raises(ValueError, match="signal_s"):
    SlurmOptions(signal_s=-1)
  with pytest.raises(ValueError, match="--name"):
    SlurmOptions(extra=("qos=high",))
  assert SlurmOptions(nodes=2, ntasks_per_node=4).num_tasks == 8


def _runs(sweep_dir, modes):
  results = os.path.join(sweep_dir, "results.jsonl")
  out = []
  for i, mode in enumerate(modes):
    workdir = os.path.join(sweep_dir, "runs", f"{mode}-{i}")
    out.append(RunSpec(i, f"{mode}-{i}", mode, 0, workdir, results, {}, (
        "python", FAKE, f"--mode={mode}", f"--workdir={workdir}", f"--run_name={mode}-{i}",
        f"--results_file={results}")))
  return out


def test_script_lines(tmp_path):
  runs = _runs(str(tmp_path), ["stop_once", "fail"])
  text = open(write_array_script(runs, str(tmp_path), "job", SlurmOptions(
      partition="gpu", account="proj", gpus_per_task=1, signal_s=90,
      extra=("--qos=high",)))).read()
  for line in ("#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --partition=gpu",
               "#SBATCH --account=proj", "#SBATCH --gpus-per-task=1", "#SBATCH --qos=high",
               "#SBATCH --signal=B:TERM@90", "#SBATCH --array=0-1"):
    assert line + "\n" in text
  workdirs = open(tmp_path / "slurm" / "workdirs.txt").read().splitlines()
  assert workdirs == [r.workdir for r in runs]
  no_signal = open(write_array_script(runs, str(tmp_path), "job",
                                      SlurmOptions(signal_s=0))).read()
  assert "#SBATCH --signal" not in no_signal


# Stand-ins for SLURM's commands: srun runs its command, scancel sends SIGTERM to the
# run (its pid file), scontrol reports the task in $FAKE_STATE and logs requeues.
_STUBS = {
    "srun": 'while [[ "$1" == --* ]]; do shift; done; exec "$@"\n',
    "scancel": 'echo "$*" >> "$STUB_LOG"; kill -TERM "$(cat "$RUN_PID_FILE")"\n',
    "scontrol": ('if [ "$1" = requeue ]; then echo "requeue $2" >> "$STUB_LOG"; '
                 'else echo "JobId=8 ArrayJobId=7 JobState=${FAKE_STATE}"; fi\n'),
}


def _run_script(tmp_path, mode, state="RUNNING", term_batch=False):
  """Runs task 0 of a one-run array script under bash with the stand-ins; returns
  (exit status, stand-in log, run's launch.log)."""
  sweep_dir = tmp_path / mode
  (run,) = _runs(str(sweep_dir), [mode])
  script = write_array_script([run], str(sweep_dir), "job", SlurmOptions(signal_s=0))
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  for name, body in _STUBS.items():
    (bin_dir / name).write_text("#!/bin/bash\n" + body)
    (bin_dir / name).chmod(stat.S_IRWXU)
  env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
         "SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "0", "SLURM_JOB_ID": "8",
         "SLURM_CPUS_PER_TASK": "1", "FAKE_STATE": state,
         "STUB_LOG": str(tmp_path / f"{mode}.stubs"),
         "RUN_PID_FILE": os.path.join(run.workdir, "pid")}
  proc = subprocess.Popen(["bash", script], env=env)
  if term_batch:  # the time-limit warning: SIGTERM to the batch shell only
    wait_until(lambda: os.path.exists(os.path.join(run.workdir, "ready")), "the run",
               timeout_s=60, poll_s=0.05)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
  rc = proc.wait(timeout=120)
  return (rc, read_text(str(tmp_path / f"{mode}.stubs")),
          read_text(os.path.join(run.workdir, "launch.log")))


def test_script_term_to_batch_shell_signals_run_and_requeues(tmp_path):
  rc, stubs, log = _run_script(tmp_path, "wait_term", term_batch=True)
  assert rc == 0
  assert stubs.splitlines() == ["--signal=TERM 7_0", "requeue 7_0"]
  assert "batch shell got SIGTERM" in log and "run exited with status 75" in log
  assert json.loads(read_text(str(tmp_path / "wait_term" / "runs" / "wait_term-0" /
                                  "attempts")))["task"] == "7_0"


def test_script_does_not_requeue_a_task_being_cancelled(tmp_path):
  rc, stubs, log = _run_script(tmp_path, "wait_term", state="CANCELLED", term_batch=True)
  assert rc == 75 and "requeue" not in stubs
  assert "stopped with the task CANCELLED: not requeueing it" in log


@pytest.mark.parametrize("mode,status", [("stop_once", 0), ("fail", 3)])
def test_script_passes_other_statuses_through(tmp_path, mode, status):
  rc, stubs, log = _run_script(tmp_path, mode)
  assert rc == status and stubs == ""
  assert f"run exited with status {status}" in log


def test_local_cluster_config():
  text = slurm_conf("/tmp/c", node="n1", cpus=2, memory_mb=4000, ctld_port=7001,
                    slurmd_port=7002)
  lines = text.splitlines()
  for line in ("SlurmctldHost=n1(127.0.0.1)", "SlurmctldPort=7001", "SlurmdPort=7002",
               "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
               "StateSaveLocation=/tmp/c/state", "SlurmdSpoolDir=/tmp/c/spool",
               "AuthInfo=socket=/tmp/c/munge/munge.socket,cred_expire=5",
               "NodeName=n1 NodeAddr=127.0.0.1 CPUs=2 RealMemory=4000 State=UNKNOWN",
               "PartitionName=debug Nodes=n1 Default=YES MaxTime=INFINITE State=UP"):
    assert line in lines
