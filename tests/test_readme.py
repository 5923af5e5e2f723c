"""Every code block of the README and of docs/*.md runs as written.

* Each ```python block runs on its own, in a fresh namespace (no name from an earlier
  block), so a reader can paste any one of them.
* Each ``python -m <module> ...`` line of a ```bash block names a module that exists and
  flags that module accepts: the module runs as its script would (``__main__``) with
  ``absl.app.run`` replaced by a flag parse that stops before ``main`` (no training).
  Install lines (``pip ...``) and the test command are left to CI itself.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import types

import pytest

from experiments.common.harness.repo_paths import REPO_DIR

DOCS = ["README.md"] + sorted(
    os.path.join("docs", f) for f in os.listdir(os.path.join(REPO_DIR, "docs"))
    if f.endswith(".md"))
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks(kind: str) -> list[tuple[str, str]]:
  """``(file, body)`` of every ``kind`` block of the README and docs/."""
  out = []
  for doc in DOCS:
    with open(os.path.join(REPO_DIR, doc)) as f:
      out += [(doc, body) for lang, body in _FENCE.findall(f.read()) if lang == kind]
  return out


def _commands() -> list[list[str]]:
  """``python -m`` command lines of the bash blocks, as argv after ``-m``."""
  out = []
  for _, block in _blocks("bash"):
    for line in block.replace("\\\n", " ").splitlines():
      line = line.split("#", 1)[0].strip()
      for part in line.split("&&"):
        argv = shlex.split(part)
        if argv[:2] == ["python", "-m"] and argv[2] not in ("pytest", "pip"):
          out.append(argv[2:])
  return out


@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_python_block_runs_on_its_own(index):
  doc, code = _blocks("python")[index]
  module = types.ModuleType(f"readme_block_{index}")  # dataclasses look their module up
  sys.modules[module.__name__] = module
  try:
    exec(compile(code, f"{doc} python block {index}", "exec"), module.__dict__)
  finally:
    del sys.modules[module.__name__]


def test_the_docs_quantize_an_nnx_model_beside_a_linen_one():
  # Issue 51 row 15: an adopter with an NNX model found only linen examples.
  runs = [code for _, code in _blocks("python") if "quantize_model(" in code]
  assert any("from flax import nnx" in code for code in runs)
  assert any("from flax import linen" in code for code in runs)


def test_the_readme_is_a_page_and_links_every_doc():
  with open(os.path.join(REPO_DIR, "README.md")) as f:
    text = f.read()
  assert len(text.splitlines()) < 200
  for doc in DOCS[1:]:
    assert f"]({doc})" in text, f"README does not link {doc}"


# Runs each command's module as __main__ with app.run replaced by a parse of its flags;
# prints one JSON line per command: the module and the error, if any.
_CHECKER = r"""
import json, runpy, sys
from absl import app, flags

class _Parsed(Exception):
  pass

def _parse_only(main, argv=None, **kwargs):
  flags.FLAGS(sys.argv)  # unknown flags, bad values and missing required flags raise
  raise _Parsed()

app.run = _parse_only
for argv in json.loads(sys.argv[1]):
  before = set(flags.FLAGS)
  sys.argv = [argv[0]] + argv[1:]
  error = None
  try:
    runpy.run_module(argv[0], run_name="__main__", alter_sys=False)
    error = "the module never reached absl.app.run"
  except _Parsed:
    pass
  except BaseException as e:  # SystemExit from argparse-style usage errors included
    error = f"{type(e).__name__}: {e}"
  for name in set(flags.FLAGS) - before:  # the next module defines its own
    delattr(flags.FLAGS, name)
  flags.FLAGS.unparse_flags()
  print(json.dumps({"command": argv, "error": error}), flush=True)
"""


def test_bash_commands_name_real_modules_and_flags():
  commands = _commands()
  assert len(commands) >= 5, commands
  out = subprocess.run([sys.executable, "-c", _CHECKER, json.dumps(commands)],
                       capture_output=True, text=True, timeout=600, cwd=REPO_DIR)
  results = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
  assert len(results) == len(commands), out.stderr[-3000:]
  bad = [f"python -m {' '.join(r['command'])}: {r['error']}" for r in results if r["error"]]
  assert not bad, "\n".join(bad)
