"""Tests for numerics.optim.deoscillation on hand-built oscillating weights."""

import chex
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lowprec.numerics import qdot
from lowprec.numerics.optim import deoscillate


def _run(tx, p, updates, steps):
  state = tx.init(p)
  history = []
  for t in range(steps):
    u, state = tx.update(updates[t % len(updates)], state, p)
    p = optax.apply_updates(p, u)
    history.append((np.asarray(p), int((state[-1] if isinstance(state, tuple) and not hasattr(state, 'snapped') else state).snapped)))
  return history


def test_snaps_oscillating_element_only():
  # Grid: integers. Element 0 flips 0.49 <-> 0.51 (d_Q/d_w = 1/0.02 = 50 >= 4);
  # element 1 drifts 0.1 per step across one boundary (d_Q/d_w = 1/0.4 = 2.5 < 4);
  # element 2 never moves (d_w = 0: never snapped).
  tx = optax.chain(optax.identity(), deoscillate(jnp.round, period=4, ratio=4.0,
                                                 start_step=2))
  p = jnp.array([0.49, 0.2, 3.3], jnp.float32)
  ups = [jnp.array([0.02, 0.1, 0.0]), jnp.array([-0.02, 0.1, 0.0])]
  hist = _run(tx, p, ups, 6)
  # steps 0, 1: before start_step; window = steps 2..5, ends at step 5.
  for t in range(5):
    assert hist[t][0][0] in (np.float32(0.49), np.float32(0.51)) or abs(
        hist[t][0][0] - 0.5) < 0.02
  final, snapped = hist[5]
  assert snapped == 1
  assert final[0] == 0.0  # snapped to Q(0.49) = 0
  np.testing.assert_allclose(final[1], 0.8, atol=1e-5)  # not snapped
  assert final[2] == np.float32(3.3)


def test_no_snapping_before_start_or_below_ratio():
  tx = deoscillate(jnp.round, period=2, ratio=100.0)
  p = jnp.array([0.49], jnp.float32)
  ups = [jnp.array([0.02]), jnp.array([-0.02])]
  hist = _run(tx, p, ups, 8)  # ratio 50 < 100
  assert all(s == 0 for _, s in hist)
  tx = deoscillate(jnp.round, period=2, ratio=4.0, start_step=100)
  assert all(s == 0 for _, s in _run(tx, p, ups, 8))


def test_with_mxfp4_weight_quantizer_snaps_to_grid():
  q = qdot.forward_weight_quantizer("mxfp4")
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.normal(size=(64, 64)), jnp.float32)
  step = 1e-3 * jnp.asarray(rng.choice([-1.0, 1.0], size=(64, 64)), jnp.float32)
  tx = deoscillate(q, period=2, ratio=1.0)
  hist = _run(tx, w, [step, -step], 2)
  final, snapped = hist[-1]
  assert snapped > 0
  w_unsnapped = (w + step) + (-step)  # what the two steps give without snapping
  moved = np.asarray(final != w_unsnapped)
  assert moved.sum() <= snapped  # a snapped element may already sit on the grid
  # Snapped elements take Q of the unsnapped weights.
  np.testing.assert_array_equal(final[moved], np.asarray(q(w_unsnapped))[moved])


def test_validation():
  for kw in (dict(period=0), dict(ratio=0.0), dict(start_step=-1)):
    with pytest.raises(ValueError):
      deoscillate(jnp.round, **kw)
  tx = deoscillate(jnp.round)
  with pytest.raises(ValueError, match="params"):
    tx.update(jnp.zeros(2), tx.init(jnp.zeros(2)))
  chex.assert_trees_all_equal(tx.init(jnp.ones(2)).dist_w, jnp.zeros(2))
