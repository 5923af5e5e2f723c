"""The sampler as an explicit, versioned copy of the learner's weights.

In an asynchronous RL system the sampler (inference engine) serves its own copy of the
policy, in its own precision, refreshed from the learner every ``interval`` learner
updates; between refreshes it lags. :class:`SamplerCopy` makes that copy explicit: its
own params pytree, the learner step it was taken at (its *version*) and the number of
syncs. The export from learner to sampler weights is a function argument (a dtype cast
here; any format or recipe in :mod:`numerics.export` later).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

Export = Callable[[Any], Any]


class SamplerCopy(NamedTuple):
  """``params``: the served weights; ``version`` int32[]: learner step they were taken
  at; ``syncs`` int32[]: how many syncs produced them (the first copy is sync 1)."""

  params: Any
  version: jax.Array
  syncs: jax.Array


def cast_export(dtype: Any) -> Export:
  """An export that casts every floating leaf to ``dtype`` (round to nearest even)."""
  dtype = jnp.dtype(dtype)
  if not jnp.issubdtype(dtype, jnp.floating):
    raise ValueError(f"sampler dtype must be floating, got {dtype}")

  def export(params):
    return jax.tree.map(
        lambda p: p.astype(dtype) if jnp.issubdtype(p.dtype, jnp.floating) else p, params)

  return export


def initial_copy(learner_params: Any, export: Export, learner_step: int | jax.Array = 0
                 ) -> SamplerCopy:
  """The first sampler copy, taken at ``learner_step``."""
  return SamplerCopy(export(learner_params), jnp.asarray(learner_step, jnp.int32),
                     jnp.ones((), jnp.int32))


def refresh_due(learner_step: int | jax.Array, interval: int) -> jax.Array:
  """bool[]: whether the sampler is re-synced before the update at ``learner_step``
  (every ``interval`` updates: steps 0, K, 2K, ...)."""
  if interval < 1:
    raise ValueError(f"refresh interval must be >= 1, got {interval}")
  return jnp.asarray(learner_step, jnp.int32) % interval == 0


def refresh_needed(copy: SamplerCopy, learner_step: int | jax.Array, interval: int
                   ) -> jax.Array:
  """bool[]: :func:`refresh_due` and the copy is not already at ``learner_step``.

  A copy taken at this very step (the :func:`initial_copy` at step 0, or a copy
  restored from a checkpoint written after its sync) is current: syncing it again
  would give two syncs at one version, which a version check rightly rejects."""
  step = jnp.asarray(learner_step, jnp.int32)
  return refresh_due(step, interval) & (copy.version != step)


def maybe_refresh(copy: SamplerCopy, learner_params: Any, learner_step: int | jax.Array,
                  interval: int, export: Export) -> SamplerCopy:
  """``copy`` re-synced from ``learner_params`` when :func:`refresh_needed`, else
  unchanged.

  jit-compatible (a ``lax.cond``); the export runs only on a refresh."""
  step = jnp.asarray(learner_step, jnp.int32)
  return jax.lax.cond(
      refresh_needed(copy, step, interval),
      lambda: SamplerCopy(export(learner_params), step, copy.syncs + 1),
      lambda: copy)


def staleness(copy: SamplerCopy, learner_step: int | jax.Array) -> jax.Array:
  """int32[]: learner updates since the sampler's weights were taken."""
  return jnp.asarray(learner_step, jnp.int32) - copy.version
