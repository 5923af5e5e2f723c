"""Faults around a run, each reproduced (issue 16) and shown handled.

Tiny LM runs (a few steps of a 1-layer, width-16 model) so the whole file costs seconds.
"""

import dataclasses
import errno
import json
import os
import shutil
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from experiments.common.evidence import results as results_lib
from experiments.common.evidence import results_file as results_file_lib
from experiments.common.evidence.results import read_results
from experiments.common.evidence.tensorboard_reader import read_scalars
from experiments.common.evidence.tensorboard_writer import MetricWriter
from experiments.common.harness import workdir as workdir_lib
from experiments.common.harness.checkpoint import Checkpointer, CheckpointError, Snapshot
from experiments.common.harness.config_flags import SEED_DOMAIN
from experiments.common.harness.preemption import PREEMPTED_EXIT_CODE, PreemptionWatcher
from experiments.common.harness.repo_paths import REPO_DIR
from experiments.common.harness.run_options import RunOptions
from experiments.common.harness.train_loop import LoopSettings, restore_or_initialize, run_loop
from experiments.lm import experiment as lm
from tests.experiments.common.tiny_lm import TINY, cli as _cli, run as _run
from tests import compile_cache


# The fault and resume runs of one tiny LM config rebuild the same jitted steps.
_compile_each_program_once = compile_cache.module_fixture()


# ----------------------------------------------------------------- results and rows


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, _compile_each_program_once):
  """An uninterrupted tiny LM run: its directory and results row."""
  del _compile_each_program_once  # the run compiles into the module's cache
  wd = tmp_path_factory.mktemp("full") / "run"
  _run(wd)
  [row] = read_results(str(wd / "results.jsonl"))
  return wd, row


def _final_checksums(workdir):
  ck = Checkpointer(str(workdir / "checkpoints"))
  try:
    return ck._meta(ck.latest_step())["checksums"]  # pylint: disable=protected-access
  finally:
    ck.close()


def _die_inside_the_final_save(monkeypatch):
  """The final step's arrays written, its metadata not (the process killed mid-save)."""
  save = Checkpointer.save
  def dying_save(self, snapshot):
    save(self, snapshot)
    if snapshot.step == TINY.num_steps:
      shutil.rmtree(os.path.join(self.directory, str(snapshot.step), "meta"))
      raise KeyboardInterrupt("killed inside the final save")
  monkeypatch.setattr(Checkpointer, "save", dying_save)


def _die_before_the_mark(monkeypatch):
  def die(*args, **kwargs):
    raise KeyboardInterrupt("killed before COMPLETED.json")
  monkeypatch.setattr(workdir_lib, "mark_completed", die)


def _die_before_the_row(monkeypatch):
  def die(*args, **kwargs):
    raise KeyboardInterrupt("killed before the results row")
  monkeypatch.setattr(results_lib, "append_result", die)
  monkeypatch.setattr(results_lib, "append_result_unless_present", die)


def _disk_full_during_the_row(monkeypatch):
  """The results row's write stops half way with ENOSPC (as a full disk does)."""
  def half_then_enospc(fd, data):
    os.write(fd, data[:len(data) // 2])
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(results_file_lib, "_write_all", half_then_enospc)


def _die_after_the_row_before_the_mark(monkeypatch):
  """The state the old finishing order (row, then mark) left when killed between the
  two: the row in the file, no mark (issue 51 row 3)."""
  def row_then_die(workdir, *, results_file, row, **kwargs):
    del kwargs
    results_lib.append_result(os.path.join(REPO_DIR, results_file), row)
    raise KeyboardInterrupt("killed after the results row, before COMPLETED.json")
  monkeypatch.setattr(workdir_lib, "mark_completed", row_then_die)


@pytest.mark.parametrize("kill", [_die_inside_the_final_save, _die_before_the_mark,
                                  _die_before_the_row, _disk_full_during_the_row,
                                  _die_after_the_row_before_the_mark],
                         ids=lambda f: f.__name__.strip("_"))
def test_a_run_killed_at_any_point_of_its_end_resumes_to_one_identical_row(
    tmp_path, monkeypatch, full_run, kill):
  """Before (issue 51): killed between its row and COMPLETED.json, a --resume appended a
  second row; a full disk during the row left a damaged half line in the file for good.
  (Issue 16: a resumed run's row had only eval metrics and steps_per_s "nan".)"""
  wd = tmp_path / "run"
  results = wd / "results.jsonl"
  kill(monkeypatch)
  with pytest.raises((KeyboardInterrupt, OSError)):
    _run(wd)
  monkeypatch.undo()
  if kill is _die_after_the_row_before_the_mark:  # the old order's state, reproduced
    assert len(read_results(str(results))) == 1 and not (wd / "COMPLETED.json").exists()
  else:
    assert not results.exists() or results.read_bytes() == b""  # nothing half written
  try:
    _run(wd, resume=True)
  except workdir_lib.RunAlreadyCompleted as e:  # marked before it died: row put back
    assert "restored" in str(e)
  _assert_one_row_as_uninterrupted(wd, full_run)


def _assert_one_row_as_uninterrupted(wd, full_run):
  """``wd``'s results file holds one readable row, and the row, the final checkpoint
  and the loss curve are those of the uninterrupted ``full_run``; finishing it again
  changes nothing."""
  full_dir, full_row = full_run
  results = wd / "results.jsonl"
  [row] = read_results(str(results))  # one row, and every line of the file readable
  assert row["completed"] and row["step"] == TINY.num_steps
  assert row["metrics"] == full_row["metrics"]  # train and eval, the whole run's
  assert row["config"] == full_row["config"]
  assert isinstance(row["steps_per_s"], float) and row["steps_per_s"] > 0
  assert _final_checksums(wd) == _final_checksums(full_dir)  # bit-identical arrays
  assert read_scalars(str(wd))["train/loss"] == read_scalars(str(full_dir))["train/loss"]
  # Finishing again changes nothing.
  with pytest.raises(workdir_lib.RunAlreadyCompleted, match="nothing was written"):
    _run(wd, resume=True)
  assert read_results(str(results)) == [row]


# A real SIGKILL (no handler, no finally block runs) at a point of the run's end, in a
# child process that compiles from this module's cache.
_SIGKILLED = """
import os, signal, sys
from experiments.common.evidence import results as results_lib
from experiments.common.harness.checkpoint import Checkpointer
from tests import compile_cache
from tests.experiments.common.tiny_lm import TINY, run

def sigkill(*args, **kwargs):
  os.kill(os.getpid(), signal.SIGKILL)

workdir, point, cache = sys.argv[1:]
if point == "inside_the_final_save":  # orbax's write of the final step still in flight
  save = Checkpointer.save
  def save_then_die(self, snapshot):
    if snapshot.step == TINY.num_steps:
      self._manager.wait_until_finished = sigkill
    save(self, snapshot)
  Checkpointer.save = save_then_die
else:  # between the completion mark and the results row
  results_lib.append_result_unless_present = sigkill
with compile_cache.shared_compiles(cache):
  run(workdir)
"""


@pytest.mark.parametrize("point", ["inside_the_final_save", "between_the_mark_and_the_row"])
def test_a_run_sigkilled_at_its_end_resumes_to_one_identical_row(tmp_path, full_run, point):
  """The same as above with a real ``kill -9``: nothing of the process's own cleanup
  runs (issue 51: between the row and the mark, a --resume appended a second row)."""
  wd = tmp_path / "run"
  child = subprocess.run([sys.executable, "-c", _SIGKILLED, str(wd), point,
                          jax.config.jax_compilation_cache_dir],
                         capture_output=True, text=True, timeout=300, cwd=REPO_DIR)
  assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
  try:
    _run(wd, resume=True)
  except workdir_lib.RunAlreadyCompleted as e:
    assert "restored" in str(e)
  _assert_one_row_as_uninterrupted(wd, full_run)


def test_resume_of_a_completed_run_says_so_and_writes_nothing(tmp_path):
  _run(tmp_path / "run")
  files = sorted(os.listdir(tmp_path / "run"))
  out = subprocess.run(_cli(tmp_path / "run", "--resume"), capture_output=True, text=True,
                       timeout=300, cwd=REPO_DIR)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "holds a completed run" in out.stdout and "nothing was written" in out.stdout
  assert sorted(os.listdir(tmp_path / "run")) == files  # no new event file either
  assert len(read_results(str(tmp_path / "run" / "results.jsonl"))) == 1
  # Rerunning the same command without --resume (a manifest line on a finished sweep
  # carries --resume; a user's rerun may not) says the same.
  with pytest.raises(workdir_lib.RunAlreadyCompleted):
    _run(tmp_path / "run")


def test_results_file_checked_before_training(tmp_path):
  blocker = tmp_path / "not_a_dir"
  blocker.write_text("a file where the results file's directory should be")
  with pytest.raises(OSError, match="cannot write the results file"):
    _run(tmp_path / "run", results_file=str(blocker / "results.jsonl"))
  assert not os.path.exists(tmp_path / "run" / "checkpoints" / "4")  # nothing trained


# --------------------------------------------------------------------- the workdir


def test_second_process_on_a_workdir_is_refused_and_a_dead_holders_lock_is_free(tmp_path):
  wd = tmp_path / "run"
  wd.mkdir()
  holder = subprocess.Popen(
      [sys.executable, "-c", "import sys, time; from experiments.common.harness import workdir; "
       "held = workdir._lock(sys.argv[1]); print('locked', flush=True); time.sleep(60)",
       str(wd)],
      stdout=subprocess.PIPE, text=True, cwd=REPO_DIR)
  assert holder.stdout.readline().strip() == "locked"
  with pytest.raises(workdir_lib.WorkdirInUse, match=f"pid {holder.pid}"):
    _run(wd)
  holder.kill()  # SIGKILL: the kernel releases the lock, nothing is left stale
  holder.wait()
  assert _run(wd)["completed"]


# tensorstore's callbacks into orbax's closed event loop, which pytest reports (an entry
# point drops them: test_script_exits).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_damaged_checkpoints_are_detected_and_skipped_for_the_newest_intact_one(tmp_path):
  """Before: a damaged data file was restored silently, or failed with a 30-frame
  tensorstore traceback."""
  ck = Checkpointer(str(tmp_path / "ck"), max_to_keep=4)
  state = {"w": jnp.arange(64, dtype=jnp.float32)}
  key = jax.random.PRNGKey(0)
  for step in (1, 2, 3):
    ck.save(Snapshot({"w": state["w"] + step}, key, step, step))
  # Step 3: data files that decode fine but hold other values (what a silent bit flip
  # in an uncompressed chunk does); only the recorded checksums can tell.
  other = Checkpointer(str(tmp_path / "other"))
  other.save(Snapshot({"w": state["w"] - 7}, key, 3, 3))
  other.close()
  shutil.rmtree(tmp_path / "ck" / "3" / "state")
  shutil.copytree(tmp_path / "other" / "3" / "state", tmp_path / "ck" / "3" / "state")
  with pytest.raises(CheckpointError, match="step 3 .* fails its checksums: 1 array"):
    ck.restore(state, key, 3)
  # Step 2: one bit flipped in each compressed data file (tensorstore cannot decode it).
  data = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "ck" / "2" / "state")
          for f in fs if os.path.basename(d) == "d"]
  assert data
  for path in data:
    raw = bytearray(open(path, "rb").read())
    raw[len(raw) // 2] ^= 0x10
    open(path, "wb").write(bytes(raw))
  with pytest.raises(CheckpointError, match="step 2"):
    ck.restore(state, key, 2)
  snap = ck.restore_latest_intact(state, key)
  assert snap.step == 1 and np.array_equal(snap.state["w"], state["w"] + 1)
  # An incomplete newest step (its metadata never written) is skipped the same way.
  ck.save(Snapshot({"w": state["w"] + 4}, key, 4, 4))
  for d, _, fs in os.walk(tmp_path / "ck" / "4" / "meta"):
    for f in fs:
      os.remove(os.path.join(d, f))
  assert ck.restore_latest_intact(state, key).step == 1
  ck.close()


def test_steps_logged_past_the_checkpoint_are_superseded_after_a_resume(tmp_path):
  """Before: TensorBoard held the killed run's steps past its last checkpoint twice."""
  full = _run(tmp_path / "full")
  # A run killed after logging step 8 but before checkpointing it: drop checkpoint 8.
  config = TINY
  _run(tmp_path / "killed", config)
  for name in ("COMPLETED.json", "results.jsonl"):
    os.remove(tmp_path / "killed" / name)
  ck = Checkpointer(str(tmp_path / "killed" / "checkpoints"))
  ck.delete_after(4)
  ck.close()
  _run(tmp_path / "killed", config, resume=True)
  acc = EventAccumulator(str(tmp_path / "killed"), size_guidance={"scalars": 0})
  acc.Reload()  # TensorBoard's own reader: the restart marker purges the old 5..8
  assert [e.step for e in acc.Scalars("train/loss")] == list(range(1, 9))
  assert read_scalars(str(tmp_path / "killed"))["train/loss"] == \
      read_scalars(str(tmp_path / "full"))["train/loss"]
  assert full["completed"]


# ------------------------------------------------------------ exits and validation


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_ctrl_c_checkpoints_and_exits_with_the_preempted_status(tmp_path, signum):
  """Before: a SIGTERM'd run exited 0, so a sweep counted it as a success; a Ctrl-C'd
  (SIGINT) one died with rc 130 and a KeyboardInterrupt traceback, losing every step
  since its last checkpoint (issue 35)."""
  config = dataclasses.replace(TINY, num_steps=100_000, checkpoint_every=0, eval_every=0)
  wd = tmp_path / "run"
  proc = subprocess.Popen(_cli(wd, config=config), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, cwd=REPO_DIR)
  seen = []
  for line in proc.stdout:  # until the loop is running (its SIGTERM handler installed)
    seen.append(line)
    if "train step 1/" in line:
      break
  assert proc.poll() is None, "".join(seen)[-2000:]
  proc.send_signal(signum)
  out, _ = proc.communicate(timeout=240)
  out = "".join(seen) + out
  assert proc.returncode == PREEMPTED_EXIT_CODE, out[-2000:]
  assert "stopped at step" in out
  # The exact command, with this run's flags (issue 51: a bare --resume resumed the
  # default config's run, another one).
  resume = next(l for l in out.splitlines() if "continue with: " in l).split(": ", 1)[1]
  assert resume.startswith("python -m experiments.lm --recipe=fp32 ")
  assert resume.endswith(f"--workdir={wd} --resume")
  assert "Traceback" not in out
  assert read_results(str(wd / "results.jsonl")) == []
  assert Checkpointer(str(wd / "checkpoints")).latest_step() > 0


def test_a_second_ctrl_c_stops_at_once():
  """The first SIGINT asks for a checkpoint; the next raises KeyboardInterrupt, so a
  run whose step or checkpoint hangs can still be stopped."""
  before = signal.getsignal(signal.SIGINT)
  with PreemptionWatcher() as watcher:
    os.kill(os.getpid(), signal.SIGINT)
    assert watcher.requested(1)
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
  assert signal.getsignal(signal.SIGINT) is before


def test_the_sweep_runner_reports_a_preempted_run_and_counts_it_missing(tmp_path):
  from launch.local_runner import run_local  # pylint: disable=import-outside-toplevel
  from launch.manifest import RunSpec  # pylint: disable=import-outside-toplevel
  spec = RunSpec(0, "r0", "a", 0, str(tmp_path / "r0"), str(tmp_path / "results.jsonl"),
                 {}, (sys.executable, "-c", f"raise SystemExit({PREEMPTED_EXIT_CODE})"))
  (outcome,) = run_local([spec], parallel=1)
  assert outcome.status == "preempted"


def test_out_of_domain_config_values_are_refused_before_running(tmp_path):
  """Before: --learning_rate=-1 was accepted and recorded as a completed run."""
  out = subprocess.run(_cli(tmp_path / "run", "--learning_rate=-1"), capture_output=True,
                       text=True, timeout=300, cwd=REPO_DIR)
  assert out.returncode == 2
  assert "LMConfig.learning_rate must be in (0, inf), got -1.0" in out.stderr
  assert not os.path.exists(tmp_path / "run")


def test_resume_with_a_changed_config_is_refused_listing_the_fields(tmp_path):
  """Before: ``--resume --recipe=mxfp8`` on a bf16 run silently continued the bf16
  checkpoint and wrote an "mxfp8" results row (issue 15)."""
  wd = tmp_path / "run"
  _run(wd, config=dataclasses.replace(TINY, recipe="bf16"), stop_at_step=4)
  changed = dataclasses.replace(TINY, recipe="mxfp8", learning_rate=1e-2)
  with pytest.raises(ValueError, match="refusing to --resume") as err:
    _run(wd, config=changed, resume=True)
  assert "recipe: recorded 'bf16', now 'mxfp8'" in str(err.value)
  assert "learning_rate: recorded 0.003, now 0.01" in str(err.value)
  assert read_results(str(wd / "results.jsonl")) == []  # no row for the refused run
  # the recorded config resumes and completes, with one row
  assert _run(wd, config=dataclasses.replace(TINY, recipe="bf16"), resume=True)["completed"]
  [row] = read_results(str(wd / "results.jsonl"))
  assert row["config"]["recipe"] == "bf16"


def test_every_numeric_config_field_declares_its_domain():
  import typing  # pylint: disable=import-outside-toplevel
  from experiments.alto.experiment import AltoConfig  # pylint: disable=import-outside-toplevel
  from experiments.fair_cast.experiment import FairCastConfig  # pylint: disable=import-outside-toplevel
  from experiments.memoir.experiment import MemoirExperimentConfig  # pylint: disable=import-outside-toplevel
  from experiments.mxfp8_rl.experiment import MXFP8RLConfig  # pylint: disable=import-outside-toplevel
  from experiments.stale_sampler.experiment import StaleSamplerConfig  # pylint: disable=import-outside-toplevel
  from experiments.temperon.experiment import TemperonConfig  # pylint: disable=import-outside-toplevel
  from experiments.kv_cache.experiment import KVCacheConfig  # pylint: disable=import-outside-toplevel
  from experiments.looped_rl.experiment import LoopedRLConfig  # pylint: disable=import-outside-toplevel
  from experiments.optimizer_state.experiment import OptimizerStateConfig  # pylint: disable=import-outside-toplevel
  from experiments.qlora.experiment import QLoRAConfig  # pylint: disable=import-outside-toplevel
  for cls in (lm.LMConfig, AltoConfig, TemperonConfig, MemoirExperimentConfig,
              StaleSamplerConfig, FairCastConfig, MXFP8RLConfig, KVCacheConfig,
              LoopedRLConfig, OptimizerStateConfig, QLoRAConfig, RunOptions):
    hints = typing.get_type_hints(cls)
    undeclared = [f.name for f in dataclasses.fields(cls)
                  if hints[f.name] in (int, float) and "domain" not in f.metadata]
    assert not undeclared, (cls.__name__, undeclared)
    # Before (issue 51): seeds were [0, inf), and seed 2**32 silently gave seed 0's keys.
    seeds = [f for f in dataclasses.fields(cls)
             if f.name.endswith("seed") and hints[f.name] is int]
    assert all(f.metadata["domain"] == SEED_DOMAIN for f in seeds), cls.__name__
  with pytest.raises(ValueError, match=r"LMConfig.seed must be in \[0, 4294967296\), "
                     "got 4294967296"):
    lm.LMConfig(seed=2**32)


def test_out_of_disk_space_prints_one_line_with_the_last_good_checkpoint(tmp_path):
  """Before: 320 log lines with the cause buried under library tracebacks."""
  disk = tmp_path / "disk"
  disk.mkdir()
  if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs",
                                          str(disk)], capture_output=True).returncode:
    pytest.skip("needs root and tmpfs to fill a disk")
  try:
    config = dataclasses.replace(TINY, num_steps=400, checkpoint_every=20, eval_every=0,
                                 d_model=32, d_ff=64, log_every=50)
    out = subprocess.run(_cli(disk / "run", config=config), capture_output=True, text=True,
                         timeout=300, cwd=REPO_DIR)
  finally:
    subprocess.run(["umount", str(disk)], check=False)
  assert out.returncode == 74, out.stderr[-3000:]
  errors = [l for l in out.stderr.splitlines() if not l.startswith(("I1", "W1"))]
  assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
  assert errors[0].startswith("error: no space left on device")
  assert "last good checkpoint: step" in errors[0] and "--resume" in errors[0]


# ------------------------------------------------------------------------ divergence


def test_a_diverged_run_keeps_its_last_healthy_checkpoint_to_resume_from(tmp_path, caplog):
  """Before: a finite but diverged state became the latest checkpoint and, with only
  the newest two kept, resuming could only continue the divergence."""
  def train_step(state, batch, key):
    del batch, key
    step = state["step"] + 1
    loss = jnp.where(step <= 3, 1.0, 1e6)  # blows up after step 3
    return {"step": step}, {"loss": loss}

  ck = Checkpointer(str(tmp_path / "ck"), max_to_keep=2)
  settings = LoopSettings(num_steps=8, log_every=1, eval_every=0, checkpoint_every=1,
                          histogram_every=0, max_healthy_loss=100.0)
  start = Snapshot({"step": jnp.zeros((), jnp.int32)}, jax.random.PRNGKey(0), 0, 0)
  run_loop(start=start, train_step=train_step, batch_at=lambda p: None, settings=settings,
           writer=MetricWriter(str(tmp_path / "tb")), checkpointer=ck)
  assert ck.all_steps() == [3, 7, 8]  # the newest two, and the last healthy (3)
  resumed = restore_or_initialize(ck, True, lambda: start)
  assert resumed.step == 8 and not resumed.record["healthy"]
  assert "--resume_step" in caplog.text  # the warning says how to go back
  back = restore_or_initialize(ck, True, lambda: start, resume_step=3)
  assert back.step == 3 and back.record["healthy"] and ck.all_steps() == [3]
  ck.close()


# --------------------------------------------------------------------------- report


def test_report_tolerates_damaged_and_duplicate_rows_and_never_averages_fewer_seeds(
    tmp_path):
  from experiments.common.sweeps.sweep_spec import Arm, Sweep  # pylint: disable=import-outside-toplevel
  from launch.manifest import expand, write_manifest  # pylint: disable=import-outside-toplevel
  from launch.report import build_report  # pylint: disable=import-outside-toplevel
  sweep = Sweep("toy", "experiments.lm", TINY, (Arm("a", {"recipe": "fp32"}),),
                seeds=(0, 1), baseline="a", metrics=("eval/loss", "train/loss"),
                curves=())
  runs = expand(sweep, str(tmp_path))
  write_manifest(sweep, runs, str(tmp_path))
  path = str(tmp_path / "results.jsonl")
  results_lib.append_result(path, {"run_name": runs[0].run_name, "completed": True,
                                   "metrics": {"eval/loss": 1.0, "train/loss": 2.0}})
  # The old bug's row: only eval metrics, steps_per_s a string.
  with open(path, "a") as f:
    f.write(json.dumps({"run_name": runs[1].run_name, "completed": True,
                        "metrics": {"eval/loss": 1.5}, "steps_per_s": "nan"}) + "\n")
    f.write('{"run_name": "truncated by a full disk\n')
  results_lib.append_result(path, {"run_name": runs[0].run_name, "completed": True,
                                   "metrics": {"eval/loss": 1.1, "train/loss": 2.0}})
  text = open(build_report(str(tmp_path))).read()
  assert "results.jsonl:3: not a results row" in text
  assert f"`{runs[0].run_name}` (2 rows)" in text  # the newest complete row is used
  assert "| `a` (baseline) | 2 | 1.3000 ± 0.2828 | n/a (1 of 2 runs lack it) |" in text
  assert f"missing in `{runs[1].run_name}`" in text
