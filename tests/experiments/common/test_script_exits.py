"""An experiment script's answer to what a user can act on: one line and its exit status
(issue 51 rows 6-12 and 16), checked in-process on one tiny LM run (a subprocess costs
seconds of imports per case)."""

import contextlib
import dataclasses
import logging
import os
import shutil
import subprocess
import sys

import pytest
from absl import app, flags

from experiments.common.evidence.results import read_results
from experiments.common.harness import log_filters
from experiments.common.harness import script
from experiments.common.harness import workdir as workdir_lib
from experiments.common.harness.checkpoint import Checkpointer
from experiments.common.harness.run import Run
from experiments.common.harness.run_options import RunOptions, resolve_run_options
from experiments.common.harness.train_loop import restore_or_initialize
from experiments.lm import experiment as lm
from tests.experiments.common.tiny_lm import TINY
from tests import compile_cache

_compile_each_program_once = compile_cache.module_fixture()


@pytest.fixture(scope="module")
def completed(tmp_path_factory, _compile_each_program_once):
  """A completed tiny LM run (checkpoints at steps 4 and 8); copy it before changing it."""
  del _compile_each_program_once
  wd = tmp_path_factory.mktemp("completed") / "run"
  lm.train_and_evaluate(TINY, RunOptions(workdir=str(wd)))
  return wd


def _exit(capsys, config=TINY, **options):
  """The script's exit status and its stdout and stderr lines for one run."""
  with pytest.raises(SystemExit) as e:
    summary = script.train_or_exit(lm.train_and_evaluate, config, RunOptions(**options))
    raise AssertionError(f"no exit: {summary}")
  out, err = capsys.readouterr()
  return e.value.code, out.splitlines(), err.splitlines()


@contextlib.contextmanager
def _read_only(path):
  """``path`` (a directory) that nobody can create entries in: immutable for root
  (whom modes do not stop), mode 0555 otherwise."""
  root = os.geteuid() == 0
  if root and subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
    pytest.skip("needs chattr to make a directory immutable as root")
  if not root:
    os.chmod(path, 0o555)
  try:
    yield
  finally:
    if root:
      subprocess.run(["chattr", "-i", str(path)], check=True)
    else:
      os.chmod(path, 0o755)


# tensorstore's callbacks into orbax's closed event loop (an entry point drops them:
# the test below); pytest reports each as a warning.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_every_checkpoint_damaged_is_one_line_with_each_reason_and_exit_2(
    tmp_path, capsys, completed):
  """Before: exit 1, a 30-line CheckpointError traceback."""
  wd = tmp_path / "run"
  shutil.copytree(completed, wd)
  for name in ("COMPLETED.json", "results.jsonl"):
    os.remove(wd / name)
  for d, _, files in os.walk(wd / "checkpoints"):
    for f in files:
      if os.path.basename(d) == "d":  # the array data files
        os.truncate(os.path.join(d, f), 10)
  code, _, err = _exit(capsys, workdir=str(wd), resume=True)
  assert code == 2 and len(err) == 1, err
  assert err[0].startswith("error: no intact checkpoint to resume from in ")
  assert "step 8 cannot be read" in err[0] and "step 4 cannot be read" in err[0]
  assert "<bound method" not in err[0] and "without --resume" in err[0]


def test_a_read_only_run_directory_is_one_line_and_exit_2(tmp_path, capsys):
  """Before: exit 1, a 40-line traceback from inside orbax."""
  wd = tmp_path / "run"
  wd.mkdir()
  with _read_only(wd):
    code, _, err = _exit(capsys, workdir=str(wd))
  assert code == 2 and len(err) == 1, err
  assert err[0].startswith(f"error: cannot write the run directory {wd} (")


@pytest.mark.parametrize("where", ["read_only_directory", "under_a_file"])
def test_an_unwritable_results_file_is_one_line_and_exit_2(tmp_path, capsys, where):
  """Before: the project's own message, but as a traceback and exit 1."""
  parent = tmp_path / "results"
  if where == "under_a_file":
    parent.write_text("a file where the results file's directory should be")
    guard = contextlib.nullcontext()
  else:  # a read-only mount, as a fetched sweep's results file may be on
    parent.mkdir()
    guard = _read_only(parent)
  with guard:
    code, _, err = _exit(capsys, workdir=str(tmp_path / "run"),
                         results_file=str(parent / "results.jsonl"))
  assert code == 2 and len(err) == 1, err
  assert err[0].startswith("error: cannot write the results file")
  assert not os.path.exists(tmp_path / "run" / "checkpoints" / "4")  # nothing trained


def test_a_completed_run_on_a_read_only_directory_is_already_completed(
    tmp_path, capsys, completed):
  """Before: PermissionError on .lock, exit 1 (a fetched sweep on a read-only mount)."""
  wd = tmp_path / "run"
  shutil.copytree(completed, wd)
  os.remove(wd / ".lock")
  with _read_only(wd):
    code, out, err = _exit(capsys, workdir=str(wd), resume=True)
  assert code == 0, err
  assert "holds a completed run" in out[0] and "nothing was written" in out[0]
  assert len(read_results(str(wd / "results.jsonl"))) == 1


@pytest.mark.parametrize("change, message", [
    ({"recipe": "bogus"}, "LMConfig.recipe must be one of ['fp32', "),
    ({"d_model": 30, "num_heads": 4}, "d_model=30 is not divisible by num_heads=4"),
    ({"seed": 2**63}, "LMConfig.seed must be in [0, 4294967296), got 9223372036854775808"),
])
def test_config_errors_are_found_with_the_config(change, message):
  """Before: each passed the config and failed later in the run with a traceback (the
  seed's an unreadable OverflowError)."""
  with pytest.raises(ValueError) as e:
    dataclasses.replace(TINY, **change)
  assert str(e.value).startswith(message)


@pytest.mark.parametrize("change", [{"max_chars": 1}, {"seq_len": 5000}])
def test_a_window_longer_than_the_text_is_one_line_and_exit_2(tmp_path, capsys, change):
  code, _, err = _exit(capsys, dataclasses.replace(TINY, **change), workdir=str(tmp_path))
  assert code == 2 and len(err) == 1, err
  assert err[0].startswith(f"error: seq_len={change.get('seq_len', TINY.seq_len)} needs ")
  assert "lower --seq_len or raise --max_chars" in err[0]


def _script_flags():
  flag_values = flags.FlagValues()
  script.define_script_flags(lm.LMConfig, RunOptions, flag_values=flag_values)
  for flag in (app.HelpFlag(), app.HelpshortFlag(), app.HelpfullFlag()):
    flags.DEFINE_flag(flag, flag_values=flag_values)
  return flag_values


def test_a_flag_value_refused_by_its_flag_is_one_line_and_exit_2(capsys):
  """Before: absl's "FATAL Flags parsing error" banner and exit 1."""
  with pytest.raises(SystemExit) as e:
    script.parse_flags(["lm", "--recipe=bogus"], _script_flags())
  err = capsys.readouterr().err.splitlines()
  assert e.value.code == 2 and len(err) == 1, err
  assert err[0].startswith("error: flag --recipe=bogus: value should be one of <fp32|bf16")


def test_help_exits_0(capsys):
  """Before: --help printed the flags and exited 1."""
  with pytest.raises(SystemExit) as e:
    script.parse_flags(["lm", "--help"], _script_flags())
  assert e.value.code == 0
  assert "--help" in capsys.readouterr().out  # absl's usage, printed


def test_the_resume_command_names_the_runs_flags():
  """Before: "continue with --resume", whose bare form resumes the default config's run."""
  argv = ["/r/experiments/lm/__main__.py", "--recipe=mxfp8", "--resume=false", "--seed=1",
          "--stop_at_step=4", "--resume_step", "2", "--workdir=a b"]
  assert script.resume_command(argv, "experiments.lm") == \
      "python -m experiments.lm --recipe=mxfp8 --seed=1 '--workdir=a b' --resume"


@pytest.mark.parametrize("name", ["../../../x", "a/b", "..", "."])
def test_a_run_name_is_one_plain_path_component(name):
  """Before: --run_name=../../../x wrote outside runs/."""
  with pytest.raises(ValueError, match="is not a plain name"):
    resolve_run_options(RunOptions(run_name=name), "lm", TINY)


def test_a_resume_with_nothing_to_resume_and_a_stop_step_never_reached_warn(
    tmp_path, caplog):
  """Before: both were silently ignored (an INFO line for the first)."""
  caplog.set_level(logging.WARNING)
  ck = Checkpointer(str(tmp_path / "checkpoints"))
  restore_or_initialize(ck, True, lambda: None)
  ck.close()
  assert "--resume: nothing to resume, no checkpoint in" in caplog.text
  run = Run("lm", TINY, RunOptions(stop_at_step=50), None, None, False, None)
  run.settings(TINY.num_steps)
  assert "--stop_at_step=50 does nothing: this run goes from step 0 to 8" in caplog.text


def test_an_empty_leftover_checkpoint_step_is_named_as_such(tmp_path):
  """Before: blamed on checkpoints that "predate carrying their config"."""
  (tmp_path / "checkpoints" / "4").mkdir(parents=True)
  ck = Checkpointer(str(tmp_path / "checkpoints"), config=TINY)
  with pytest.raises(workdir_lib.RunRefused, match=r"no checkpoint step there \(\[4\]\) "
                     "has readable metadata"):
    workdir_lib.claim(str(tmp_path), results_file=str(tmp_path / "r.jsonl"), resume=True,
                      config=TINY, checkpointer=ck)
  ck.close()


def test_callbacks_into_a_closed_event_loop_are_kept_out_of_the_output(monkeypatch, capsys):
  """Before: ~10 "RuntimeError: Event loop is closed" tracebacks from tensorstore's
  callbacks when a damaged checkpoint was skipped (the fallback itself worked)."""
  monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
  log_filters.quiet_library_info()

  class Raises:  # its finalizer's exception is unraisable, as a callback's is
    def __init__(self, message):
      self.message = message

    def __del__(self):
      raise RuntimeError(self.message)

  Raises("Event loop is closed")
  assert capsys.readouterr().err == ""
  Raises("another error")  # everything else still shows
  assert "RuntimeError: another error" in capsys.readouterr().err
