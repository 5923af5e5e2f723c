"""End-to-end smoke tests of experiments.lm: what it writes, exact resume, --help."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from experiments.lm import experiment as lm
from experiments.common.harness import workdir as workdir_lib
from experiments.common.harness.config_flags import config_to_flags
from experiments.common.evidence.results import read_results
from experiments.common.harness.run_options import RunOptions
from experiments.common.evidence.tensorboard_reader import (read_hparams_session, read_histograms,
                                                            read_scalars)

from experiments.common.harness.repo_paths import REPO_DIR as REPO
from tests import compile_cache


# Runs of one tiny config (full, stopped and resumed) rebuild the same jitted steps.
_compile_each_program_once = compile_cache.module_fixture()


TINY = lm.LMConfig(num_steps=20, warmup_steps=2, seq_len=32, batch_size=8, d_model=32,
                   num_layers=1, num_heads=2, d_ff=64, eval_every=10, eval_batches=2,
                   log_every=5, checkpoint_every=10, histogram_every=10, max_chars=100_000,
                   recipe="bf16")


def _run(workdir, config=TINY, **options):
  return lm.train_and_evaluate(config, RunOptions(workdir=str(workdir), **options))


def test_smoke_writes_events_checkpoint_results(tmp_path):
  summary = _run(tmp_path / "run")
  wd = tmp_path / "run"
  assert summary["completed"] and summary["step"] == 20

  scalars = read_scalars(str(wd))
  # log_every = 5: train metrics at every 5th step only (each step is still checked)
  assert [s for s, _ in scalars["train/loss"]] == [5, 10, 15, 20]
  assert [s for s, _ in scalars["eval/loss"]] == [0, 10, 20]
  for tag in ("train/grad_norm", "train/accuracy", "eval/accuracy", "perf/steps_per_s",
              "numerics/weight_quant_rel_error/block_0/qkv/kernel"):
    assert tag in scalars, tag
  assert scalars["train/loss"][-1][1] < scalars["train/loss"][0][1]
  # bf16 rounds weights: the measured quantization error is non-zero and small.
  qerr = scalars["numerics/weight_quant_rel_error/block_0/qkv/kernel"][-1][1]
  assert 1e-4 < qerr < 1e-2

  hists = read_histograms(str(wd))
  assert [s for s, _ in hists["params/block_0/qkv/kernel"]] == [0, 10, 20]
  assert "numerics/weight_quant_error/block_0/ff_in/kernel" in hists
  # The LM head stays bf16 under every recipe, so its error is not reported.
  assert "numerics/weight_quant_error/head/kernel" not in hists

  session = read_hparams_session(str(wd))
  assert session["trial_id"] == "run" and session["status"] == "STATUS_SUCCESS"
  assert session["hparams"]["recipe"] == "bf16"
  # Integers are written as their digits (TensorBoard's HParams table would show a
  # float 32 as 3.2e+1 and offer no exact filter on it; launch.tensorboard_views).
  assert session["hparams"]["d_model"] == "32"

  meta = json.load(open(wd / "config.json"))
  assert meta["config"] == dataclasses.asdict(TINY)
  assert len(meta["git"]["commit"]) == 40
  assert sorted(os.listdir(wd / "checkpoints"))[:2] == ["10", "20"]

  rows = read_results(str(wd / "results.jsonl"))
  assert len(rows) == 1
  assert rows[0]["run_name"] == "run" and rows[0]["config"]["recipe"] == "bf16"
  # the row keeps the float64 value; the event stores it as float32
  assert abs(rows[0]["metrics"]["eval/loss"] - scalars["eval/loss"][-1][1]) < 1e-6
  assert rows[0]["steps_per_s"] > 0


def test_resume_reproduces_uninterrupted_run_bit_for_bit(tmp_path):
  config = dataclasses.replace(TINY, recipe="fp32", log_every=1)
  full = _run(tmp_path / "full", config)
  stopped = _run(tmp_path / "split", config, stop_at_step=10)
  assert not stopped["completed"] and stopped["step"] == 10
  assert read_results(str(tmp_path / "split" / "results.jsonl")) == []  # no row yet
  assert read_hparams_session(str(tmp_path / "split"))["status"] is None  # not ended
  with pytest.raises(FileExistsError, match="--resume"):
    _run(tmp_path / "split", config)
  resumed = _run(tmp_path / "split", config, resume=True)
  assert resumed["completed"] and resumed["resumed_from_step"] == 10

  a = read_scalars(str(tmp_path / "full"))["train/loss"]
  b = read_scalars(str(tmp_path / "split"))["train/loss"]
  assert [s for s, _ in a] == list(range(1, 21)) == [s for s, _ in b]
  assert [v for _, v in a] == [v for _, v in b]  # exact float equality, every step
  assert full["metrics"] == resumed["metrics"]
  ea = read_scalars(str(tmp_path / "full"))["eval/loss"]
  eb = read_scalars(str(tmp_path / "split"))["eval/loss"]
  assert ea == eb
  assert read_hparams_session(str(tmp_path / "split"))["status"] == "STATUS_SUCCESS"
  # Resuming a finished run says so and writes nothing (issue 16).
  with pytest.raises(workdir_lib.RunAlreadyCompleted, match="completed run"):
    _run(tmp_path / "split", config, resume=True)
  assert len(read_results(str(tmp_path / "split" / "results.jsonl"))) == 1


def test_cli_help_documents_every_flag():
  out = subprocess.run([sys.executable, "-m", "experiments.lm", "--help"],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
  assert out.returncode in (0, 1), out.stderr  # absl exits 1 after printing --help
  assert "experiments/lm/__main__.py:" in out.stdout
  for f in dataclasses.fields(lm.LMConfig) + dataclasses.fields(RunOptions):
    assert f"--{f.name}" in out.stdout or f"--[no]{f.name}" in out.stdout, f.name
    assert f.metadata["help"].split()[0] in out.stdout


def test_cli_run_prints_locations(tmp_path):
  flags = config_to_flags(dataclasses.replace(TINY, num_steps=4, eval_every=2,
                                              checkpoint_every=2, histogram_every=2))
  out = subprocess.run([sys.executable, "-m", "experiments.lm", *flags,
                        f"--workdir={tmp_path / 'cli'}"], capture_output=True, text=True,
                       timeout=120, cwd=REPO)
  assert out.returncode == 0, out.stderr[-3000:]
  # A workdir outside runs/lm/: the view command names the run's own directory, not
  # its arbitrary parent.
  assert f"tensorboard --logdir {tmp_path / 'cli'} " in out.stdout
  assert "(this run: cli)" in out.stdout
  assert "results row:" in out.stdout
  assert (tmp_path / "cli" / "results.jsonl").exists()


def test_the_view_command_names_the_experiment_or_the_run_directory(tmp_path):
  from experiments.common.harness.script import view_dir
  assert view_dir(str(tmp_path / "runs" / "lm" / "default"), "lm") == str(
      tmp_path / "runs" / "lm")
  assert view_dir(str(tmp_path / "x"), "lm") == str(tmp_path / "x")


def test_bad_recipe_fails_before_training(tmp_path):
  with pytest.raises(ValueError, match="recipe"):
    _run(tmp_path / "bad", dataclasses.replace(TINY, recipe="nope"))


def test_delayed_scaling_state_and_telemetry_are_carried_and_logged(tmp_path):
  # fp8_delayed keeps amax histories in the model's _overwrite_with_gradient collection:
  # the train step replaces them with their gradient, the checkpoint holds them, and
  # resume continues them exactly; telemetry is logged under numerics/<layer>/...
  config = dataclasses.replace(TINY, recipe="fp8_delayed", numerics_telemetry=True,
                               num_steps=4, warmup_steps=1, eval_every=2, log_every=1,
                               checkpoint_every=2, histogram_every=0)
  full = _run(tmp_path / "full", config)
  _run(tmp_path / "split", config, stop_at_step=2)
  resumed = _run(tmp_path / "split", config, resume=True)
  assert full["metrics"] == resumed["metrics"]
  scalars = read_scalars(str(tmp_path / "full"))
  layer = "numerics/block_0/qkv/dot_general_0"
  for tag in (f"{layer}/forward_lhs/sqnr_db", f"{layer}/forward_rhs/saturated",
              f"{layer}/dgrad_lhs/flushed", f"{layer}/wgrad_rhs/scale_clamped"):
    assert [s for s, _ in scalars[tag]] == [1, 2, 3, 4], tag
  # Step 1 quantized with the initial scale 1; later steps use the amax history.
  sqnr = [v for _, v in scalars[f"{layer}/forward_lhs/sqnr_db"]]
  assert sqnr[1] != sqnr[0]
  assert not any(t.startswith("numerics/head") for t in scalars)  # bf16: no telemetry


def test_default_warmup_is_a_tenth_of_the_steps_so_short_runs_work():
  """`python -m experiments.lm --num_steps=100` used to exit 2 (warmup 100 >= steps)."""
  assert lm.LMConfig().warmup() == 100  # the default 1000 steps: as before
  assert lm.LMConfig(num_steps=100).warmup() == 10
  assert lm.LMConfig(num_steps=5).warmup() == 0
  assert lm.LMConfig(num_steps=100, warmup_steps=7).warmup() == 7
  with pytest.raises(ValueError, match="warmup_steps must be below num_steps"):
    lm.LMConfig(num_steps=100, warmup_steps=100)


def test_native_gemm_flag_trains_the_native_recipe_with_the_emulated_bits(tmp_path):
  """Issue 53 item 1: --native_gemm runs recipes.with_native_gemm(recipe); on the CPU
  its GEMMs are the emulated ones, so the run's metrics equal the plain recipe's; a
  recipe without a native GEMM is refused before training, naming the flag."""
  from experiments.common.trainers import lm_trainer  # pylint: disable=g-import-not-at-top
  config = dataclasses.replace(TINY, recipe="mxfp8", num_steps=3, warmup_steps=1,
                               eval_every=3, log_every=1, checkpoint_every=0,
                               histogram_every=0)
  native = dataclasses.replace(config, native_gemm=True)
  assert lm_trainer.build_lm(native, 16).recipe.name == "mxfp8+native"
  assert (_run(tmp_path / "native", native)["metrics"]
          == _run(tmp_path / "emulated", config)["metrics"])
  with pytest.raises(ValueError, match=r"--native_gemm: recipe 'bf16' has no GEMM with "
                                       r"a native form"):
    dataclasses.replace(TINY, native_gemm=True)
