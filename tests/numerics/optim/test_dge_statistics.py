"""numerics.optim.dge_statistics: hand-worked statistics, identity on the updates."""

import chex
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lowprec.numerics.optim.dge_statistics import DGEStatisticsState, dge_statistics


def test_hand_worked_statistics():
  # The factor is read off the weight itself: f'(w) = w.
  params = {"a": jnp.array([[3.0, 0.5], [2.0, 0.0]]), "b": jnp.array([[1.0, 3.0]])}
  grads = {"a": jnp.array([[6.0, 1.0], [2.0, 7.0]]), "b": jnp.array([[1.0, 3.0]])}
  tx = dge_statistics(lambda w: w, clamp=3.0)
  updates, state = tx.update(grads, tx.init(params), params)
  chex.assert_trees_all_equal(updates, grads)
  # 6 elements: factors 3, 0.5, 2, 0, 1, 3.
  np.testing.assert_allclose(state.factor_mean, 9.5 / 6, rtol=1e-6)
  np.testing.assert_allclose(state.clamped_fraction, 2 / 6, rtol=1e-6)
  np.testing.assert_allclose(state.above_one_fraction, 3 / 6, rtol=1e-6)
  # Elements with f' > 0: g = 6, 1, 2, 1, 3; g / f' = 2, 2, 1, 1, 1 (the f' = 0 one,
  # g = 7, is left out of both norms).
  np.testing.assert_allclose(state.gradient_gain, np.sqrt(51.0 / 11.0), rtol=1e-6)


def test_masked_in_a_chain():
  params = {"q": jnp.full((2, 2), 2.0), "head": jnp.ones((2, 2))}
  grads = {"q": jnp.ones((2, 2)), "head": jnp.ones((2, 2))}
  tx = optax.chain(optax.masked(dge_statistics(lambda w: w, 3.0),
                                {"q": True, "head": False}), optax.sgd(0.1))
  _, state = tx.update(grads, tx.init(params), params)
  stats = state[0].inner_state
  assert isinstance(stats, DGEStatisticsState)
  np.testing.assert_allclose(stats.factor_mean, 2.0)
  np.testing.assert_allclose(stats.gradient_gain, 2.0)


def test_validation():
  with pytest.raises(ValueError, match="clamp"):
    dge_statistics(lambda w: w, clamp=0.0)
  tx = dge_statistics(lambda w: w, 3.0)
  with pytest.raises(ValueError, match="params"):
    tx.update({"a": jnp.ones(2)}, tx.init(None))
