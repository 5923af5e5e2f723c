"""Memory measured from pytrees: stored bytes and optimizer-state bytes per parameter.

Bytes are counted from the leaves actually held (``size * itemsize`` of every array
leaf, abstract ``jax.ShapeDtypeStruct`` leaves included, so ``jax.eval_shape`` of an
``init`` measures a state without allocating it). Codes, scales, padding, step counters
and metadata-free containers all count as they are stored; static pytree metadata
(shapes, format names) costs nothing here.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def _leaf_bytes(leaf: Any) -> int:
  if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
    raise TypeError(f"cannot measure a {type(leaf).__name__} leaf; expected arrays")
  return int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize


def tree_bytes(tree: Any) -> int:
  """Total bytes of the array leaves of ``tree`` (``None`` subtrees count 0).

  Raises:
    TypeError: for a leaf that is not an array (e.g. a Python scalar), whose stored
      size would be a guess.
  """
  return sum(_leaf_bytes(leaf) for leaf in jax.tree.leaves(tree))


def num_params(params: Any) -> int:
  """Number of scalar parameters: the total size of the array leaves of ``params``."""
  return sum(int(np.prod(p.shape, dtype=np.int64)) for p in jax.tree.leaves(params))


def bytes_per_param(state: Any, params: Any) -> float:
  """``tree_bytes(state) / num_params(params)``: e.g. an optimizer state's cost.

  ``optax.adamw``'s state on float32 params is ``8 + 4/n`` bytes per parameter (two
  float32 moments and an int32 step counter).

  Raises:
    ValueError: when ``params`` has no elements.
  """
  n = num_params(params)
  if n == 0:
    raise ValueError("params has no elements")
  return tree_bytes(state) / n
