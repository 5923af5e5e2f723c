"""How long the served copy lags the master, per element (an episode tracker)."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from lowprec.numerics.export._leaves import (F32, GLOBAL, check_master_leaf, check_served_leaf,
                                     flatten, flatten_like, is_float, safe_div)
from lowprec.numerics.export.metrics import grid_format, ulp_ratio
from lowprec.numerics.export.served_copy import ExportSpec


class LagState(NamedTuple):
  """Per-element lag of the served copy behind the master (a pytree of arrays).

  Each field has the master's structure, None at non-floating leaves.

  Attributes:
    pending_since: int32, the leaf's shape: ``-1`` where the served value reflects the
      master (``|m - s| <= tolerance * ulp(s, m)``), else the step at which the
      current lag episode was first observed.
    lag_sum: float32[] per leaf: sum of the lengths (steps) of completed episodes.
    lag_count: float32[] per leaf: number of completed episodes. Both are float32 so
      they cannot overflow; they are exact while below 2^24.
  """

  pending_since: Any
  lag_sum: Any
  lag_count: Any


def init_lag_state(master: Any) -> LagState:
  """A lag state with nothing pending and no completed lags, for ``master``'s tree."""
  paths, leaves, treedef = flatten(master)
  pend, sums, counts = [], [], []
  for path, leaf in zip(paths, leaves):
    if is_float(leaf):
      pend.append(jnp.full(jnp.shape(leaf), -1, jnp.int32))
      sums.append(jnp.zeros((), F32))
      counts.append(jnp.zeros((), F32))
    else:
      pend.append(None)
      sums.append(None)
      counts.append(None)
  unflat = functools.partial(jax.tree_util.tree_unflatten, treedef)
  return LagState(unflat(pend), unflat(sums), unflat(counts))


@functools.partial(jax.jit, static_argnames=("spec", "tolerance"))
def update_lag(lag_state: LagState, master: Any, served: Any, spec: ExportSpec,
               step: int | jax.Array, *, tolerance: float = 0.5
               ) -> tuple[LagState, dict[str, dict]]:
  """Advances the lag tracker to ``step`` with the current master and served copy.

  Definitions (per element, ``d = |m - s| / ulp(s, m)`` as in :func:`ulp_distance`):

  * *lagging* at ``step``: ``d > tolerance`` (default half an ulp, i.e. the served
    value is not a nearest grid value of the master), or ``d`` is NaN.
  * an *episode* starts at the first observed lagging step ``t0`` (``pending_since``
    is set to ``t0``) and *completes* at the first later observed step ``t1`` at which
    the element is not lagging; its length is ``t1 - t0`` steps. E.g. a master that
    moves past half an ulp at step 3 while the served copy catches up at step 5 has a
    completed lag of 2. Its current *age* at ``step`` is ``step - t0``.

  Lags are in the units of ``step`` and resolved at the calls made: call it at every
  learner step with the copy the sampler actually serves (e.g. a stale
  :class:`numerics.rl.sampler_copy.SamplerCopy`); ``step`` must not decrease. A
  ``nearest`` export taken at the same step never lags by this definition (it is
  within half an ulp); stale copies, stochastic and error-feedback exports can.

  Args:
    lag_state: from :func:`init_lag_state` or a previous call.
    master: pytree of float32 masters; served: same structure and shapes.
    spec: the export spec whose grid ``served`` lies on (casts only).
    step: int or int32[] current step.
    tolerance: lag threshold in ulps (default 0.5).

  Returns:
    ``(new_lag_state, metrics)``; ``metrics[path]`` and ``metrics["global"]`` hold
    float32[] ``lagging_fraction`` (elements lagging now), ``mean_age`` and ``max_age``
    (over the elements lagging now; 0 if none), ``completed`` (episodes completed at
    this call), ``mean_completed_lag`` (over all episodes completed so far; 0 if none)
    and ``completed_total``.

  Raises:
    NotImplementedError: for QuantSpec (block) targets.
  """
  fmt = grid_format(spec, "update_lag")
  if not isinstance(lag_state, LagState):
    raise TypeError(f"lag_state must be a LagState, got {type(lag_state).__name__}")
  step = jnp.asarray(step, jnp.int32)
  paths, m_leaves, treedef = flatten(master)
  s_leaves = flatten_like(treedef, served, "served")
  pend_l = flatten_like(treedef, lag_state.pending_since, "lag_state.pending_since")
  sum_l = flatten_like(treedef, lag_state.lag_sum, "lag_state.lag_sum")
  cnt_l = flatten_like(treedef, lag_state.lag_count, "lag_state.lag_count")
  new_p, new_s, new_c, metrics = [], [], [], {}
  g = dict(n=0, lagging=0.0, age_sum=0.0, max_age=jnp.zeros((), jnp.int32),
           completed=0.0, lag_sum=0.0, lag_count=0.0)
  for path, m, s, p, ls, lc in zip(paths, m_leaves, s_leaves, pend_l, sum_l, cnt_l):
    if not is_float(m):
      for lst in (new_p, new_s, new_c):
        lst.append(None)
      continue
    m = check_master_leaf(path, m)
    s = check_served_leaf(path, m, s)
    p = jnp.asarray(p)
    if p.shape != m.shape or p.dtype != jnp.int32:
      raise ValueError(f"lag_state.pending_since at {path!r} must be int32"
                       f"{list(m.shape)}, got {p.dtype}{list(p.shape)}")
    lagging = ~(ulp_ratio(m, s.astype(F32), fmt) <= tolerance)
    was = p >= 0
    done = was & ~lagging
    pend = jnp.where(lagging, jnp.where(was, p, step), -1)
    n_lag = jnp.sum(lagging, dtype=F32)
    age = jnp.where(lagging, step - pend, 0)
    age_sum = jnp.sum(age, dtype=F32)
    max_age = jnp.max(age, initial=0).astype(jnp.int32)
    n_done = jnp.sum(done, dtype=F32)
    ls = ls + jnp.sum(jnp.where(done, step - p, 0), dtype=F32)
    lc = lc + n_done
    new_p.append(pend)
    new_s.append(ls)
    new_c.append(lc)
    metrics[path] = _lag_metrics(m.size, n_lag, age_sum, max_age, n_done, ls, lc)
    g["n"] += m.size
    g["lagging"] += n_lag
    g["age_sum"] += age_sum
    g["max_age"] = jnp.maximum(g["max_age"], max_age)
    g["completed"] += n_done
    g["lag_sum"] += ls
    g["lag_count"] += lc
  metrics[GLOBAL] = _lag_metrics(g["n"], g["lagging"], g["age_sum"], g["max_age"],
                                 g["completed"], g["lag_sum"], g["lag_count"])
  unflat = functools.partial(jax.tree_util.tree_unflatten, treedef)
  return LagState(unflat(new_p), unflat(new_s), unflat(new_c)), metrics


def _lag_metrics(n, n_lag, age_sum, max_age, n_done, lag_sum, lag_count):
  return {
      "lagging_fraction": safe_div(n_lag, n, 0.0),
      "mean_age": safe_div(age_sum, n_lag, 0.0),
      "max_age": jnp.asarray(max_age, F32),
      "completed": jnp.asarray(n_done, F32),
      "mean_completed_lag": safe_div(lag_sum, lag_count, 0.0),
      "completed_total": jnp.asarray(lag_count, F32),
  }
