"""Stochastic rounding: neighbours, exact enumeration of the random bits, statistics,
reproducibility and saturation.

False-failure budget of the statistical tests in this file (exact binomial tails, or a
normal bound where stated), per run:
  * test_p_away_equals_discarded_fraction: 9 formats x 2 generators x 6 probabilities
    = 108 two-sided exact binomial checks at alpha = 4e-8            -> <= 4.4e-6
  * test_rand_bits_quantises_probability: 2 generators x 4 checks at 4e-8 -> 3.2e-7
  * test_midpoints_split_evenly: 9 formats x 2 generators at 4e-8     -> 7.2e-7
  * test_mean_is_unbiased_clt: 9 formats x 2 generators, |z| < 5.5 (normal
    approximation to a sum of 2^18 bounded terms; 3.8e-8 each)    -> 6.9e-7
  * test_different_keys_differ: P(two keys give identical results on 4096 elements
    whose discarded fraction is in [1/4, 3/4]) <= (5/8)^4096 per pair  -> ~0
  * test_result_is_a_grid_neighbour: fewer than 30% of ~2400 random-fraction inputs
    reaching the upper neighbour in 4 keys (expected ~80%): Hoeffding < e^-1000 -> ~0
  * test_hash_generator_indexes_row_major_positions: a transpose giving identical
    draws on 768 non-grid inputs                                       -> ~0
Total: < 7e-6 per run.
"""

from fractions import Fraction
import functools
import warnings

import chex
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from scipy import stats

from lowprec import numerics
from tests.numerics.format_values import all_values
from lowprec.numerics import formats
from lowprec.numerics import random_bits
from lowprec.numerics.rounding import Stochastic

NAMES = formats.names()
ALPHA = 4e-8  # per-check false-failure probability (about a 5.5 sigma two-sided bound)
GENERATORS = ("hash", "threefry")


# ----------------------------------------------------------------------------- references




def grid_neighbours(x, name):
  """float64 (lo, hi, q): |x| floored / ceiled on the format's (unbounded) grid."""
  f = formats.get(name)
  a = np.abs(np.asarray(x, np.float32).astype(np.float64))
  _, e = np.frexp(a)
  e = e - 1
  if f.kind == "int":
    q = np.ones_like(a)
    lo = np.floor(a)
  elif f.kind == "scale":
    lo = np.maximum(np.ldexp(1.0, e), 2.0 ** -127)
    lo = np.where(a < 2.0 ** -127, 2.0 ** -127, lo)
    q = lo
  else:
    q = np.ldexp(1.0, np.maximum(e, f.emin) - f.man_bits)
    lo = np.floor(a / q) * q
  hi = np.where(lo < a, lo + q, lo)
  return lo, hi, q


def overflow_value(name, saturate):
  """Magnitude a finite overflow becomes (NaN where the format says so)."""
  f = formats.get(name)
  if saturate or not (f.has_inf or f.has_nan):
    return f.max
  return np.inf if f.has_inf else np.nan


def signed_result(mag, x, name, saturate):
  f = formats.get(name)
  mag = np.where(mag > f.max, overflow_value(name, saturate), mag)
  return np.where(np.signbit(np.asarray(x, np.float32)), -mag, mag).astype(np.float32)


def discarded_fraction(x, name):
  """Exact discarded fraction of an ulp, with fractions.Fraction (independent of NumPy)."""
  f = formats.get(name)
  out = []
  for v in np.asarray(x, np.float32).reshape(-1):
    a = abs(Fraction(float(v)))
    if f.kind == "int":
      q = Fraction(1)
    elif f.kind == "scale":
      if a < Fraction(1, 2 ** 127):
        out.append(Fraction(0))
        continue
      e = a.numerator.bit_length() - a.denominator.bit_length()
      if Fraction(2) ** e > a:
        e -= 1
      q = Fraction(2) ** e
    else:
      if a == 0:
        out.append(Fraction(0))
        continue
      e = a.numerator.bit_length() - a.denominator.bit_length()
      if Fraction(2) ** e > a:
        e -= 1
      q = Fraction(2) ** (max(e, f.emin) - f.man_bits)
    out.append(a / q - (a / q).__floor__())
  return out


def assert_same_bits(got, ref, msg=""):
  got = np.asarray(got).astype(np.float32)
  ref = np.asarray(ref).astype(np.float32)
  nan_g, nan_r = np.isnan(got), np.isnan(ref)
  bad = (nan_g != nan_r) | (~nan_r & (got.view(np.uint32) != ref.view(np.uint32)))
  assert not bad.any(), (f"{msg}: {bad.sum()} mismatches, got {got[bad][:6]} "
                         f"want {ref[bad][:6]}")


def assert_binomial(k, n, p, msg=""):
  """Two-sided exact binomial test: fails with probability <= ALPHA when P = p."""
  lo_tail = stats.binom.cdf(k, n, p)
  hi_tail = stats.binom.sf(k - 1, n, p)
  assert min(lo_tail, hi_tail) > ALPHA / 2, (
      f"{msg}: k={k} of n={n}, k/n={k / n:.5f}, p={p:.5f}, tails {lo_tail:.2e} "
      f"{hi_tail:.2e}")


def in_range_inputs(name, n, seed):
  """Finite positive and negative inputs across the format's range (log-uniform),
  target subnormals, and the band (max, max + q) just above the largest value."""
  f = formats.get(name)
  rng = np.random.default_rng(seed)
  lo = np.log2(f.min_subnormal) - 2
  hi = np.log2(f.max)
  if name == "bf16":
    lo, hi = -140, 127
  mags = np.exp2(rng.uniform(lo, hi, size=n))
  sub = rng.uniform(0, f.min_normal, size=max(n // 8, 1))
  v = np.unique(all_values(name))
  q_top = v[-1] - v[-2]
  top = f.max + rng.uniform(0, 1, size=max(n // 16, 1)) * q_top
  x = np.concatenate([mags, sub, top])
  x = np.minimum(x, float(np.finfo(np.float32).max)).astype(np.float32)
  sign = rng.choice(np.array([-1, 1], np.float32), size=x.size)
  if f.signed:
    x = x * sign
  return x


# ----------------------------------------------------------------------------- jitted casts


@functools.lru_cache(maxsize=None)
def _jcast_words(name, rand_bits, saturate):
  return jax.jit(lambda x, w: numerics.cast_with_words(x, name, w, rand_bits=rand_bits,
                                                       saturate=saturate))


@functools.lru_cache(maxsize=None)
def _jcast_sr(name, rng, rand_bits=None, saturate=True):
  return jax.jit(lambda x, key: numerics.cast(
      x, name, rounding=Stochastic(bits=rand_bits, rng=rng), key=key, saturate=saturate))


# ----------------------------------------------------------------------------- (1) neighbours


@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_result_is_a_grid_neighbour(name, saturate):
  x = in_range_inputs(name, 2048, seed=1)
  lo, hi, _ = grid_neighbours(x, name)
  lo_v = signed_result(lo, x, name, saturate)
  hi_v = signed_result(hi, x, name, saturate)
  if name == "e8m0":
    x = np.abs(x)
    lo_v, hi_v = np.abs(lo_v), np.abs(hi_v)
  f = _jcast_sr(name, "hash", None, saturate)
  seen_hi = np.zeros(x.shape, bool)
  for seed in range(4):
    y = np.asarray(f(jnp.asarray(x), jax.random.key(seed)))
    is_lo = (y.view(np.uint32) == lo_v.view(np.uint32)) | (np.isnan(y) & np.isnan(lo_v))
    is_hi = (y.view(np.uint32) == hi_v.view(np.uint32)) | (np.isnan(y) & np.isnan(hi_v))
    assert np.all(is_lo | is_hi), x[~(is_lo | is_hi)][:5]
    seen_hi |= is_hi & ~is_lo
  # the up-neighbour is actually reached (on many elements: this can't pass vacuously)
  assert seen_hi.mean() > 0.3


@pytest.mark.parametrize("name", NAMES)
def test_grid_points_never_move(name):
  v = all_values(name).astype(np.float32)
  if name == "e8m0":
    v = v[v > 0]
  v = np.resize(v, N_DRAWS)  # one shape for all formats: compilations are reused
  for rng in GENERATORS:
    for seed in range(3):
      y = _jcast_sr(name, rng)(jnp.asarray(v), jax.random.key(seed))
      assert_same_bits(y, v, f"{name} {rng}")
  # with words that are all ones (the most eager to round away) too, not saturating
  for r in (None,):
    y = _jcast_words(name, r, False)(jnp.asarray(v), jnp.full(v.shape, 0xFFFFFFFF,
                                                              jnp.uint32))
    assert_same_bits(y, v, f"{name} all-ones words r={r}")


def test_sign_and_zero():
  x = jnp.asarray(np.array([-1e-30, 1e-30, -0.0, 0.0], np.float32))
  y = np.asarray(numerics.cast(x, "e4m3", rounding=Stochastic(), key=jax.random.key(0)))
  assert_same_bits(y, np.array([-0.0, 0.0, -0.0, 0.0], np.float32))
  y = np.asarray(numerics.cast_with_words(x, "e4m3", jnp.full((4,), 0xFFFFFFFF,
                                                              jnp.uint32)))
  # 1e-30 discards bits below 2^-41 of the 2^-9 quantum; r=32 bits see them: floor to 0
  assert_same_bits(y, np.array([-0.0, 0.0, -0.0, 0.0], np.float32))


# ----------------------------------------------------------------------------- (2) enumeration


def _enumeration_inputs(name):
  x = in_range_inputs(name, 192, seed=2)
  f = formats.get(name)
  v = np.unique(all_values(name))
  extra = [v[1] / 3, v[1] * 0.75, f.min_normal * 0.999, f.max, -f.max]
  if name == "bf16":  # float32 subnormals are bf16 subnormals
    extra += [1e-40, -3e-41, 1.5e-39]
  if name == "e8m0":
    x = np.abs(x)
    extra = [e for e in extra if e > 0] + [2.0 ** -127 * 1.75, 2.0 ** -128, 1e-44]
  x = np.concatenate([x, np.asarray(extra, np.float32)]).astype(np.float32)
  return x[:256] if x.size >= 256 else np.resize(x, 256)


ENUM_CONFIGS = tuple((r, False) for r in range(1, 7)) + ((2, True), (5, True))


@functools.lru_cache(maxsize=None)
def _jcast_enum(name):
  """One compilation per format for all enumeration configs (rand_bits, saturate)."""
  def run(x, words):
    return [numerics.cast_with_words(x, name, w, rand_bits=r, saturate=sat)
            for (r, sat), w in zip(ENUM_CONFIGS, words)]
  return jax.jit(run)


@pytest.mark.parametrize("name", NAMES)
def test_exact_enumeration_of_random_bits(name):
  x = _enumeration_inputs(name)
  lo, hi, q = grid_neighbours(x, name)
  frac = discarded_fraction(x, name)
  rows = 64
  ks, words, noisy = [], [], []
  for i, (r, _) in enumerate(ENUM_CONFIGS):
    k = np.arange(rows, dtype=np.uint32) % np.uint32(2 ** r)  # each k appears 64/2^r times
    w = np.broadcast_to((k << np.uint32(32 - r))[:, None], (rows, x.size))
    # garbage below the top r bits must not matter
    noise = np.random.default_rng(i).integers(0, 2 ** (32 - r), size=w.shape,
                                              dtype=np.uint64).astype(np.uint32)
    ks.append(k)
    words.append(jnp.asarray(w))
    noisy.append(jnp.asarray(w | noise))
  xx = jnp.asarray(np.broadcast_to(x, (rows, x.size)))
  ys = [np.asarray(y) for y in _jcast_enum(name)(xx, words)]
  ys_noisy = [np.asarray(y) for y in _jcast_enum(name)(xx, noisy)]
  for (r, saturate), k, y, y2 in zip(ENUM_CONFIGS, ks, ys, ys_noisy):
    msg = f"{name} r={r} sat={saturate}"
    assert_same_bits(y2, y, msg + ": low bits changed the result")
    lo_v = signed_result(lo, x, name, saturate)
    hi_v = signed_result(hi, x, name, saturate)
    top = np.array([int((fr * 2 ** r).__floor__()) for fr in frac])  # floor(frac 2^r)
    # adding the r random bits k to the top r discarded bits carries iff k >= 2^r - top
    away = k[:, None].astype(np.int64) >= (2 ** r - top)[None, :]
    want = np.where(away, hi_v[None, :], lo_v[None, :])
    assert_same_bits(y, want, msg)
    n_away = away.sum(0) * (2 ** r) // rows
    np.testing.assert_array_equal(n_away, top)
    # mean over all 2^r words is exactly x quantised to 2^-r of an ulp
    ok = np.abs(hi) <= formats.get(name).max
    mean = y[:, ok].astype(np.float64).mean(0)
    expect = lo[ok] + q[ok] * top[ok] / 2 ** r
    expect = np.where(np.signbit(x[ok]), -expect, expect)
    np.testing.assert_array_equal(mean, expect)
  # the inputs exercise both outcomes and the overflow band
  assert np.any(np.array(frac) > 0) and np.any(np.abs(hi) > formats.get(name).max)


def test_exact_enumeration_bf16_all_16_bits():
  """f32 -> bf16 discards exactly 16 bits: enumerating them gives the exact mean."""
  rng = np.random.default_rng(5)
  x = np.concatenate([rng.standard_normal(6), [1e-40, -2.5e-39]]).astype(np.float32)
  k = np.arange(2 ** 16, dtype=np.uint32)
  words = np.broadcast_to((k << np.uint32(16))[:, None], (k.size, x.size))
  xx = np.broadcast_to(x, words.shape)
  y = np.asarray(_jcast_words("bf16", None, True)(jnp.asarray(xx), jnp.asarray(words)))
  frac = discarded_fraction(x, "bf16")
  lo, hi, _ = grid_neighbours(x, "bf16")
  n_away = (np.abs(y.astype(np.float64)) == hi[None, :]).sum(0)
  np.testing.assert_array_equal(n_away, [int(fr * 2 ** 16) for fr in frac])
  assert all(fr * 2 ** 16 == int(fr * 2 ** 16) for fr in frac)
  np.testing.assert_array_equal(y.astype(np.float64).mean(0), x.astype(np.float64))


# ----------------------------------------------------------------------------- (3) statistics


def _inputs_with_fraction(name, ps):
  """One input per probability p: lo + p*q inside the format's normal range."""
  f = formats.get(name)
  base = 1.0 if f.kind != "int" else 3.0
  _, _, q = grid_neighbours(np.array([base], np.float32), name)
  return np.array([base + p * q[0] for p in ps], np.float32)


N_DRAWS = 1 << 16


@pytest.mark.parametrize("rng", GENERATORS)
@pytest.mark.parametrize("name", NAMES)
def test_p_away_equals_discarded_fraction(name, rng):
  ps = [1 / 64, 0.1, 1 / 3, 0.5, 0.77, 63 / 64]
  x = _inputs_with_fraction(name, ps)
  frac = [float(fr) for fr in discarded_fraction(x, name)]
  lo, _, _ = grid_neighbours(x, name)
  xx = np.broadcast_to(x[:, None], (x.size, N_DRAWS))
  y = np.asarray(_jcast_sr(name, rng)(jnp.asarray(xx), jax.random.key(123)))
  for i, p in enumerate(frac):
    assert abs(p - ps[i]) < 1e-4  # the input is the float32 nearest lo + p*q
    k = int((y[i].astype(np.float64) > lo[i]).sum())
    assert_binomial(k, N_DRAWS, p, f"{name} {rng} p={p}")


@pytest.mark.parametrize("rng", GENERATORS)
def test_rand_bits_quantises_probability(rng):
  # x = 1 + 0.3 ulp in bf16: with r random bits P(away) = floor(0.3 * 2^r) / 2^r
  x = np.float32(1.0 + 0.3 * 2.0 ** -7)
  frac = float(discarded_fraction([x], "bf16")[0])
  for r in (1, 2, 3, 5):
    y = np.asarray(_jcast_sr("bf16", rng, r)(jnp.full((N_DRAWS,), x), jax.random.key(9)))
    k = int((y > 1.0).sum())
    assert_binomial(k, N_DRAWS, np.floor(frac * 2 ** r) / 2 ** r, f"r={r}")


@pytest.mark.parametrize("rng", GENERATORS)
@pytest.mark.parametrize("name", NAMES)
def test_midpoints_split_evenly(name, rng):
  x = _inputs_with_fraction(name, [0.5])
  lo, hi, _ = grid_neighbours(x, name)
  y = np.asarray(_jcast_sr(name, rng)(jnp.full((N_DRAWS,), x[0]), jax.random.key(77)))
  assert set(np.unique(y)) <= {np.float32(lo[0]), np.float32(hi[0])}
  assert_binomial(int((y == hi[0]).sum()), N_DRAWS, 0.5, f"{name} {rng}")


@pytest.mark.parametrize("rng", GENERATORS)
@pytest.mark.parametrize("name", NAMES)
def test_mean_is_unbiased_clt(name, rng):
  """E[cast(x)] = x: the standardized sum of (cast - x)/q over 2^18 draws is < 5.5."""
  f = formats.get(name)
  x = in_range_inputs(name, 1024, seed=3)
  x = x[np.abs(x) < f.max]  # no saturation (that would bias the mean)
  if name == "e8m0":  # and no clamping up to 2^-127 (no smaller value: biased by design)
    x = np.abs(x)
    x = x[x >= 2.0 ** -127]
  x = np.resize(x, 1024)
  lo, hi, q = grid_neighbours(x, name)
  frac = np.array([float(fr) for fr in discarded_fraction(x, name)])
  reps = 256
  xx = np.broadcast_to(x, (reps, x.size))
  y = np.asarray(_jcast_sr(name, rng)(jnp.asarray(xx), jax.random.key(2024)))
  err = (np.abs(y.astype(np.float64)) - np.abs(x.astype(np.float64))) / q
  var = frac * (1 - frac)
  z = err.sum() / np.sqrt(reps * var.sum())
  assert abs(z) < 5.5, z
  # and the residual per element never exceeds one ulp
  assert np.all(np.abs(err) < 1)


# ----------------------------------------------------------------------------- (4) reproducibility


@pytest.mark.parametrize("rng", GENERATORS)
def test_same_key_same_bits_different_keys_differ(rng):
  x = _inputs_with_fraction("e4m3", np.linspace(0.25, 0.75, 4096))
  f = _jcast_sr("e4m3", rng)
  a = np.asarray(f(jnp.asarray(x), jax.random.key(1)))
  b = np.asarray(f(jnp.asarray(x), jax.random.key(1)))
  c = np.asarray(f(jnp.asarray(x), jax.random.key(2)))
  k1, k2 = jax.random.split(jax.random.key(1))
  d = np.asarray(f(jnp.asarray(x), k1))
  e = np.asarray(f(jnp.asarray(x), k2))
  np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
  for u, v in [(a, c), (a, d), (d, e), (c, e)]:
    assert np.any(u != v)
  # eager equals jit
  eager = np.asarray(numerics.cast(jnp.asarray(x), "e4m3", rounding=Stochastic(rng=rng),
                                   key=jax.random.key(1)))
  np.testing.assert_array_equal(eager.view(np.uint32), a.view(np.uint32))


def test_typed_and_raw_keys_agree():
  x = jnp.asarray(_inputs_with_fraction("bf16", np.linspace(0.1, 0.9, 512)))
  for rng in GENERATORS:
    a = _jcast_sr("bf16", rng)(x, jax.random.key(5))
    b = _jcast_sr("bf16", rng)(x, jax.random.PRNGKey(5))
    chex.assert_trees_all_equal(np.asarray(a), np.asarray(b))


def test_hash_generator_indexes_row_major_positions():
  """cast(x) equals the elementwise recomputation with hash_words at the element's
  row-major index; hence reshapes commute, and a slice of a concatenation is the
  slice cast with the words of its offset positions."""
  key = jax.random.key(31)
  s0, s1 = random_bits.key_to_seeds(key)
  rng = np.random.default_rng(0)
  x = rng.standard_normal((8, 96)).astype(np.float32)
  y = np.asarray(numerics.cast(jnp.asarray(x), "e2m1", rounding=Stochastic(), key=key))
  idx = jnp.arange(x.size, dtype=jnp.uint32).reshape(x.shape)
  w = random_bits.hash_words(idx, s0, s1)
  np.testing.assert_array_equal(np.asarray(numerics.cast_with_words(jnp.asarray(x),
                                                                    "e2m1", w)), y)
  # reshape-invariant (same row-major index)
  y_flat = np.asarray(numerics.cast(jnp.asarray(x.reshape(-1)), "e2m1",
                                    rounding=Stochastic(), key=key))
  np.testing.assert_array_equal(y_flat.reshape(x.shape), y)
  # concatenation: the second part sees indices offset by the first part's size
  a, b = x[:3].reshape(-1), x[3:].reshape(-1)
  cat = np.asarray(numerics.cast(jnp.asarray(np.concatenate([a, b])), "e2m1",
                                 rounding=Stochastic(), key=key))
  np.testing.assert_array_equal(cat, y.reshape(-1))
  wb = random_bits.hash_words(jnp.arange(a.size, x.size, dtype=jnp.uint32), s0, s1)
  np.testing.assert_array_equal(
      np.asarray(numerics.cast_with_words(jnp.asarray(b), "e2m1", wb)), cat[a.size:])
  # casting the part alone re-uses indices from 0: different draws (not tiling-invariant)
  alone = np.asarray(numerics.cast(jnp.asarray(b), "e2m1", rounding=Stochastic(),
                                   key=key))
  w0 = random_bits.hash_words(jnp.arange(b.size, dtype=jnp.uint32), s0, s1)
  np.testing.assert_array_equal(
      np.asarray(numerics.cast_with_words(jnp.asarray(b), "e2m1", w0)), alone)
  # transposing changes positions, hence the draws (equal by chance: ~0, see header)
  yt = np.asarray(numerics.cast(jnp.asarray(x.T), "e2m1", rounding=Stochastic(),
                                key=key))
  assert np.any(yt.T != y)


def test_threefry_uses_jax_random_bits():
  key = jax.random.key(8)
  x = jnp.asarray(np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32))
  y = numerics.cast(x, "e4m3", rounding=Stochastic(rng="threefry"), key=key)
  w = jax.random.bits(key, x.shape, jnp.uint32)
  chex.assert_trees_all_equal(y, numerics.cast_with_words(x, "e4m3", w))


# ----------------------------------------------------------------------------- (5) saturation


@pytest.mark.parametrize("name", NAMES)
def test_saturate_true_never_exceeds_max(name):
  f = formats.get(name)
  rng = np.random.default_rng(4)
  with np.errstate(over="ignore"):
    x = (f.max * rng.uniform(0.5, 3.0, size=4096)).astype(np.float32)
  x = np.concatenate([x, -x, [np.inf, -np.inf]]).astype(np.float32)
  if name == "e8m0":
    x = np.abs(x)
  fin = np.isfinite(x)
  y = np.asarray(_jcast_words(name, None, True)(
      jnp.asarray(x), jnp.full(x.shape, 0xFFFFFFFF, jnp.uint32)))
  assert np.all(np.abs(y[fin]) <= f.max)
  for r in (None, 2):
    y = np.asarray(_jcast_sr(name, "hash", r, True)(jnp.asarray(x), jax.random.key(0)))
    assert np.all(np.abs(y[fin]) <= f.max)
    want_inf = np.where(np.isinf(x), x, np.nan) if f.has_inf else np.sign(x) * f.max
    assert_same_bits(y[~fin], np.asarray(want_inf, np.float32)[~fin], name)


@pytest.mark.parametrize("name", NAMES)
def test_saturate_false_above_max(name):
  f = formats.get(name)
  v = np.unique(all_values(name))
  q_top = v[-1] - v[-2]
  x = np.array([f.max + q_top / 4, -(f.max + q_top / 4), np.inf, -np.inf, np.nan],
               np.float32)
  if name == "e8m0":
    x = np.abs(x)
  ones = jnp.full(x.shape, 0xFFFFFFFF, jnp.uint32)  # always rounds away
  zeros = jnp.zeros(x.shape, jnp.uint32)  # never rounds away
  y1 = np.asarray(_jcast_words(name, None, False)(jnp.asarray(x), ones))
  y0 = np.asarray(_jcast_words(name, None, False)(jnp.asarray(x), zeros))
  sgn = np.sign(x[:2])
  over = overflow_value(name, False)
  inf_val = np.inf if f.has_inf else (np.nan if f.has_nan else f.max)
  assert_same_bits(y1[:2], sgn * over, f"{name} away")
  assert_same_bits(y0[:2], sgn * f.max, f"{name} toward")
  for y in (y0, y1):
    assert_same_bits(y[2:4], np.sign(x[2:4]) * inf_val, f"{name} inf")
    assert np.isnan(y[4])
  if name in ("e4m3", "e8m0"):
    assert np.isnan(over)
  elif name in ("e5m2", "bf16", "fp16"):
    assert over == np.inf
  else:
    assert over == f.max


def test_e8m0_stochastic_zero_and_negative_are_nan():
  x = jnp.asarray(np.array([0.0, -0.0, -1.0, -3e-39, -np.inf, np.nan], np.float32))
  for words in (jnp.zeros(x.shape, jnp.uint32), jnp.full(x.shape, 0xFFFFFFFF, jnp.uint32)):
    for saturate in (False, True):
      y = np.asarray(numerics.cast_with_words(x, "e8m0", words, saturate=saturate))
      assert np.all(np.isnan(y)), y
  # below 2^-127 there is no smaller value: always 2^-127 (no zero to round down to)
  tiny = jnp.full((1024,), 2.0 ** -130, jnp.float32)
  y = np.asarray(_jcast_sr("e8m0", "hash")(tiny, jax.random.key(0)))
  np.testing.assert_array_equal(y, np.float32(2.0 ** -127))


def test_half_precision_inputs_stochastic():
  key = jax.random.key(3)
  for dt in (jnp.bfloat16, jnp.float16):
    x = jnp.linspace(-8, 8, 1024, dtype=jnp.float32).astype(dt)
    y = numerics.cast(x, "e2m1", rounding=Stochastic(), key=key)
    assert y.dtype == dt
    y32 = numerics.cast(x.astype(jnp.float32), "e2m1", rounding=Stochastic(), key=key)
    chex.assert_trees_all_equal(np.asarray(y.astype(jnp.float32)), np.asarray(y32))
  with pytest.raises(TypeError):
    numerics.cast(jnp.ones(4, jnp.bfloat16), "fp16", rounding=Stochastic(), key=key)
