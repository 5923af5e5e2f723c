"""Sweep declaration, expansion to a manifest, the CLI dry run and the SLURM script."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from experiments.lm.experiment import LMConfig
from launch import registry
from launch.slurm import SlurmOptions, write_array_script
from launch.sweep import prepare
from experiments.common.sweeps.sweep_data import read_manifest
from experiments.common.sweeps.sweep_spec import Arm, Sweep
from launch.manifest import expand, swept_hparams, write_manifest

from experiments.common.harness.repo_paths import REPO_DIR as REPO


def test_registry():
  assert {"lm_recipes", "lm_builtin_recipes"} <= set(registry.names())
  with pytest.raises(KeyError, match="known"):
    registry.get("nope")


def test_expand_lm_recipes(tmp_path):
  sweep = registry.get("lm_recipes")
  runs = expand(sweep, str(tmp_path))
  assert [(r.arm, r.seed) for r in runs] == [("bf16", 0), ("bf16", 1), ("mxfp8", 0),
                                            ("mxfp8", 1)]
  assert len({r.run_name for r in runs}) == 4
  for r in runs:
    assert r.workdir == os.path.join(str(tmp_path), "runs", r.run_name)
    assert r.config["recipe"] == r.arm and r.config["seed"] == r.seed
    assert r.command[1:3] == ("-m", "experiments.lm")
    for f in dataclasses.fields(LMConfig):  # every field is explicit in the command
      assert any(c.startswith(f"--{f.name}=") for c in r.command), f.name
    assert "--resume" in r.command and f"--results_file={tmp_path}/results.jsonl" in r.command
  assert swept_hparams(sweep, runs) == {"recipe": ["bf16", "mxfp8"], "seed": [0, 1]}


def test_overrides_and_validation(tmp_path):
  sweep = registry.get("lm_builtin_recipes")
  _, runs = prepare(sweep, str(tmp_path), ["num_steps=7", "d_model=16"])
  assert all(r.config["num_steps"] == 7 and r.config["d_model"] == 16 for r in runs)
  assert {r.run_name for r in runs}.isdisjoint(
      {r.run_name for r in prepare(sweep, str(tmp_path), [])[1]})  # names encode overrides
  sub, runs = prepare(sweep, str(tmp_path), [], seeds=[1])
  assert sub.seeds == (1,) and [r.seed for r in runs] == [1, 1]
  with pytest.raises(ValueError, match="not declared"):
    prepare(sweep, str(tmp_path), [], seeds=[5])
  with pytest.raises(ValueError, match="no field"):
    prepare(sweep, str(tmp_path), ["bogus=1"])
  base = LMConfig()
  with pytest.raises(ValueError, match="baseline"):
    Sweep("s", "experiments.lm", base, (Arm("a"),), (0,), baseline="b")
  with pytest.raises(ValueError, match="duplicate"):
    Sweep("s", "experiments.lm", base, (Arm("a"), Arm("a")), (0,), baseline="a")
  with pytest.raises(ValueError, match="no field"):
    Sweep("s", "experiments.lm", base, (Arm("a", {"lr": 1.0}),), (0,), baseline="a")
  with pytest.raises(ValueError, match="seeds"):
    Sweep("s", "experiments.lm", base, (Arm("a"),), (0, 0), baseline="a")


def test_manifest_roundtrip(tmp_path):
  sweep = registry.get("lm_builtin_recipes")
  runs = expand(sweep, str(tmp_path))
  write_manifest(sweep, runs, str(tmp_path))
  lines = read_manifest(str(tmp_path))
  assert [l["run_name"] for l in lines] == [r.run_name for r in runs]
  assert lines[0]["shell"].split()[1:3] == ["-m", "experiments.lm"]
  info = json.load(open(tmp_path / "sweep.json"))
  assert info["baseline"] == "fp32" and info["num_runs"] == 4


def test_cli_dry_run_prints_commands_and_writes_nothing(tmp_path):
  out = subprocess.run([sys.executable, "-m", "launch.sweep", "--sweep=lm_recipes",
                        "--dry_run", f"--sweep_dir={tmp_path / 'sw'}"], capture_output=True,
                       text=True, timeout=120, cwd=REPO)
  assert out.returncode == 0, out.stderr[-2000:]
  commands = [l for l in out.stdout.splitlines() if l and not l.startswith("#")]
  assert len(commands) == 4
  assert all(" -m experiments.lm " in c for c in commands)
  assert sum("--recipe=mxfp8" in c for c in commands) == 2
  assert not (tmp_path / "sw").exists()


def test_cli_list_prints_the_sweeps_and_no_backend_noise():
  """Before (issue 51): the listing opened with JAX's "Failed to open libtpu.so" line."""
  out = subprocess.run([sys.executable, "-m", "launch.sweep", "--list"], capture_output=True,
                       text=True, timeout=120, cwd=REPO)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.startswith("alto: ") and "lm_recipes: " in out.stdout
  assert "libtpu" not in out.stderr and "backend" not in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("module, flag, code", [("launch.sweep", "--help", 0),
                                               ("launch.report", "--no_such_flag=1", 2)])
def test_cli_flag_parsing_exit_statuses(module, flag, code):
  """Before (issue 51 row 16): both exited 1, an unknown flag with absl's FATAL banner.
  (Each entry point's parser is the scripts' one; one case each keeps this cheap.)"""
  out = subprocess.run([sys.executable, "-m", module, flag], capture_output=True, text=True,
                       timeout=120, cwd=REPO)
  assert out.returncode == code, out.stderr[-2000:]
  if code == 0:
    assert "--help" in out.stdout
  else:
    lines = [l for l in out.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        "error: Unknown command line flag 'no_such_flag'"), lines


def test_slurm_array_script(tmp_path):
  runs = expand(registry.get("lm_builtin_recipes"), str(tmp_path))
  path = write_array_script(runs, str(tmp_path), "lmb", SlurmOptions(max_concurrent=2,
                                                                     gpus_per_task=1))
  text = open(path).read()
  assert "#SBATCH --array=0-3%2" in text and "#SBATCH --gpus-per-task=1" in text
  assert "SLURM_ARRAY_TASK_ID + 1" in text
  # Every run is a job step, so `scancel --signal=TERM <task>` reaches it.
  assert 'srun --cpus-per-task=${SLURM_CPUS_PER_TASK} bash -c "exec ${CMD}" &' in text
  commands = open(tmp_path / "commands.txt").read().splitlines()
  # The interpreter that wrote the script replaces the manifest's `python`.
  assert commands == [r.shell_command().replace("python", sys.executable, 1) for r in runs]
  assert subprocess.run(["bash", "-n", path]).returncode == 0
  multi = write_array_script(runs, str(tmp_path), "lmb", SlurmOptions(nodes=2))
  assert "srun --cpus-per-task=${SLURM_CPUS_PER_TASK} --kill-on-bad-exit=1 bash" in \
      open(multi).read()


def test_list_prints_every_sweep_with_runs_and_measured_duration():
  from launch.sweep import list_sweeps  # pylint: disable=import-outside-toplevel
  text = list_sweeps()
  assert set(l.split(":")[0] for l in text.splitlines()) == set(registry.names())
  assert "lm_recipes: 2 arms x 2 seeds = 4 runs" in text
  line = next(l for l in text.splitlines() if l.startswith("lm_recipes"))
  assert "min wall for 4 runs" in line  # measured when the committed report ran


def test_dirty_tree_refused_unless_allowed():
  from launch.sweep import dirty_tree_refusal  # pylint: disable=import-outside-toplevel
  dirty = {"commit": "a" * 40, "dirty": True}
  assert "refusing to run sweep s" in dirty_tree_refusal("s", dirty, False)
  assert dirty_tree_refusal("s", dirty, True) is None
  assert dirty_tree_refusal("s", {"commit": "a" * 40, "dirty": False}, False) is None


def test_calibration_seeds_are_never_evaluation_seeds(tmp_path):
  sweep = registry.get("lm_builtin_recipes")
  with pytest.raises(ValueError, match="calibration"):
    dataclasses.replace(sweep, calibration_seeds=(1,))
  cal = dataclasses.replace(sweep, calibration_seeds=(7,))
  with pytest.raises(ValueError, match="allow_calibration_seeds"):
    prepare(cal, str(tmp_path), [], seeds=[7])
  _, runs = prepare(cal, str(tmp_path), [], seeds=[0, 7], allow_calibration_seeds=True)
  assert [(r.seed, r.calibration) for r in runs] == [(0, False), (7, True)] * 2


def test_claims_are_validated_at_declaration():
  from experiments.common.sweeps.sweep_spec import Claim  # pylint: disable=import-outside-toplevel
  sweep = registry.get("lm_builtin_recipes")
  with pytest.raises(ValueError, match="margin"):
    Claim("x", "equivalent", "bf16", "fp32", "eval/loss")
  with pytest.raises(ValueError, match="kind"):
    Claim("x", "faster", "bf16", "fp32", "eval/loss")
  with pytest.raises(ValueError, match="names arm"):
    dataclasses.replace(sweep, claims=(Claim("x", "better", "nope", "fp32", "eval/loss"),))
