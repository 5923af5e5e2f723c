"""Blockwise (randomized) Hadamard transforms and their inverses.

Along ``axis``, every block of ``block_size`` consecutive entries ``v`` becomes
``R v`` with the orthonormal matrix

    R = (1/sqrt(b)) * H_b * diag(s) * P

where ``H_b`` is the Sylvester Hadamard matrix (``H_1 = [1]``,
``H_2n = [[H_n, H_n], [H_n, -H_n]]``), ``s`` a vector of random signs and ``P`` a
random permutation (``(P v)_i = v_perm[i]``), both drawn from ``key``, the same ``R`` for
every block of the call (as ALTO's ``HadamardFactory``; ``permute=False`` gives the
signs-only RHT of Transformer Engine / torchao). Because ``R`` is orthonormal,
``(R A)^T (R B) = A^T B`` in exact arithmetic: applying the same transform along the
contracted (token) axis of both wgrad operands leaves ``dW`` unchanged while spreading
outliers across the block before quantization. The inverse applies ``R^T``.

Computed in float32 with ``Precision.HIGHEST``; the result has ``x``'s dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


@functools.lru_cache(maxsize=None)
def hadamard_matrix(n: int) -> np.ndarray:
  """The n x n Sylvester Hadamard matrix of +-1 (float32); ``n`` a power of two."""
  _check_block(n)
  h = np.ones((1, 1), np.float32)
  while h.shape[0] < n:
    h = np.block([[h, h], [h, -h]])
  return h


def _check_block(n) -> None:
  if not isinstance(n, (int, np.integer)) or n < 1 or n & (n - 1):
    raise ValueError(f"Hadamard block size must be a power of two, got {n!r}")


def random_hadamard_matrix(key: jax.Array, block_size: int = 32, *,
                           permute: bool = True) -> jax.Array:
  """The orthonormal ``(block_size, block_size)`` float32 matrix ``R`` for ``key``."""
  _check_block(block_size)
  k_sign, k_perm = jax.random.split(key)
  signs = jax.random.rademacher(k_sign, (block_size,), dtype=jnp.float32)
  h = jnp.asarray(hadamard_matrix(block_size)) * np.float32(1.0 / np.sqrt(block_size))
  hd = h * signs[None, :]
  if not permute:
    return hd
  perm = jax.random.permutation(k_perm, block_size)
  # (H D P)[:, j] = (H D)[:, k] where perm[k] = j.
  inv = jnp.argsort(perm)
  return hd[:, inv]


def apply_blockwise(x: jax.Array, r: jax.Array, block_size: int, axis: int
                    ) -> jax.Array:
  """``r @ block`` for every ``block_size`` block of ``x`` along ``axis`` (x's dtype)."""
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f"Hadamard transform expects a float array, got {x.dtype}")
  if x.ndim == 0:
    raise ValueError("Hadamard transform needs an array with at least one axis")
  if not -x.ndim <= axis < x.ndim:
    raise ValueError(f"axis {axis} out of range for shape {x.shape}")
  axis %= x.ndim
  n = x.shape[axis]
  if n % block_size:
    raise ValueError(f"axis {axis} of shape {x.shape} has length {n}, not divisible "
                     f"by the Hadamard block size {block_size}")
  xm = jnp.moveaxis(x.astype(jnp.float32), axis, 0)
  rest = xm.shape[1:]
  xb = xm.reshape(n // block_size, block_size, -1)
  y = jnp.einsum("ij,njk->nik", r, xb, precision=jax.lax.Precision.HIGHEST)
  return jnp.moveaxis(y.reshape((n,) + rest), 0, axis).astype(x.dtype)


@functools.partial(jax.jit, static_argnames=('block_size', 'axis', 'permute'))
def random_hadamard(x: jax.Array, key: jax.Array, *, block_size: int = 32,
                    axis: int = 0, permute: bool = True) -> jax.Array:
  """Applies ``R`` (see module docstring) to every ``block_size`` block along ``axis``.

  Args:
    x: float array; ``x.shape[axis]`` must be a multiple of ``block_size``.
    key: PRNG key drawing the signs and permutation.
    block_size: a power of two (ALTO: 32, NVFP4 recipes: 16).
    axis: transformed axis (0: the token axis of a (tokens, features) operand).
    permute: include the random permutation (ALTO) or signs only.

  Returns:
    Array of x's shape and dtype.
  """
  return apply_blockwise(x, random_hadamard_matrix(key, block_size, permute=permute),
                          block_size, axis)


@functools.partial(jax.jit, static_argnames=('block_size', 'axis', 'permute'))
def inverse_random_hadamard(x: jax.Array, key: jax.Array, *, block_size: int = 32,
                            axis: int = 0, permute: bool = True) -> jax.Array:
  """The inverse of :func:`random_hadamard` with the same key and layout (``R^T``)."""
  r = random_hadamard_matrix(key, block_size, permute=permute)
  return apply_blockwise(x, r.T, block_size, axis)
