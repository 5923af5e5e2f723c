"""Paths as committed evidence records them: relative to the repository root.

Committed files (manifests, config records, results rows, reports) must not name the
machine that wrote them, so a path inside the repository is recorded relative to its
root; a path outside it (a scratch disk) stays absolute. Commands in a manifest run
with the repository root as their working directory.
"""

from __future__ import annotations

import os

# This file is <root>/experiments/common/harness/repo_paths.py.
REPO_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 3))


def repo_relative(path: str) -> str:
  """``path`` relative to the repository root if it lies inside it, else absolute."""
  absolute = os.path.abspath(path)
  rel = os.path.relpath(absolute, REPO_DIR)
  if rel == os.curdir:
    return rel
  return absolute if rel.startswith(os.pardir + os.sep) or rel == os.pardir else rel
