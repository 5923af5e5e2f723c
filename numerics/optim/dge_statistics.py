"""What differential gradient estimation does to the weight gradients, as an optax step.

DGE (:mod:`numerics.dge`) multiplies each weight gradient element by ``f'(w)``, the
surrogate derivative of the forward weight quantizer (clamped to ``[0, clamp]``). This
transform leaves the updates unchanged and records, at every step, statistics of that
factor over the weights it sees:

* ``factor_mean``: the mean of ``f'(w)`` over elements;
* ``clamped_fraction``: the fraction of elements at the clamp (near a bin's centre);
* ``above_one_fraction``: the fraction with ``f'(w) > 1`` (gradients amplified);
* ``gradient_gain``: ``||g||_2 / ||g / f'(w)||_2`` over the elements with ``f' > 0``,
  where ``g`` is the incoming gradient (already multiplied by ``f'``): the factor by
  which DGE scaled this step's gradient norm relative to the straight-through one.

The factor is computed on the parameters the optimizer holds (float32 masters); a
model that casts weights to bf16 before its GEMMs gets the factor of the cast weight,
which can differ for elements within a bf16 ulp of a bin centre or edge.

Chain it *first* (it must see the gradients as the backward produced them), masked to
the quantized weights: ``optax.chain(optax.masked(dge_statistics(f), mask), adamw)``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax


class DGEStatisticsState(NamedTuple):
  """float32[] each: the last step's statistics (see the module doc); 0 before a step."""

  factor_mean: jax.Array
  clamped_fraction: jax.Array
  above_one_fraction: jax.Array
  gradient_gain: jax.Array


def dge_statistics(factor: Callable[[jax.Array], jax.Array], clamp: float
                   ) -> optax.GradientTransformation:
  """An identity optax transform recording the DGE factor's statistics in its state.

  Args:
    factor: ``w -> f'(w)`` (float32, ``w``'s shape), the factor the backward applied,
      e.g. ``functools.partial(numerics.qdot.dge_factor, recipe)``.
    clamp: the factor's upper bound (the recipe's ``dge_clamp``), for
      ``clamped_fraction``.
  """
  if not clamp > 0:
    raise ValueError(f"clamp must be > 0, got {clamp}")

  def init(params) -> DGEStatisticsState:
    del params
    zero = jnp.zeros((), jnp.float32)
    return DGEStatisticsState(zero, zero, zero, zero)

  def update(updates, state, params=None):
    del state
    if params is None:
      raise ValueError("dge_statistics needs the params (pass them to update)")
    grads, weights = jax.tree.leaves(updates), jax.tree.leaves(params)
    if not grads:
      raise ValueError("dge_statistics saw no weights (is its mask empty?)")
    count = total = clamped = above = jnp.zeros((), jnp.float32)
    g_sq = ste_sq = jnp.zeros((), jnp.float32)
    for g, w in zip(grads, weights):
      f = factor(w)
      g = g.astype(jnp.float32)
      count += f.size
      total += jnp.sum(f)
      clamped += jnp.sum(f >= clamp)
      above += jnp.sum(f > 1.0)
      live = f > 0
      g_sq += jnp.sum(jnp.where(live, g * g, 0.0))
      ste = jnp.where(live, g / jnp.where(live, f, 1.0), 0.0)
      ste_sq += jnp.sum(ste * ste)
    gain = jnp.where(ste_sq > 0, jnp.sqrt(g_sq / jnp.where(ste_sq > 0, ste_sq, 1.0)), 0.0)
    return updates, DGEStatisticsState(total / count, clamped / count, above / count,
                                       gain)

  return optax.GradientTransformation(init, update)
