"""Imports of optional packages that fail with a message saying what to install."""

from __future__ import annotations

import importlib
import types


def require(module: str, pip_name: str, purpose: str) -> types.ModuleType:
  """Imports ``module`` or raises ImportError naming the pip package to install.

  Args:
    module: the import name, e.g. ``"sklearn.datasets"``.
    pip_name: the distribution to install, e.g. ``"scikit-learn"``.
    purpose: what needs it, for the message, e.g. ``"the digits dataset"``.
  """
  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise ImportError(
        f"{purpose} needs the package {pip_name!r} (import {module!r} failed: {e}). "
        f"Install it with: pip install {pip_name}") from e
