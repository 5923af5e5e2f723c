"""Statistical quality and API of numerics.random_bits ("hash" and "threefry").

False-failure budget per run (all checks are exact binomial or chi-square tails at
ALPHA = 4e-8, or |z| < 5.5 for Pearson correlations, 3.8e-8 each):
  * test_bit_balance: 2 methods x 2 keys x 32 bits = 128 checks        -> 5.1e-6
  * test_byte_histogram_chi_square: 2 methods x 4 byte positions = 8     -> 3.2e-7
  * test_neighbour_correlation: 2 methods x 3 lags x (32 + 1) = 198      -> 7.9e-6
  * test_split_keys_streams_uncorrelated: 2 methods x (32 + 1) = 66       -> 2.6e-6
  * test_sequential_seed_keys_uncorrelated: 2 methods x 6 pairs x 32 = 384 -> 1.5e-5
Total: < 3.2e-5 per run. The remaining tests are deterministic.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from lowprec.numerics import random_bits
from tests.numerics.hash_reference import lowbias32_np, seeds_np

ALPHA = 4e-8
N = 1 << 20
METHODS = ("hash", "threefry")


@functools.lru_cache(maxsize=None)
def _jwords(method, shape):
  return jax.jit(lambda key: random_bits.random_words(key, shape, method=method))


def words(key, n=N, method="hash"):
  return np.asarray(_jwords(method, (n,))(key))


def bit_counts(w):
  """Number of ones in each of the 32 bit positions (bit 0 = least significant)."""
  w = np.ascontiguousarray(w, np.uint32).reshape(-1)
  total = np.zeros(32, np.int64)
  for start in range(0, w.size, 1 << 20):
    chunk = w[start:start + (1 << 20)].view(np.uint8).reshape(-1, 4)
    bits = np.unpackbits(chunk, axis=1, bitorder="little")  # little-endian bytes
    total += bits.sum(0, dtype=np.int64)
  return total


def assert_balanced_bits(w, msg):
  n = np.asarray(w).size
  counts = bit_counts(w)
  lo = stats.binom.cdf(counts, n, 0.5)
  hi = stats.binom.sf(counts - 1, n, 0.5)
  tail = np.minimum(lo, hi)
  bad = np.flatnonzero(tail <= ALPHA / 2)
  z = (counts - n / 2) / np.sqrt(n / 4)
  assert bad.size == 0, f"{msg}: bits {bad.tolist()} unbalanced, z={z[bad].round(2)}"


def assert_uncorrelated(a, b, msg):
  u = a.astype(np.float64) / 2 ** 32 - 0.5
  v = b.astype(np.float64) / 2 ** 32 - 0.5
  r = np.corrcoef(u, v)[0, 1]
  assert abs(r) * np.sqrt(u.size) < 5.5, f"{msg}: r={r}"


# ----------------------------------------------------------------------------- definition


def test_hash_matches_documented_formula():
  key = jax.random.key(2024)
  s0, s1 = seeds_np(jax.random.key_data(key))
  i = np.arange(4096, dtype=np.uint32)
  with np.errstate(over="ignore"):
    ref = lowbias32_np(lowbias32_np(i + s0) ^ s1)
  np.testing.assert_array_equal(words(key, 4096), ref)
  np.testing.assert_array_equal(
      np.asarray(random_bits.hash_words(jnp.asarray(i), jnp.uint32(s0), jnp.uint32(s1))),
      ref)
  np.testing.assert_array_equal(np.asarray(random_bits.lowbias32(jnp.asarray(i))),
                                lowbias32_np(i))


def test_shape_is_row_major():
  key = jax.random.key(3)
  w = np.asarray(random_bits.random_words(key, (3, 5, 7)))
  np.testing.assert_array_equal(w.reshape(-1), words(key, 105))
  idx = np.asarray(random_bits.row_major_index((3, 5, 7)))
  np.testing.assert_array_equal(idx, np.arange(105, dtype=np.uint32).reshape(3, 5, 7))
  assert w.dtype == np.uint32
  assert np.asarray(random_bits.random_words(key, ())).shape == ()
  assert np.asarray(random_bits.random_words(key, (0, 4))).shape == (0, 4)
  t = np.asarray(random_bits.random_words(key, (3, 5), method="threefry"))
  np.testing.assert_array_equal(t, np.asarray(jax.random.bits(key, (3, 5), jnp.uint32)))


def test_hash_never_repeats_within_an_array():
  for key in (jax.random.key(0), jax.random.key(99)):
    w = words(key)
    assert np.unique(w).size == w.size
  w2 = np.asarray(_jwords("hash", (1024, 1024))(jax.random.key(5)))
  assert np.unique(w2).size == w2.size


# ----------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("seed", [0, 2024])
def test_bit_balance(method, seed):
  assert_balanced_bits(words(jax.random.key(seed), method=method), f"{method} {seed}")


@pytest.mark.parametrize("method", METHODS)
def test_byte_histogram_chi_square(method):
  w = words(jax.random.key(11), method=method)
  b = w.view(np.uint8).reshape(-1, 4)
  for pos in range(4):
    hist = np.bincount(b[:, pos], minlength=256)
    chi2, p = stats.chisquare(hist)
    assert p > ALPHA, f"{method} byte {pos}: chi2={chi2:.1f} p={p:.2e}"


@pytest.mark.parametrize("method", METHODS)
def test_neighbour_correlation(method):
  w = words(jax.random.key(12), method=method)
  for lag in (1, 2, 1024):  # 1024: vertical neighbours in a (1024, 1024) array
    a, b = w[:-lag], w[lag:]
    assert_balanced_bits(a ^ b, f"{method} lag {lag} (xor)")
    assert_uncorrelated(a, b, f"{method} lag {lag}")


@pytest.mark.parametrize("method", METHODS)
def test_split_keys_streams_uncorrelated(method):
  k1, k2 = jax.random.split(jax.random.key(13))
  a, b = words(k1, method=method), words(k2, method=method)
  assert np.any(a != b)
  assert_balanced_bits(a ^ b, f"{method} split keys (xor)")
  assert_uncorrelated(a, b, f"{method} split keys")


@pytest.mark.parametrize("method", METHODS)
def test_sequential_seed_keys_uncorrelated(method):
  """jax.random.key(0..3), the usual way to seed runs, must give independent streams.

  jax.random.key(i) has key data [0, i]; the hash's seeds mix both words, so keys
  one bit apart still get unrelated streams (this failed before the seeds were mixed).
  """
  n = 1 << 21
  ws = [words(jax.random.key(i), n, method) for i in range(4)]
  for i in range(4):
    for j in range(i + 1, 4):
      assert_balanced_bits(ws[i] ^ ws[j], f"{method} key({i}) vs key({j}) (xor)")


# ----------------------------------------------------------------------------- keys, limits


def test_key_to_seeds_typed_and_raw():
  typed = jax.random.key(7)
  raw = jax.random.PRNGKey(7)
  data = np.asarray(jax.random.key_data(typed))
  s_typed = [int(v) for v in random_bits.key_to_seeds(typed)]
  s_raw = [int(v) for v in random_bits.key_to_seeds(raw)]
  assert s_typed == s_raw == [int(v) for v in seeds_np(data)]
  for method in METHODS:
    np.testing.assert_array_equal(
        np.asarray(random_bits.random_words(typed, (64,), method=method)),
        np.asarray(random_bits.random_words(raw, (64,), method=method)))
  # rbg keys carry 4 words; the extra ones are folded in
  rbg = jax.random.key(7, impl="rbg")
  s = [int(v) for v in random_bits.key_to_seeds(rbg)]
  assert len(s) == 2
  w_rbg = np.asarray(random_bits.random_words(rbg, (64,)))
  assert w_rbg.shape == (64,) and w_rbg.dtype == np.uint32
  # the seeds are a pure function of the key, and usable under jit
  jitted = jax.jit(random_bits.key_to_seeds)(typed)
  assert [int(v) for v in jitted] == s_typed


def test_key_errors():
  with pytest.raises(TypeError):
    random_bits.key_to_seeds(jnp.zeros((2,), jnp.int32))
  with pytest.raises(TypeError):
    random_bits.random_words(jnp.zeros((2,), jnp.float32), (4,))
  with pytest.raises(ValueError):
    random_bits.key_to_seeds(jnp.zeros((1,), jnp.uint32))
  with pytest.raises(ValueError):
    random_bits.random_words(jax.random.key(0), (4,), method="mt19937")


@pytest.mark.parametrize("method", METHODS)
def test_batch_of_keys_is_rejected(method):
  """A key *array* (e.g. jax.random.split(key, 2)) is not one key.

  jax.random.bits (the "threefry" method) raises for it; "hash" must not silently
  flatten the two keys' data into four words and fold them as if it were one rbg key.
  """
  keys = jax.random.split(jax.random.key(0), 2)
  with pytest.raises((ValueError, TypeError)):
    random_bits.random_words(keys, (8,), method=method)


def test_hash_size_limit():
  key = jax.random.key(0)
  for shape in [(1 << 16, 1 << 16), (1 << 32,), (1 << 20, 1 << 13)]:
    with pytest.raises(ValueError, match="2\\^32"):
      jax.eval_shape(lambda k, s=shape: random_bits.random_words(k, s), key)
    with pytest.raises(ValueError):
      random_bits.row_major_index(shape)
  # one below the limit is fine (traced abstractly, nothing is allocated)
  out = jax.eval_shape(lambda k: random_bits.random_words(k, (1 << 16, (1 << 16) - 1)),
                       key)
  assert out.shape == (1 << 16, (1 << 16) - 1) and out.dtype == jnp.uint32
