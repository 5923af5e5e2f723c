"""Params cached on disk under the hash of what defines them (warm starts, pretrained
bases): one ``.npz`` per digest, leaves stored as ``p0, p1, ...`` in tree order plus
an optional JSON ``info`` record.

Writes are atomic (a temporary file renamed into place), so parallel runs racing to
write the same cache leave one whole file; callers that must not train twice hold a
file lock around the check-train-save sequence.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np


def digest(fields: Mapping[str, Any]) -> str:
  """The cache key of ``fields`` (JSON-serializable): 10 hex digits of their sha1."""
  return hashlib.sha1(json.dumps(dict(fields), sort_keys=True).encode()).hexdigest()[:10]


def save(path: str, params: Any, info: Mapping[str, Any] | None = None) -> None:
  """Writes ``params``' leaves (and ``info`` as JSON, when given) to ``path``."""
  tmp = f"{path}.{os.getpid()}.tmp.npz"
  extra = {} if info is None else {"info": json.dumps(dict(info))}
  np.savez(tmp, **extra, **{f"p{i}": np.asarray(x) for i, x in
                            enumerate(jax.tree.leaves(params))})
  os.replace(tmp, path)


def load(path: str, like: Any) -> tuple[Any, dict[str, Any]]:
  """(params with the tree structure of ``like``, the stored info or ``{}``)."""
  treedef = jax.tree.structure(like)
  with np.load(path) as f:
    params = jax.tree.unflatten(treedef, [jnp.asarray(f[f"p{i}"])
                                          for i in range(treedef.num_leaves)])
    info = json.loads(str(f["info"])) if "info" in f.files else {}
  return params, info
