"""Sampler/learner mismatch KL estimators: hand values, masking, clamp, jit."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from lowprec.numerics.rl import mismatch


def test_hand_values():
  l = jnp.array([[-1.0, -2.0, -0.5], [-1.5, -3.0, 0.0]])
  b = jnp.array([[-1.5, -1.0, -0.5], [-1.0, 7.0, 0.0]])
  mask = jnp.array([[1, 1, 1], [1, 0, 0]], bool)
  d = np.array([0.5, -1.0, 0.0, -0.5])  # learner - behaviour on masked tokens
  out = mismatch.mismatch_kl(l, b, mask)
  np.testing.assert_allclose(out["k1"], np.mean(-d), rtol=1e-6)
  np.testing.assert_allclose(out["k3"], np.mean(np.exp(d) - 1 - d), rtol=1e-6)
  np.testing.assert_allclose(out["max_abs_delta_logp"], 1.0)  # masked |d| = 10 ignored


def test_k3_unbiased_for_kl_sampler_learner():
  # Exact expectation under mu over a 3-token vocabulary: E_mu[k1] = E_mu[k3] = KL(mu||pi).
  mu = np.array([0.5, 0.3, 0.2])
  pi = np.array([0.2, 0.5, 0.3])
  kl = np.sum(mu * np.log(mu / pi))
  out = mismatch.mismatch_kl(jnp.log(pi)[None], jnp.log(mu)[None], jnp.ones((1, 3)))
  d = np.log(pi / mu)
  np.testing.assert_allclose(np.sum(mu * -d), kl, rtol=1e-6)
  np.testing.assert_allclose(np.sum(mu * (np.exp(d) - 1 - d)), kl, rtol=1e-6)
  assert float(out["k3"]) >= 0


def test_clamp_and_empty_mask():
  out = mismatch.mismatch_kl(jnp.array([[1000.0]]), jnp.zeros((1, 1)), jnp.ones((1, 1)))
  assert all(np.isfinite(float(v)) for v in out.values())
  empty = mismatch.mismatch_kl(jnp.ones((2, 2)), jnp.zeros((2, 2)), jnp.zeros((2, 2)))
  for v in empty.values():
    assert float(v) == 0.0


def test_jit():
  l, b, m = jnp.array([[0.1, 0.2]]), jnp.array([[0.0, 0.0]]), jnp.ones((1, 2))
  chex.assert_trees_all_close(jax.jit(mismatch.mismatch_kl)(l, b, m), mismatch.mismatch_kl(l, b, m))
