"""The export package's pytree plumbing: leaves by path name, dtype checks, safe ratios.

Every export function and metric walks the master's tree the same way: leaves named by
their '/'-joined key path (:mod:`numerics.tree_paths`; ``"root"`` for a bare array),
floating leaves checked (masters must be float32), non-floating leaves passed through.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from lowprec.numerics import tree_paths

GLOBAL = "global"  # the metrics' key for "over all floating leaves"
ROOT = "root"
F32 = jnp.float32


def is_float(leaf) -> bool:
  return jnp.issubdtype(jnp.result_type(leaf), jnp.floating)


def check_master_leaf(path, leaf):
  leaf = jnp.asarray(leaf)
  if leaf.dtype != F32:
    raise TypeError(f"master leaf {path!r} must be float32, got {leaf.dtype}")
  return leaf


def check_served_leaf(path, m, s):
  s = jnp.asarray(s)
  if not jnp.issubdtype(s.dtype, jnp.floating) or s.shape != m.shape:
    raise ValueError(f"served leaf {path!r} must be floating of shape {list(m.shape)}, "
                     f"got {s.dtype}{list(s.shape)}")
  return s


def flatten(tree):
  """(path names, leaves, treedef); path names are unique and never 'global'."""
  with_path, treedef = jax.tree_util.tree_flatten_with_path(tree)
  names = [tree_paths.path_name(p, ROOT) for p, _ in with_path]
  if GLOBAL in names:
    raise ValueError(f"a leaf path is named {GLOBAL!r}, which the metrics reserve")
  return names, [leaf for _, leaf in with_path], treedef


def flatten_like(treedef, tree, what):
  try:
    return treedef.flatten_up_to(tree)
  except (ValueError, TypeError) as e:
    raise ValueError(f"{what} does not match the master's tree structure: {e}"
                     ) from None


def float_pairs(master, served):
  """(path, float32 master, float32 served) for every floating leaf."""
  paths, m_leaves, treedef = flatten(master)
  s_leaves = flatten_like(treedef, served, "served")
  for path, m, s in zip(paths, m_leaves, s_leaves):
    if is_float(m):
      m = check_master_leaf(path, m)
      yield path, m, check_served_leaf(path, m, s).astype(F32)


def bit_pattern(x):
  width = jnp.dtype(x.dtype).itemsize
  uint = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[width]
  return lax.bitcast_convert_type(x, uint)


def safe_div(num, den, empty):
  den = jnp.asarray(den, F32)
  return jnp.where(den > 0, jnp.asarray(num, F32) / jnp.maximum(den, 1.0),
                   jnp.float32(empty))
