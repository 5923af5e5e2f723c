"""A real sweep run locally, end to end: manifest -> parallel runs -> results -> REPORT.md."""

import json
import os
import subprocess
import sys

import pytest

from experiments.common.results import read_results
from experiments.common.tensorboard_reader import read_hparams_experiment

from experiments.common.repo_paths import REPO_DIR as REPO
TINY = ["--override=num_steps=8", "--override=eval_every=4", "--override=checkpoint_every=4",
        "--override=histogram_every=4", "--override=log_every=2"]


def _sweep(name, sweep_dir, extra=()):
  # --allow_dirty: these tests run in development trees too (the refusal has its own test).
  return subprocess.run([sys.executable, "-m", "launch.sweep", f"--sweep={name}",
                         f"--sweep_dir={sweep_dir}", "--parallel=2", "--run_timeout_s=240",
                         "--allow_dirty", *TINY, *extra], capture_output=True, text=True, timeout=600, cwd=REPO)


def _check(sweep_dir, arms, seeds=(0, 1)):
  rows = read_results(os.path.join(sweep_dir, "results.jsonl"))
  assert sorted((r["config"]["recipe"], r["config"]["seed"]) for r in rows) == sorted(
      (a, s) for a in arms for s in seeds)
  text = open(os.path.join(sweep_dir, "REPORT.md")).read()
  assert "## Ablation table" in text and "## Paired differences" in text
  for a in arms:
    assert f"| `{a}`" in text
  assert os.path.getsize(os.path.join(sweep_dir, "plots", "train_loss.png")) > 1000
  exp = read_hparams_experiment(os.path.join(sweep_dir, "runs"))
  assert sorted(exp["hparams"]["recipe"]) == sorted(arms) and exp["metrics"][0] == "eval/loss"


def test_builtin_recipes_sweep_runs_locally(tmp_path):
  out = _sweep("lm_builtin_recipes", tmp_path / "sw")
  assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
  _check(str(tmp_path / "sw"), ("fp32", "bf16"))
  lines = open(tmp_path / "sw" / "manifest.jsonl").read().splitlines()
  assert len(lines) == 4 and json.loads(lines[0])["arm"] == "fp32"
  again = _sweep("lm_builtin_recipes", tmp_path / "sw")  # finished runs are skipped
  assert again.returncode == 0
  assert len(read_results(str(tmp_path / "sw" / "results.jsonl"))) == 4


TINY_LM = ["--override=d_model=32", "--override=num_layers=1", "--override=d_ff=64",
           "--override=seq_len=32", "--override=batch_size=8", "--override=max_chars=200000",
           "--override=eval_batches=2", "--override=warmup_steps=2"]


def test_lm_recipes_sweep_one_seed(tmp_path):
  """Bounded form: both arms, seed 0 only (mxfp8 compiles for ~20 s on 2 CPU cores)."""
  out = _sweep("lm_recipes", tmp_path / "sw", [*TINY_LM, "--seeds=0"])
  assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
  _check(str(tmp_path / "sw"), ("bf16", "mxfp8"), seeds=(0,))


@pytest.mark.slow
def test_lm_recipes_sweep_two_seeds(tmp_path, request):
  """The declared sweep (2 arms x 2 seeds, tiny model): about 70 s on 2 cores."""
  if "slow" not in (request.config.getoption("markexpr") or ""):
    pytest.skip("full sweep; run with: pytest -m slow")
  out = _sweep("lm_recipes", tmp_path / "sw", TINY_LM)
  assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
  _check(str(tmp_path / "sw"), ("bf16", "mxfp8"))
  text = open(tmp_path / "sw" / "REPORT.md").read()
  assert "| `mxfp8` | `eval/loss` |" in text and "| 2 |" in text
