"""Reproducible uniform random 32-bit words for stochastic rounding.

Two generators, both pure functions of a JAX PRNG key and the element's row-major
index (so a Pallas kernel, a sharded run and the jnp reference draw the same bits):

* ``"hash"`` (default): a counter-based hash. Word ``i`` is
  ``lowbias32(lowbias32(i + s0) ^ s1)`` where ``(s0, s1)`` are two 32-bit seeds
  hashed from all the key's words and ``lowbias32`` is C. Wellons' 32-bit integer
  finalizer (two
  multiply-xorshift rounds, measured avalanche bias 0.17%). It is a bijection of the
  index for a fixed key, so one array never repeats a word; it needs only 32-bit
  integer multiplies, so XLA fuses it into the rounding and it costs about as much as
  the memory traffic. Trade-off: it is not a cryptographic or BigCrush-certified
  generator, arrays are limited to 2^32 elements per key, and two keys whose words
  collide give equal streams (probability 2^-64 per pair). The tests check bit
  balance, byte uniformity, neighbour and cross-key correlation with stated
  false-failure rates. It is what stochastic rounding needs: uniform, independent
  bits per element, reproducible from a key.
* ``"threefry"``: ``jax.random.bits`` (Threefry-2x32, 20 rounds), the JAX standard.
  Statistically stronger, about 7-12x slower than ``"hash"`` on the CPU.

Inside ``jax.shard_map`` each shard holds a local block and indexes it from 0, so
with one key every shard would draw the same words (correlated rounding noise across
data-parallel replicas). The quantizers therefore pass the array they round as
``shard_of``: when it varies over manual mesh axes (``jax.typeof(x)``'s varying axes,
tracked with ``check_vma=True``, shard_map's default), the shard's linear position
``p`` over those axes (``lax.axis_index`` over them in the mesh's axis order, the first
major) offsets its words:

* ``"hash"``: word ``i`` of the shard is the word of index ``p * n + i`` (``n`` the
  local element count), i.e. ``s0`` becomes ``s0 + p * n``. Shards draw disjoint
  ranges of one stream, so no word repeats across shards (the global array is limited
  to 2^32 elements). When the array is sharded along its leading axis only, over mesh
  axes in mesh order (the data-parallel layout), ``p * n + i`` is the element's
  row-major index in the global array: the words, and so every stochastic rounding,
  equal the unsharded ones bit for bit. Other layouts get the same stream in another
  order.
* ``"threefry"``: ``jax.random.bits(jax.random.fold_in(key, p), shape)``.

An array that does not vary over a manual axis (replicated there) draws the same
words on every shard of it, so its rounding stays replicated; outside ``shard_map``
(and under ``jit`` with shardings, where indices are global already) the words are
exactly those of the formulas above. ``check_vma=False`` hides the varying axes: the
shards then index from 0 again.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

Method = Literal["hash", "threefry"]
METHODS = ("hash", "threefry")

_U32 = np.uint32
_M1 = np.uint32(0x7FEB352D)
_M2 = np.uint32(0x846CA68B)


def lowbias32(x: jax.Array) -> jax.Array:
  """Wellons' lowbias32 integer hash on uint32 (a bijection of 2^32)."""
  x = x ^ (x >> 16)
  x = x * _M1
  x = x ^ (x >> 15)
  x = x * _M2
  return x ^ (x >> 16)


def key_to_seeds(key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Two uint32 scalar seeds from one typed (``jax.random.key``) or raw uint32 key.

  The key's words are hashed together, so keys that differ in a single bit (e.g.
  ``key(0)`` and ``key(3)``, whose data are ``[0, 0]`` and ``[0, 3]``) get unrelated
  seeds; a batch of keys is rejected (vmap over keys instead).
  """
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    if key.shape != ():
      raise ValueError(f"expected a single PRNG key, got a key array of shape "
                       f"{key.shape}; vmap over keys instead")
    data = jax.random.key_data(key)
  else:
    data = key
    if data.dtype != jnp.uint32:
      raise TypeError(f"key must be a JAX PRNG key or uint32 key data, got {key.dtype}")
    if data.ndim != 1:
      raise ValueError(f"raw key data must be one key (1-D uint32), got shape "
                       f"{key.shape}; vmap over keys instead")
  data = data.reshape(-1)
  if data.shape[0] < 2:
    raise ValueError(f"key data must have at least 2 words, got shape {key.shape}")
  h = _U32(0x9E3779B9)
  for i in range(data.shape[0]):  # rbg keys carry 4 words: all of them count
    h = lowbias32(h ^ data[i]) + _U32(0x85EBCA6B)
  s0 = lowbias32(h)
  s1 = lowbias32(s0 ^ _U32(0xC2B2AE35))
  return s0, s1


def hash_words(index: jax.Array, s0: jax.Array, s1: jax.Array) -> jax.Array:
  """The ``"hash"`` generator's word for uint32 element ``index`` and seeds s0, s1.

  Usable inside Pallas kernels: pure uint32 integer arithmetic on arrays.
  """
  return lowbias32(lowbias32(index + s0) ^ s1)


def row_major_index(shape: tuple[int, ...]) -> jax.Array:
  """uint32 row-major linear index of every element of ``shape``."""
  size = int(np.prod(shape, dtype=np.int64))
  if size >= 2 ** 32:
    raise ValueError(f"the hash generator indexes at most 2^32 elements, got {shape}")
  idx = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for axis in range(len(shape) - 1, -1, -1):
    idx = idx + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * np.uint32(stride)
    stride *= shape[axis]
  return idx


def varying_manual_axes(x) -> tuple[str, ...]:
  """The manual mesh axes ``x`` varies over (inside ``shard_map``), in mesh order.

  Empty outside ``shard_map``, for a value replicated over every manual axis, and
  under ``check_vma=False`` (which does not track them).
  """
  mat = getattr(jax.typeof(x), "manual_axis_type", None)
  varying = getattr(mat, "varying", None)
  if not varying:
    return ()
  names = jax.sharding.get_abstract_mesh().axis_names
  return tuple(a for a in names if a in varying) or tuple(sorted(varying))


def shard_position(x) -> tuple[jax.Array, int] | None:
  """``(p, count)``: the linear position (int32, first axis major) of this shard over
  the manual mesh axes ``x`` varies over, and the number of such shards; None when
  ``x`` varies over none (see the module docstring)."""
  axes = varying_manual_axes(x)
  if not axes:
    return None
  count = 1
  for a in axes:
    count *= int(lax.axis_size(a))
  return lax.axis_index(axes if len(axes) > 1 else axes[0]), count


def sharded_seeds(key: jax.Array, shape: tuple[int, ...], shard_of=None
                  ) -> tuple[jax.Array, jax.Array]:
  """The ``"hash"`` seeds ``(s0, s1)`` of ``key`` for an array of local ``shape``: those
  of :func:`key_to_seeds`, with ``s0`` offset by ``p * size`` inside ``shard_map`` when
  ``shard_of`` varies over manual mesh axes (module docstring). The Pallas kernels
  take these, so they draw the words of :func:`random_words`."""
  s0, s1 = key_to_seeds(key)
  pos = None if shard_of is None else shard_position(shard_of)
  if pos is None:
    return s0, s1
  p, count = pos
  size = int(np.prod(shape, dtype=np.int64))
  if size * count >= 2 ** 32:
    raise ValueError(f"the hash generator indexes at most 2^32 elements, got {count} "
                     f"shards of {tuple(shape)} inside shard_map")
  return s0 + p.astype(jnp.uint32) * np.uint32(size), s1


def random_words(key: jax.Array, shape: tuple[int, ...], *,
                 method: Method = "hash", shard_of=None) -> jax.Array:
  """Uniform uint32 words of ``shape``, a pure function of ``key`` (and ``method``).

  ``shard_of``: the array the words will round (``shape`` is its shape). Inside
  ``shard_map``, when it varies over manual mesh axes, each shard draws its own words
  (module docstring); elsewhere it changes nothing.
  """
  shape = tuple(int(d) for d in shape)
  if method == "hash":
    s0, s1 = sharded_seeds(key, shape, shard_of)
    return hash_words(row_major_index(shape), s0, s1)
  if method == "threefry":
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
      key = jax.random.wrap_key_data(key)
    pos = None if shard_of is None else shard_position(shard_of)
    if pos is not None:
      key = jax.random.fold_in(key, pos[0])
    return jax.random.bits(key, shape, jnp.uint32)
  raise ValueError(f"unknown random-bit method {method!r}; known: {', '.join(METHODS)}")
