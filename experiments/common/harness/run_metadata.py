"""What is written beside a run's logs: the whole config, run options and the git commit.

Paths in the record are relative to the repository root where they lie inside it
(:mod:`experiments.common.harness.repo_paths`), so a committed run record names no machine.
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

from experiments.common.harness.repo_paths import REPO_DIR, repo_relative

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


# The CPU features XLA's CPU code generator picks its vector instructions from: two
# hosts that differ in these (or in XLA_FLAGS' --xla_cpu_max_isa) can round float
# reductions differently (docs/sweeps.md, "What reproduces to the bit").
_ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl",
              "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "asimd",
              "sve")
_PACKAGES = ("jax", "jaxlib", "numpy", "ml_dtypes", "flax", "optax", "orbax-checkpoint")


def host_record() -> dict[str, Any]:
  """What a run's floating-point bits depend on besides the code and config: the CPU
  model and its vector-ISA flags (Linux ``/proc/cpuinfo``; empty elsewhere), the
  package versions and ``XLA_FLAGS``."""
  from importlib import metadata  # pylint: disable=import-outside-toplevel
  cpu, flags = platform.processor() or platform.machine(), set()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name":
          cpu = value.strip()
        elif key in ("flags", "Features"):
          flags = set(value.split())
          break
  except OSError:
    pass
  versions = {}
  for name in _PACKAGES:
    try:
      versions[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      versions[name] = None
  return {"machine": platform.machine(), "cpu": cpu,
          "cpu_isa": [f for f in _ISA_FLAGS if f in flags], "cpu_count": os.cpu_count(),
          "versions": versions, "xla_flags": os.environ.get("XLA_FLAGS", "")}


def write_run_metadata(workdir: str, config: Any, run_options: Any,
                       extra: dict[str, Any] | None = None) -> str:
  """Writes ``<workdir>/config.json`` (config, options, git, argv, versions, the host's
  CPU and package versions (:func:`host_record`), and the
  other commits earlier processes of this run recorded); returns its path."""
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
      "host": host_record(),
      "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
  }
  # A resume rewrites the record: the commits earlier processes of the run ran from
  # stay listed (the checkpoints and results row hold them by step).
  earlier = read_record(workdir) or {}
  history = list(earlier.get("earlier_git", []))
  if earlier.get("git") and earlier["git"] != record["git"]:
    history.append(earlier["git"])
  if history:
    record["earlier_git"] = history
  record.update(extra or {})
  path = os.path.join(workdir, "config.json")
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(record, f, indent=2, sort_keys=True)
  os.replace(tmp, path)
  return path


def read_record(workdir: str) -> dict[str, Any] | None:
  """``<workdir>/config.json`` as written by :func:`write_run_metadata`; None when it is
  missing or not a JSON object (a write cut short)."""
  path = os.path.join(workdir, "config.json")
  try:
    with open(path) as f:
      record = json.load(f)
  except (OSError, ValueError):
    return None
  return record if isinstance(record, dict) else None


def config_record(config: Any) -> dict[str, Any]:
  """``{"config_class", "config"}`` of ``config`` as JSON reads it back (tuples as lists),
  so a record compares equal to a reloaded one."""
  return {"config_class": f"{type(config).__module__}.{type(config).__qualname__}",
          "config": json.loads(json.dumps(dataclasses.asdict(config)))}


def differences(recorded: dict[str, Any], config: Any) -> list[str]:
  """How ``config`` differs from ``recorded`` (a :func:`config_record`, or a config.json
  holding one): one line per differing field (``name: recorded X, now Y``), plus one if
  the config class differs; empty when they agree."""
  now = config_record(config)
  out = []
  cls = now["config_class"]
  if recorded.get("config_class", cls) != cls:
    out.append(f"config class: recorded {recorded['config_class']}, now {cls}")
  old, new = recorded.get("config", {}), now["config"]
  for name in sorted(set(old) | set(new)):
    if old.get(name, "<absent>") != new.get(name, "<absent>"):
      out.append(f"{name}: recorded {old.get(name, '<absent>')!r}, now "
                 f"{new.get(name, '<absent>')!r}")
  return out
