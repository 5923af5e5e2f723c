"""What is written beside a run's logs: the whole config, run options and the git commit."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

_REPO_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def git_state(repo_dir: str = _REPO_DIR) -> dict[str, Any]:
  """``{"commit": sha or "unknown", "dirty": bool | None}`` of the checkout at ``repo_dir``."""
  def run(*args: str) -> str | None:
    try:
      out = subprocess.run(["git", *args], cwd=repo_dir, capture_output=True, text=True,
                           timeout=10, check=True)
      return out.stdout
    except (OSError, subprocess.SubprocessError):
      return None
  commit = run("rev-parse", "HEAD")
  status = run("status", "--porcelain", "--untracked-files=no")
  return {"commit": commit.strip() if commit else "unknown",
          "dirty": None if status is None else bool(status.strip())}


def write_run_metadata(workdir: str, config: Any, run_options: Any,
                       extra: dict[str, Any] | None = None) -> str:
  """Writes ``<workdir>/config.json`` (config, options, git, argv, versions); returns its path."""
  import jax  # pylint: disable=import-outside-toplevel
  os.makedirs(workdir, exist_ok=True)
  record = {
      "config": dataclasses.asdict(config),
      "config_class": f"{type(config).__module__}.{type(config).__qualname__}",
      "run_options": dataclasses.asdict(run_options),
      "git": git_state(),
      "argv": sys.argv,
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
