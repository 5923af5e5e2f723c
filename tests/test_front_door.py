"""One front door: the library imports as ``lowprec.numerics`` / ``lowprec.models`` only.

Before, ``lowprec/__init__.py`` appended the checkout's root to its ``__path__``, so
``lowprec.experiments`` and ``lowprec.launch`` imported too, and ``import numerics``
beside ``from lowprec import numerics`` made a second copy of every module (two
``Recipe`` classes whose instances never compare equal).
"""

import subprocess
import sys

import pytest

from experiments.common.harness.repo_paths import REPO_DIR


def _python(code: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", code], cwd=REPO_DIR, capture_output=True,
                        text=True, timeout=300, check=False)


@pytest.mark.parametrize("name", ["lowprec.experiments", "lowprec.launch", "lowprec.tests"])
def test_the_harness_is_not_under_lowprec(name):
  out = _python(f"import {name}")
  assert out.returncode != 0
  assert "ModuleNotFoundError" in out.stderr


@pytest.mark.parametrize("bare,full", [("numerics", "lowprec.numerics"),
                                       ("models", "lowprec.models")])
def test_a_bare_import_names_the_front_door(bare, full):
  out = _python(f"import {bare}")
  assert out.returncode != 0
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith("ImportError: this package is " + full), last


def test_one_module_object_per_module():
  out = _python(
      "import sys\n"
      "from lowprec import numerics, models\n"
      "from lowprec.numerics import recipes\n"
      "assert numerics.recipes is recipes is sys.modules['lowprec.numerics.recipes']\n"
      "assert models.quantize_model.__module__.startswith('lowprec.models')\n"
      "print(sorted(m for m in sys.modules if m.split('.')[0] in "
      "('numerics', 'models', 'experiments', 'launch')))\n")
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == "[]"
