"""The chunked delta rule equals the sequential reference; the single-step ops are exact."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec.models import delta_rule


def _inputs(b=3, t=11, d_k=8, d_v=6, seed=0, normalize=True):
  ks = jax.random.split(jax.random.PRNGKey(seed), 5)
  q = jax.random.normal(ks[0], (b, t, d_k))
  k = jax.random.normal(ks[1], (b, t, d_k))
  if normalize:
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
  v = jax.random.normal(ks[2], (b, t, d_v))
  beta = jax.random.uniform(ks[3], (b, t))
  s0 = 0.3 * jax.random.normal(ks[4], (b, d_v, d_k))
  return q, k, v, beta, s0


@pytest.mark.parametrize("chunk", [1, 4, 16])  # T=11: padded tail, chunk > T
def test_chunked_matches_reference(chunk):
  q, k, v, beta, s0 = _inputs()
  y_ref, s_ref = delta_rule.delta_rule_reference(q, k, v, beta, s0)
  y, s = delta_rule.delta_rule_chunked(q, k, v, beta, s0, chunk=chunk)
  chex.assert_shape(y, (3, 11, 6))
  chex.assert_trees_all_close((y, s), (y_ref, s_ref), atol=1e-5, rtol=1e-5)


def test_chunked_gradients_match_reference():
  q, k, v, beta, s0 = _inputs(t=7)

  def loss(fn, k, v, beta):
    y, s = fn(q, k, v, beta, s0)
    return jnp.sum(y ** 2) + jnp.sum(jnp.sin(s))

  g_ref = jax.grad(lambda *a: loss(delta_rule.delta_rule_reference, *a), (0, 1, 2))(k, v, beta)
  g = jax.grad(lambda *a: loss(lambda *b: delta_rule.delta_rule_chunked(*b, chunk=3), *a),
               (0, 1, 2))(k, v, beta)
  chex.assert_trees_all_close(g, g_ref, atol=1e-4, rtol=1e-4)


def test_reference_is_the_recurrence_written_out():
  q, k, v, beta, s0 = _inputs(b=1, t=3)
  s = np.array(s0[0], np.float64)
  ys = []
  for t in range(3):
    kt, vt = np.array(k[0, t], np.float64), np.array(v[0, t], np.float64)
    s = s + float(beta[0, t]) * np.outer(vt - s @ kt, kt)
    ys.append(s @ np.array(q[0, t], np.float64))
  y, s_final = delta_rule.delta_rule_reference(q, k, v, beta, s0)
  np.testing.assert_allclose(np.array(y[0]), np.stack(ys), atol=1e-5)
  np.testing.assert_allclose(np.array(s_final[0]), s, atol=1e-5)


def test_write_with_beta_one_stores_the_value_exactly():
  _, k, v, _, s0 = _inputs(b=2, t=1)
  s = delta_rule.delta_write(s0, k[:, 0], v[:, 0], jnp.ones((2,)))
  chex.assert_trees_all_close(delta_rule.delta_read(s, k[:, 0]), v[:, 0], atol=1e-5)


def test_zero_beta_leaves_memory_unchanged():
  q, k, v, _, s0 = _inputs()
  _, s = delta_rule.delta_rule_chunked(q, k, v, jnp.zeros((3, 11)), s0, chunk=4)
  chex.assert_trees_all_close(s, s0, atol=1e-6)


def test_shape_errors():
  q, k, v, beta, s0 = _inputs()
  with pytest.raises(ValueError, match="beta"):
    delta_rule.delta_rule_chunked(q, k, v, beta[:, :5], s0)
  with pytest.raises(ValueError, match="s0"):
    delta_rule.delta_rule_reference(q, k, v, beta, s0[:, :2])
  with pytest.raises(ValueError, match="chunk"):
    delta_rule.delta_rule_chunked(q, k, v, beta, s0, chunk=0)
  with pytest.raises(ValueError, match="delta_write"):
    delta_rule.delta_write(s0, k[:, 0, :3], v[:, 0], beta[:, 0])


def test_macs():
  assert delta_rule.delta_rule_macs(10, 4, 3) == 10 * 3 * 12
  assert delta_rule.delta_rule_macs(10, 4, 3, with_reads=False) == 10 * 2 * 12
