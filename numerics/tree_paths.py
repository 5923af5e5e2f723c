"""Names of pytree leaves: their key paths joined with ``'/'`` (``block_0/qkv/kernel``).

One naming rule for everything that reports or matches parameters by name (the export
metrics of :mod:`numerics.export`, the layer plans and checks of
:mod:`experiments.mxfp8_rl.weight_sync`): a dict key or flattened-index key gives its key, a
sequence key its index, an attribute key its name.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax


def key_name(k: Any) -> str:
  """The name of one key-path entry (``DictKey``, ``SequenceKey``, ``GetAttrKey``, ...)."""
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def path_name(path: Sequence[Any], root: str = "") -> str:
  """The ``'/'``-joined name of a key path; ``root`` for the empty path (a bare leaf)."""
  return "/".join(key_name(k) for k in path) or root


def named_leaves(tree: Any) -> dict[str, Any]:
  """``{path name: leaf}`` of ``tree``, in flattening order."""
  return {path_name(path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
