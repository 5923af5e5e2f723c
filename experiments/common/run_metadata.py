"""What is written beside a run's logs: the whole config, run options and the git commit.

Paths in the record are relative to the repository root where they lie inside it
(:mod:`experiments.common.repo_paths`), so a committed run record names no machine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

from experiments.common.repo_paths import REPO_DIR, repo_relative

# Committed sweep evidence: writing it does not change the code a run executes, so it
# does not make the tree dirty (a sweep rewrites its manifest before its runs start).
EVIDENCE_PATHSPEC = ":(exclude,glob)experiments/*/report/**"


def git_state(repo_dir: str = REPO_DIR) -> dict[str, Any]:
  """``{"commit": sha or "unknown", "dirty": bool | None}`` of the checkout at ``repo_dir``.

  ``dirty``: a tracked file outside the committed sweep evidence differs from the
  commit (untracked files do not count); None where git cannot be asked.
  """
  def run(*args: str) -> str | None:
    try:
      out = subprocess.run(["git", *args], cwd=repo_dir, capture_output=True, text=True,
                           timeout=10, check=True)
      return out.stdout
    except (OSError, subprocess.SubprocessError):
      return None
  commit = run("rev-parse", "HEAD")
  status = run("status", "--porcelain", "--untracked-files=no", "--", ".", EVIDENCE_PATHSPEC)
  return {"commit": commit.strip() if commit else "unknown",
          "dirty": None if status is None else bool(status.strip())}


def write_run_metadata(workdir: str, config: Any, run_options: Any,
                       extra: dict[str, Any] | None = None) -> str:
  """Writes ``<workdir>/config.json`` (config, options, git, argv, versions); returns its path."""
  import jax  # pylint: disable=import-outside-toplevel
  os.makedirs(workdir, exist_ok=True)
  options = dataclasses.asdict(run_options)
  for name in ("workdir", "results_file"):
    if options.get(name):
      options[name] = repo_relative(options[name])
  record = {
      "config": dataclasses.asdict(config),
      "config_class": f"{type(config).__module__}.{type(config).__qualname__}",
      "run_options": options,
      "git": git_state(),
      "argv": [os.path.basename(sys.argv[0])] + sys.argv[1:] if sys.argv else [],
      "python": platform.python_version(),
      "jax": jax.__version__,
      "backend": jax.default_backend(),
      "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
  }
  record.update(extra or {})
  path = os.path.join(workdir, "config.json")
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(record, f, indent=2, sort_keys=True)
  os.replace(tmp, path)
  return path


def config_differences(workdir: str, config: Any) -> list[str]:
  """How ``config`` differs from the one recorded in ``<workdir>/config.json``.

  One line per differing field (``name: recorded X, now Y``), plus one if the config
  class differs; empty when they agree or nothing is recorded.
  """
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    record = json.load(f)
  out = []
  cls = f"{type(config).__module__}.{type(config).__qualname__}"
  if record.get("config_class", cls) != cls:
    out.append(f"config class: recorded {record['config_class']}, now {cls}")
  recorded, now = record.get("config", {}), dataclasses.asdict(config)
  for name in sorted(set(recorded) | set(now)):
    if recorded.get(name, "<absent>") != now.get(name, "<absent>"):
      out.append(f"{name}: recorded {recorded.get(name, '<absent>')!r}, now "
                 f"{now.get(name, '<absent>')!r}")
  return out
