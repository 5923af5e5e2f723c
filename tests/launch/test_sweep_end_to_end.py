"""A real sweep run locally, end to end: manifest -> parallel runs -> results -> REPORT.md."""

import json
import os
import subprocess
import sys

import pytest

from experiments.common.evidence.results import read_results
from launch import tensorboard_views

from experiments.common.harness.repo_paths import REPO_DIR as REPO
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
  exp = tensorboard_views.read_experiment(sweep_dir)  # in the first run: no `.` run
  assert sorted(exp["hparams"]["recipe"]) == sorted(arms) and exp["metrics"][0] == "eval/loss"


def test_builtin_recipes_sweep_runs_locally_and_a_rerun_mends_what_was_lost(tmp_path):
  """The rerun half (issue 35). Before: a row appended after a partial last line was
  glued onto it; a completed run whose row was lost never got it back; a run whose
  events were lost was averaged out of the curves with no note."""
  sw = tmp_path / "sw"
  out = _sweep("lm_builtin_recipes", sw)
  assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
  _check(str(sw), ("fp32", "bf16"))
  lines = open(sw / "manifest.jsonl").read().splitlines()
  assert len(lines) == 4 and json.loads(lines[0])["arm"] == "fp32"
  info = json.load(open(sw / "sweep.json"))  # the overrides are part of the record
  assert info["overrides"]["num_steps"] == 8 and info["base"]["num_steps"] == 8
  report = open(sw / "REPORT.md").read()
  assert f"--sweep_dir={sw} {' '.join(sorted(TINY))}` reruns it" in report

  rows = open(sw / "results.jsonl").read().splitlines(keepends=True)
  first, crashed, _, cut = [json.loads(r) for r in rows]
  # A run killed after its final checkpoint, before its row; a row cut mid-write (its
  # run completed); a completed run's event files lost.
  os.remove(sw / "runs" / crashed["run_name"] / "COMPLETED.json")
  (sw / "results.jsonl").write_text(rows[0] + rows[2] + rows[3][:len(rows[3]) // 2])
  for f in os.listdir(sw / "runs" / first["run_name"]):
    if "tfevents" in f:
      os.remove(sw / "runs" / first["run_name"] / f)
  again = _sweep("lm_builtin_recipes", sw)
  assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
  problems = []
  mended = {r["run_name"]: r for r in read_results(str(sw / "results.jsonl"), problems)}
  assert len(mended) == 4 and len(problems) == 1  # the cut line stays, on its own line
  assert mended[cut["run_name"]] == cut  # restored from COMPLETED.json, not retrained
  assert mended[crashed["run_name"]]["resumed_from_step"] == 8
  report = open(sw / "REPORT.md").read()
  assert "- runs completed: 4 of 4" in report
  assert f"**Damaged results lines, skipped:** `{sw}/results.jsonl:3: not a results row" \
      in report
  assert ("**Completed runs without events** (no event file in their run directory, so "
          f"no curves): `{first['run_name']}`") in report
  assert (f"`{first['config']['recipe']}` is the mean of 1 run(s), not the table's 2 (no "
          f"`train/loss` events in `{first['run_name']}`)") in report


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
