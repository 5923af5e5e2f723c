"""IS weights: hand-computed TIS / masked IS / IcePop, clamping, stop-gradient, stats."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec.numerics.rl import importance as imp

E = np.exp


def _grad(f):
  return jax.jit(jax.grad(f))  # eager grad of many small ops is slow on CPU


_stats = jax.jit(imp.is_statistics)


def test_log_ratio_clamp_prevents_inf():
  lr = imp.log_ratio(jnp.array([[1000.0, -1000.0, 0.5]]), jnp.zeros((1, 3)))
  np.testing.assert_array_equal(lr, [[20.0, -20.0, 0.5]])
  assert np.all(np.isfinite(np.exp(np.asarray(lr))))
  np.testing.assert_array_equal(imp.log_ratio(jnp.array([3.0]), jnp.array([1.0]), clamp=1.5), [1.5])
  w = imp.token_tis_weights(imp.log_ratio(jnp.array([[1000.0]]), jnp.zeros((1, 1))), 2.0)
  np.testing.assert_array_equal(w, [[2.0]])


def test_token_tis_hand_values():
  lr = jnp.array([[0.5, -0.5, 1.0, 0.0]])
  w = imp.token_tis_weights(lr, 2.0)
  np.testing.assert_allclose(w, [[E(0.5), E(-0.5), 2.0, 1.0]], rtol=1e-6)  # e^1 = 2.718 > 2
  out = imp.importance_weights("token_tis", lr, jnp.ones((1, 4)), cap=2.0)
  np.testing.assert_allclose(out.weights, w)
  np.testing.assert_array_equal(out.clipped, [[0, 0, 1, 0]])
  np.testing.assert_array_equal(out.keep, 1.0)


def test_sequence_tis_hand_values_and_log_space():
  lr = jnp.array([[0.2, 0.3, 5.0], [0.5, 0.5, 0.0], [-0.1, -0.2, 0.0]])
  mask = jnp.array([[1, 1, 0], [1, 1, 1], [1, 1, 1]], bool)  # row 0's 5.0 is padding
  w = imp.sequence_tis_weights(lr, mask, 2.0)
  # row 0: exp(0.5) = 1.6487 < 2; row 1: exp(1.0) > 2 -> 2; row 2: exp(-0.3)
  np.testing.assert_allclose(w, np.repeat([[E(0.5)], [2.0], [E(-0.3)]], 3, 1), rtol=1e-6)
  out = imp.importance_weights("sequence_tis", lr, mask, cap=2.0)
  np.testing.assert_array_equal(out.clipped, np.repeat([[0.0], [1.0], [0.0]], 3, 1))
  # 1000 tokens of log ratio 0.1 (product e^100 overflows float32) -> stays at the cap
  big = imp.sequence_tis_weights(jnp.full((1, 1000), 0.1), jnp.ones((1, 1000)), 3.0)
  np.testing.assert_allclose(big, 3.0, rtol=1e-6)
  # all-masked row -> weight 1
  np.testing.assert_allclose(imp.sequence_tis_weights(lr, jnp.zeros((3, 3)), 2.0), 1.0)


def test_masked_is_token_level():
  lr = jnp.array([[0.5, -1.0, 1.0, np.log(2.0)]])
  w, keep = imp.masked_is_weights(lr, jnp.ones((1, 4)), 0.5, 2.0)
  # exp(-1) = 0.368 < 0.5 dropped; exp(1) = 2.718 > 2 dropped; exactly 2 kept (inclusive)
  np.testing.assert_allclose(w, [[E(0.5), 0.0, 0.0, 2.0]], rtol=1e-6)
  np.testing.assert_array_equal(keep, [[1, 0, 0, 1]])


def test_masked_is_sequence_level_geometric_mean():
  lr = jnp.array([[0.2, 0.4, 9.0], [1.0, 0.6, 0.8], [-0.9, -0.9, -0.9]])
  mask = jnp.array([[1, 1, 0], [1, 1, 1], [1, 1, 1]], jnp.float32)
  w, keep = imp.masked_is_weights(lr, mask, 0.5, 2.0, level="sequence")
  # row 0: mean lr 0.3 -> kept, weight e^0.3 on every token; row 1: mean 0.8 -> e^.8 = 2.23
  # > 2 dropped (even though token 0.6 alone would be inside); row 2: e^-0.9 = 0.41 dropped.
  np.testing.assert_allclose(w, [[E(0.3)] * 3, [0.0] * 3, [0.0] * 3], rtol=1e-6)
  np.testing.assert_array_equal(keep, [[1] * 3, [0] * 3, [0] * 3])
  out = imp.importance_weights("masked_is", lr, mask, lo=0.5, hi=2.0, level="sequence")
  np.testing.assert_allclose(out.weights, w)
  np.testing.assert_array_equal(out.clipped, 0.0)


def test_icepop():
  lr = jnp.array([[0.5, np.log(0.4), np.log(6.0), np.log(4.9)]])
  w, keep = imp.icepop_weights(lr)  # defaults [0.5, 5]
  np.testing.assert_allclose(w, [[E(0.5), 0.0, 0.0, 4.9]], rtol=1e-5)
  np.testing.assert_array_equal(keep, [[1, 0, 0, 1]])
  out = imp.importance_weights("icepop", lr, jnp.ones((1, 4)), lo=0.5, hi=5.0)
  np.testing.assert_allclose(out.weights, w)


def test_none_method():
  out = imp.importance_weights("none", jnp.full((2, 3), 3.0), jnp.ones((2, 3)))
  np.testing.assert_array_equal(out.weights, 1.0)
  np.testing.assert_array_equal(out.keep, 1.0)
  np.testing.assert_array_equal(out.clipped, 0.0)


@pytest.mark.parametrize("method", ["token_tis", "sequence_tis", "masked_is", "icepop"])
def test_weights_carry_no_gradient(method):
  mask = jnp.ones((2, 3))

  def f(lr):
    return jnp.sum(imp.importance_weights(method, lr, mask, cap=2.0, lo=0.5, hi=2.0).weights)

  g = _grad(f)(jnp.array([[0.1, -0.2, 0.3], [0.2, 0.0, -0.1]]))
  np.testing.assert_array_equal(g, 0.0)


def test_jit_dispatcher():
  f = jax.jit(imp.importance_weights, static_argnames=("method", "level"))
  lr = jnp.array([[0.5, 1.0]])
  out = f("token_tis", lr, jnp.ones((1, 2)), cap=2.0)
  chex.assert_trees_all_close(out.weights, jnp.array([[E(0.5), 2.0]], jnp.float32))
  assert isinstance(out, imp.ISWeights)


def test_is_statistics_hand_values():
  w = jnp.array([[1.0, 2.0, 9.0], [3.0, 0.0, 9.0]])
  mask = jnp.array([[1, 1, 0], [1, 1, 0]], bool)  # masked weights 1, 2, 3, 0
  s = _stats(w, mask)
  np.testing.assert_allclose(s["mean"], 1.5)
  np.testing.assert_allclose(s["std"], np.std([1, 2, 3, 0]), rtol=1e-6)
  assert float(s["min"]) == 0.0 and float(s["max"]) == 3.0
  np.testing.assert_allclose(s["ess"], 36.0 / (4 * 14.0), rtol=1e-6)  # (sum w)^2/(n sum w^2)
  assert float(s["clipped_frac"]) == 0.0 and float(s["dropped_frac"]) == 0.0
  assert float(s["n_tokens"]) == 4
  np.testing.assert_allclose(_stats(jnp.full((2, 2), 0.7), jnp.ones((2, 2)))["ess"],
                             1.0, rtol=1e-6)


def test_is_statistics_fractions_from_isweights():
  lr = jnp.array([[0.0, 1.0, -1.0, 0.0]])
  mask = jnp.array([[1, 1, 1, 0]])
  tis = _stats(imp.importance_weights("token_tis", lr, mask, cap=2.0), mask)
  np.testing.assert_allclose(tis["clipped_frac"], 1 / 3, rtol=1e-6)
  np.testing.assert_allclose(tis["max"], 2.0)
  mis = _stats(imp.importance_weights("masked_is", lr, mask, lo=0.5, hi=2.0), mask)
  np.testing.assert_allclose(mis["dropped_frac"], 2 / 3, rtol=1e-6)  # e^1 and e^-1 dropped
  np.testing.assert_allclose(mis["ess"], 1 / 3, rtol=1e-6)  # weights 1, 0, 0


def test_is_statistics_empty_mask_is_zero():
  s = _stats(jnp.ones((2, 2)), jnp.zeros((2, 2)))
  for k, v in s.items():
    assert float(v) == 0.0, k


def test_validation():
  lr, m = jnp.zeros((1, 2)), jnp.ones((1, 2))
  with pytest.raises(ValueError, match="unknown IS method 'tis'.*token_tis"):
    imp.importance_weights("tis", lr, m)
  with pytest.raises(ValueError, match="level"):
    imp.masked_is_weights(lr, m, 0.5, 2.0, level="batch")
  with pytest.raises(ValueError, match="cap must be > 0"):
    imp.token_tis_weights(lr, 0.0)
  with pytest.raises(ValueError, match="lo <= hi"):
    imp.icepop_weights(lr, 2.0, 0.5)
  with pytest.raises(ValueError, match="mask shape"):
    imp.importance_weights("token_tis", lr, jnp.ones((2, 2)))
  with pytest.raises(ValueError, match="differ"):
    imp.log_ratio(jnp.zeros(3), jnp.zeros(2))
