"""A sweep directory is data: rebuilding its report never runs code it names (issue 51,
row 2: ``"appendix": "runpy:run_path"`` in a copied sweep.json ran the ``__main__.py``
beside it)."""

import json
import os
import subprocess
import sys

import pytest

from experiments.common.evidence.results import append_result
from experiments.common.harness.repo_paths import REPO_DIR
from experiments.common.sweeps.sweep_spec import Arm, Sweep
from experiments.lm.experiment import LMConfig
from launch import registry
from launch.manifest import expand, write_manifest
from launch.report import UntrustedAppendix, build_report, registered_appendix


def _sweep_dir(tmp_path, name, appendix):
  """A finished toy sweep whose sweep.json records ``name`` and ``appendix``, with a
  ``__main__.py`` beside it that leaves a mark if anything runs it."""
  sweep = Sweep("toy", "experiments.lm", LMConfig(), (Arm("base", {"recipe": "fp32"}),),
                seeds=(0,), baseline="base", metrics=("eval/loss",), curves=())
  runs = expand(sweep, str(tmp_path))
  write_manifest(sweep, runs, str(tmp_path))
  for r in runs:
    append_result(r.results_file, {"run_name": r.run_name, "metrics": {"eval/loss": 1.0}})
  info = json.loads((tmp_path / "sweep.json").read_text())
  info.update(name=name, appendix=appendix)
  (tmp_path / "sweep.json").write_text(json.dumps(info))
  mark = tmp_path / "RAN"
  (tmp_path / "__main__.py").write_text(f"open({str(mark)!r}, 'w').write('ran')\n")
  return mark


@pytest.mark.parametrize("name", ["lm_recipes", "not_registered"])
def test_an_appendix_the_declaration_does_not_name_is_refused(tmp_path, monkeypatch, name):
  mark = _sweep_dir(tmp_path, name, "runpy:run_path")
  monkeypatch.chdir(tmp_path)  # where run_path(".") would find __main__.py
  with pytest.raises(UntrustedAppendix, match="runpy:run_path"):
    build_report(str(tmp_path))
  assert not mark.exists()


def test_the_command_line_refuses_in_one_line_with_exit_2(tmp_path):
  mark = _sweep_dir(tmp_path, "lm_recipes", "runpy:run_path")
  out = subprocess.run([sys.executable, "-m", "launch.report", f"--sweep_dir={tmp_path}"],
                       cwd=REPO_DIR, capture_output=True, text=True, timeout=120)
  assert out.returncode == 2, out.stderr[-2000:]
  [line] = [l for l in out.stderr.splitlines() if l.strip()]
  assert line.startswith("error: ") and "refusing to run code" in line
  assert not mark.exists()


def test_the_appendix_comes_from_the_registered_declaration():
  sweep = registry.get("kv_cache")
  info = {"name": "kv_cache", "appendix": sweep.appendix}
  assert registered_appendix(info) is registry.appendix_function(sweep.appendix)
  assert registered_appendix({"name": "toy", "appendix": ""}) is None


def test_committed_reports_name_their_registered_appendix():
  # Every committed sweep.json passes the check, so every committed report rebuilds.
  reports = os.path.join(REPO_DIR, "experiments")
  for paper in sorted(os.listdir(reports)):
    for entry in sorted(os.listdir(os.path.join(reports, paper))
                        if os.path.isdir(os.path.join(reports, paper)) else []):
      path = os.path.join(reports, paper, entry, "sweep.json")
      if entry.startswith("report") and os.path.exists(path):
        with open(path) as f:
          info = json.load(f)
        if info.get("appendix"):
          assert registered_appendix(info) is not None, path
