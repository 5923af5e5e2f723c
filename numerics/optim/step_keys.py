"""PRNG keys per (step, pytree leaf) for stochastic rounding inside optimizers.

The key of leaf ``name`` at step ``t`` is ``fold_in(fold_in(key, t), tag(name))`` with
``tag`` the CRC-32 of the leaf's path name (:mod:`numerics.tree_paths`, e.g.
``block_0/qkv/kernel``) reduced to 31 bits. Keying by name rather than by flattening
index means adding or removing a parameter leaves every other leaf's random bits
unchanged; keying by the step (held in the optimizer state) makes a resumed run draw
the same bits as an uninterrupted one.
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp


def name_tag(name: str) -> int:
  """A stable 31-bit tag of a leaf name (CRC-32; the same in every process)."""
  return zlib.crc32(name.encode("utf-8")) & 0x7FFFFFFF


def as_key(key: jax.Array | int) -> jax.Array:
  """A JAX PRNG key from a key (typed, or raw uint32 data) or an integer seed (a
  Python int or an integer scalar array, as ``optax.inject_hyperparams`` passes it)."""
  if isinstance(key, bool):
    raise TypeError("key must be a PRNG key or an int seed, not a bool")
  if isinstance(key, int):
    return jax.random.key(key)
  key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) or key.dtype == jnp.uint32:
    return key
  if jnp.issubdtype(key.dtype, jnp.integer) and key.ndim == 0:
    return jax.random.key(key)
  raise TypeError(f"key must be a PRNG key or an int seed, got {key.dtype}{list(key.shape)}")


def leaf_key(key: jax.Array, step: jax.Array, name: str) -> jax.Array:
  """``fold_in(fold_in(key, step), name_tag(name))``."""
  return jax.random.fold_in(jax.random.fold_in(key, step), name_tag(name))
