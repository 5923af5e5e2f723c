"""The library's messages name its modules as a user imports them (issue 51, row 14).

In a user's project ``models`` and ``numerics`` are their own packages; ours are
``lowprec.models`` and ``lowprec.numerics``. Every string the library can show at run
time (error and warning messages, hints; docstrings aside) that names one of our
modules says ``lowprec.``: the unused-rule hint said ``models.quantization.recording()``.
"""

import ast
import pathlib
import re

from experiments.common.harness.repo_paths import REPO_DIR

_BARE = re.compile(r"(?<![\w.])(models|numerics)\.[A-Za-z_]")


def _bare_names(path: pathlib.Path) -> list[str]:
  tree = ast.parse(path.read_text())
  docstrings = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      first = node.body[0] if node.body else None
      if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        docstrings.add(id(first.value))
  return [f"{path.relative_to(REPO_DIR)}:{node.lineno}: {node.value!r}"
          for node in ast.walk(tree)
          if isinstance(node, ast.Constant) and isinstance(node.value, str)
          and id(node) not in docstrings and _BARE.search(node.value)]


def test_library_strings_name_modules_with_lowprec():
  found = [hit for package in ("models", "numerics")
           for path in sorted(pathlib.Path(REPO_DIR, package).rglob("*.py"))
           for hit in _bare_names(path)]
  assert not found, "say lowprec.models... / lowprec.numerics...:\n" + "\n".join(found)


def test_the_check_sees_a_bare_name():
  assert _BARE.search("see models.quantization.recording()")
  assert not _BARE.search("see lowprec.models.quantization.recording()")
