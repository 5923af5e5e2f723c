"""Randomized Hadamard transform: definition, orthonormality, inverse, GEMM invariance."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec import numerics
from lowprec.numerics import hadamard


@pytest.mark.parametrize("n", [1, 2, 4, 16, 32, 64])
def test_sylvester_matrix(n):
  h = hadamard.hadamard_matrix(n)
  assert set(np.unique(h)) <= {-1.0, 1.0}
  np.testing.assert_array_equal(h @ h.T, n * np.eye(n))
  if n >= 2:  # Sylvester recursion H_2n = [[H, H], [H, -H]]
    k = hadamard.hadamard_matrix(n // 2)
    np.testing.assert_array_equal(h, np.block([[k, k], [k, -k]]))


@pytest.mark.parametrize("permute", [True, False])
def test_random_matrix_is_orthonormal_and_structured(permute):
  key = jax.random.key(3)
  r = np.asarray(hadamard.random_hadamard_matrix(32, key=key, permute=permute), np.float64)
  np.testing.assert_allclose(r @ r.T, np.eye(32), atol=1e-6)
  # Every entry is +-1/sqrt(32), and R = H D P up to the column signs/order.
  np.testing.assert_allclose(np.abs(r), 1 / np.sqrt(32), rtol=1e-6)
  h = hadamard.hadamard_matrix(32) / np.sqrt(32)
  cols = [np.argmax(np.abs(h.T @ r[:, j])) for j in range(32)]
  assert sorted(cols) == list(range(32))
  if not permute:
    assert cols == list(range(32))


def test_blockwise_application_matches_matrix():
  key = jax.random.key(0)
  x = jax.random.normal(jax.random.key(1), (64, 5))
  r = np.asarray(hadamard.random_hadamard_matrix(32, key=key), np.float64)
  want = np.concatenate([r @ np.asarray(x[:32], np.float64), r @ np.asarray(x[32:], np.float64)])
  np.testing.assert_allclose(np.asarray(numerics.random_hadamard(x, key=key)), want, atol=1e-5)
  # axis=1 on the transpose is the same transform.
  y = numerics.random_hadamard(x.T, key=key, axis=1)
  np.testing.assert_allclose(np.asarray(y), want.T, atol=1e-5)


@pytest.mark.parametrize("shape,axis,block", [((64, 48), 0, 16), ((3, 64, 8), 1, 32),
                                               ((2, 3, 64), -1, 16), ((64,), 0, 32),
                                               ((4, 32, 0), 1, 16)])
def test_blockwise_every_axis_matches_float64_reference(shape, axis, block):
  # Leading, middle and last axes (moved to the front, then batched per block), and an
  # empty array: each must be R applied to every block along ``axis``.
  key = jax.random.key(2)
  x = np.asarray(jax.random.normal(jax.random.key(3), shape), np.float64)
  r = np.asarray(hadamard.random_hadamard_matrix(block, key=key), np.float64)
  xm = np.moveaxis(x, axis, -1)
  blocks = xm.reshape(xm.shape[:-1] + (xm.shape[-1] // block, block))
  want = np.moveaxis((blocks @ r.T).reshape(xm.shape), -1, axis)
  got = numerics.random_hadamard(jnp.asarray(x, jnp.float32), key=key, axis=axis,
                                 block_shape=block)
  assert got.shape == x.shape
  np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=2e-6, rtol=1e-6)


def test_inverse_and_wgrad_invariance():
  key = jax.random.key(5)
  a = jax.random.normal(jax.random.key(6), (128, 16))
  b = jax.random.normal(jax.random.key(7), (128, 24))
  ha = numerics.random_hadamard(a, key=key)
  np.testing.assert_allclose(np.asarray(numerics.inverse_random_hadamard(ha, key=key)),
                             np.asarray(a), atol=2e-6)
  hb = numerics.random_hadamard(b, key=key)
  np.testing.assert_allclose(np.asarray(ha.T @ hb), np.asarray(a.T @ b), atol=2e-4)
  # Different keys give different transforms; the same key the same one.
  assert not np.allclose(numerics.random_hadamard(a, key=jax.random.key(8)), ha)
  chex.assert_trees_all_equal(numerics.random_hadamard(a, key=key), ha)


def test_outlier_spreading():
  x = jnp.zeros((32, 1)).at[3, 0].set(100.0)
  y = numerics.random_hadamard(x, key=jax.random.key(0))
  np.testing.assert_allclose(np.abs(np.asarray(y)), 100 / np.sqrt(32), rtol=1e-6)


def test_dtype_and_errors():
  x = jnp.ones((32, 4), jnp.bfloat16)
  assert numerics.random_hadamard(x, key=jax.random.key(0)).dtype == jnp.bfloat16
  with pytest.raises(ValueError, match="power of two"):
    numerics.random_hadamard(jnp.ones((24, 2)), key=jax.random.key(0), block_shape=24)
  with pytest.raises(ValueError, match="not divisible"):
    numerics.random_hadamard(jnp.ones((40, 2)), key=jax.random.key(0))
  with pytest.raises(TypeError, match="float"):
    numerics.random_hadamard(jnp.ones((32, 2), jnp.int32), key=jax.random.key(0))
