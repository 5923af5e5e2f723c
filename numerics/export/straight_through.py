"""The loss on the served copy: served values forward, the identity gradient to the
master (a straight-through estimator, exact in float32)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from lowprec.numerics.export._leaves import (F32, check_master_leaf, check_served_leaf, flatten,
                                     flatten_like, is_float)


@jax.custom_vjp
def _straight_through_leaf(master, served):
  return served.astype(F32)


def _st_fwd(master, served):
  return served.astype(F32), served


def _st_bwd(served, g):
  return g, jnp.zeros_like(served)


_straight_through_leaf.defvjp(_st_fwd, _st_bwd)


@jax.jit
def straight_through(master: Any, served: Any) -> Any:
  """The served values in the forward pass, the identity gradient to the master.

  Per floating leaf this is ``master + stop_gradient(served - master)``, implemented
  as a custom VJP so the forward is *exactly* ``served.astype(float32)`` bit for bit
  (the float32 sum can round when ``|served - master|`` is not exact, e.g. after
  saturation, or flush subnormals). The cotangent passes to ``master`` unchanged;
  ``served`` gets a zero cotangent. Non-floating leaves return the served leaf.

  Args:
    master: pytree of float32 master weights.
    served: pytree of the same structure and shapes (e.g. from :func:`export`).

  Returns:
    A pytree of float32 leaves equal to the served values (non-floating: served).
  """
  paths, m_leaves, treedef = flatten(master)
  s_leaves = flatten_like(treedef, served, "served")
  out = []
  for path, m, s in zip(paths, m_leaves, s_leaves):
    if not is_float(m):
      out.append(s)
      continue
    m = check_master_leaf(path, m)
    s = check_served_leaf(path, m, s)
    out.append(_straight_through_leaf(m, s))
  return jax.tree_util.tree_unflatten(treedef, out)
