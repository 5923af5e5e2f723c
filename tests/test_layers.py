"""Imports go only downwards: launch -> experiments -> models -> numerics.

Read from the source (``ast``), not by importing: ``numerics`` imports no Flax and
nothing above it, ``models`` nothing above it, ``experiments`` not ``launch``; the
harness (``experiments/common``, ``experiments/benchmarks``) imports no paper's folder;
and a paper's folder imports no other paper's, except the edges listed in
``_PAPER_EDGES`` (none now, and the list may only shrink: the LM trainer that alto,
optimizer_state and qlora used to import from the ``lm`` paper is the harness's
``experiments.common.trainers.lm_trainer``, and the MoE LM that optimizer_state
inherited from alto's config is ``experiments.common.trainers.moe_lm``).
"""

import ast
import os

from experiments.common.harness.repo_paths import REPO_DIR

_ORDER = {"numerics": 0, "models": 1, "experiments": 2, "launch": 3}
_HARNESS = ("common", "benchmarks")
_PAPER_EDGES: set[tuple[str, str]] = set()


def _modules(package: str):
  """(file relative to the repo, imported module) for every absolute import."""
  for d, dirs, files in os.walk(os.path.join(REPO_DIR, package)):
    # A data folder is read only where it is a package (experiments/common/data is).
    dirs[:] = [x for x in dirs if not x.startswith(("report", "__pycache__")) and not (
        x.startswith("data") and not os.path.isfile(os.path.join(d, x, "__init__.py")))]
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(d, f)
        for node in ast.walk(ast.parse(open(path).read(), path)):
          if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield os.path.relpath(path, REPO_DIR), node.module
          elif isinstance(node, ast.Import):
            for alias in node.names:
              yield os.path.relpath(path, REPO_DIR), alias.name


def _parts(module: str) -> list[str]:
  parts = module.split(".")
  return parts[1:] if parts[0] == "lowprec" else parts


def test_no_import_runs_back_up():
  bad = []
  for package, level in _ORDER.items():
    for path, module in _modules(package):
      parts = _parts(module)
      if parts and parts[0] in _ORDER and _ORDER[parts[0]] > level:
        bad.append(f"{path} imports {module}")
      if package == "numerics" and parts[0] == "flax":
        bad.append(f"{path} imports {module} (numerics is Flax-free)")
  assert not bad, "\n".join(bad)


def test_the_library_is_imported_through_lowprec():
  """Inside the repository too, so no module exists under two names."""
  bad = [f"{path} imports {module}" for package in _ORDER for path, module in
         _modules(package) if module.split(".")[0] in ("numerics", "models")]
  bad += [f"{path} imports {module}" for path, module in _modules("tests")
          if module.split(".")[0] in ("numerics", "models")]
  assert not bad, "\n".join(bad)


def test_no_paper_imports_another_beyond_the_known_edges():
  papers = {d for d in os.listdir(os.path.join(REPO_DIR, "experiments"))
            if os.path.isfile(os.path.join(REPO_DIR, "experiments", d, "__init__.py"))
            and d not in _HARNESS}
  edges = set()
  for path, module in _modules("experiments"):
    mine = path.split(os.sep)[1]
    parts = _parts(module)
    if len(parts) > 1 and parts[0] == "experiments" and parts[1] in papers:
      if parts[1] != mine:
        edges.add((mine, parts[1]))
  assert not {e for e in edges if e[0] in _HARNESS}, edges  # the harness imports no paper
  assert edges <= _PAPER_EDGES, sorted(edges - _PAPER_EDGES)


def test_every_module_imports_beside_every_other():
  """One process imports every module of the repository: no two define a flag of one
  name at import time (a script defines its flags only when it runs as a script), so a
  test, a notebook or another script may import any of them together."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  names = []
  for top, package in (("numerics", "lowprec.numerics"), ("models", "lowprec.models"),
                       ("experiments", "experiments"), ("launch", "launch")):
    for d, dirs, files in os.walk(os.path.join(REPO_DIR, top)):
      dirs[:] = [x for x in dirs if not x.startswith(("report", "__pycache__"))]
      for f in files:
        if f.endswith(".py") and f != "__main__.py":
          rel = os.path.relpath(os.path.join(d, f), os.path.join(REPO_DIR, top))[:-3]
          parts = [p for p in rel.split(os.sep) if p != "__init__"]
          names.append(".".join([package, *parts]))
  code = ("import importlib, sys\nbad = []\nfor m in sys.argv[1:]:\n  try:\n"
          "    importlib.import_module(m)\n  except Exception as e:\n"
          "    bad.append(f'{m}: {e!r}')\nprint('\\n'.join(bad))\nsys.exit(1 if bad else 0)\n")
  out = subprocess.run([sys.executable, "-c", code, *sorted(names)], cwd=REPO_DIR,
                       capture_output=True, text=True, timeout=300, check=False)
  assert out.returncode == 0, out.stdout + out.stderr[-3000:]
  assert len(names) > 150, names
