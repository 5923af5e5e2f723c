"""NumPy transcription of the documented counter hash (numerics.random_bits, "hash").

Word ``i`` of a key is ``lowbias32(lowbias32(i + s0) ^ s1)`` with seeds hashed from all
the key's words; written here from the module docstring, for tests that need the
stochastic-rounding words without numerics' own code.
"""

from __future__ import annotations

import jax
import numpy as np


def lowbias32_np(x):
  """C. Wellons' lowbias32 on uint32 (two multiply-xorshift rounds)."""
  x = np.asarray(x, np.uint32)
  with np.errstate(over="ignore"):
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    x = x ^ (x >> np.uint32(16))
  return x


def seeds_np(data):
  """The documented seed derivation: all key words hashed together."""
  with np.errstate(over="ignore"):
    h = np.uint32(0x9E3779B9)
    for w in np.asarray(data, np.uint32).reshape(-1):
      h = lowbias32_np(h ^ w) + np.uint32(0x85EBCA6B)
    s0 = lowbias32_np(h)
    return s0, lowbias32_np(s0 ^ np.uint32(0xC2B2AE35))


def hash_words_np(key: jax.Array, shape: tuple[int, ...]) -> np.ndarray:
  """uint32 words of ``shape``: the hash at each element's row-major index."""
  s0, s1 = seeds_np(np.asarray(jax.random.key_data(key)))
  i = np.arange(int(np.prod(shape)), dtype=np.uint32)
  with np.errstate(over="ignore"):
    return lowbias32_np(lowbias32_np(i + s0) ^ s1).reshape(shape)
