"""GRPO group advantages: hand-computed values, layout, edge cases, validation."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec.numerics.rl import advantages


def test_hand_computed_two_groups():
  # Group 0: [1, 0, 0, 1] -> mean 0.5, pop std 0.5 -> [+1, -1, -1, +1].
  # Group 1: [2, 4, 6, 8] -> mean 5, pop std sqrt(5) -> [-3, -1, 1, 3] / sqrt(5).
  r = jnp.array([1.0, 0.0, 0.0, 1.0, 2.0, 4.0, 6.0, 8.0])
  a = advantages.group_advantages(r, 4, eps=0.0)
  s5 = np.sqrt(5.0)
  np.testing.assert_allclose(a, [1, -1, -1, 1, -3 / s5, -1 / s5, 1 / s5, 3 / s5], rtol=1e-6)
  assert a.dtype == jnp.float32 and a.shape == (8,)


def test_eps_and_no_std():
  r = jnp.array([1.0, 0.0, 0.0, 1.0])
  np.testing.assert_allclose(advantages.group_advantages(r, 4, eps=0.5), [0.5, -0.5, -0.5, 0.5],
                             rtol=1e-6)  # 0.5 / (0.5 + 0.5)
  np.testing.assert_allclose(advantages.group_advantages(r, 4, normalize_std=False),
                             [0.5, -0.5, -0.5, 0.5], rtol=1e-6)
  # group size 2: groups [1, 0] and [0, 1] -> centred [.5, -.5], [-.5, .5]
  np.testing.assert_allclose(advantages.group_advantages(r, 2, normalize_std=False),
                             [0.5, -0.5, -0.5, 0.5], rtol=1e-6)


def test_constant_group_is_zero_and_finite():
  a = advantages.group_advantages(jnp.array([3.0, 3.0, 3.0, 1.0, 0.0, 1.0]), 3)
  np.testing.assert_array_equal(a[:3], 0.0)
  assert np.all(np.isfinite(a))
  # Group 1: [1, 0, 1], mean 2/3, std sqrt(2)/3 -> [1/sqrt2, -sqrt2, 1/sqrt2]
  np.testing.assert_allclose(a[3:], [1 / np.sqrt(2), -np.sqrt(2), 1 / np.sqrt(2)], rtol=1e-5)


def test_group_size_one_gives_zero():
  np.testing.assert_array_equal(advantages.group_advantages(jnp.arange(3.0), 1), 0.0)


def test_jit():
  f = jax.jit(advantages.group_advantages, static_argnums=(1, 2))
  r = jnp.array([1.0, 2.0, 3.0, 5.0])
  chex.assert_trees_all_close(f(r, 2, False), jnp.array([-0.5, 0.5, -1.0, 1.0]))


def test_validation():
  with pytest.raises(ValueError, match="not divisible"):
    advantages.group_advantages(jnp.zeros(6), 4)
  with pytest.raises(ValueError, match="positive int"):
    advantages.group_advantages(jnp.zeros(6), 0)
  with pytest.raises(ValueError, match="1-D"):
    advantages.group_advantages(jnp.zeros((2, 3)), 3)
