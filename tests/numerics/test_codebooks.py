"""numerics.codebooks: tables against closed forms, codes against NumPy references.

References: exact rationals of bitsandbytes' dynamic-map construction, hand-written
levels, the published NF4 constants, threshold counting in NumPy
(tests/numerics/codebook_reference.py). Statistical tests state their false-failure
probability.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec.numerics import codebooks
from lowprec.numerics import random_bits
from lowprec.numerics.rounding import Stochastic, TowardZero
from tests.numerics import codebook_reference as ref

F32 = np.float32


@pytest.mark.parametrize("name,signed,e,bits", [
    ("dynamic8", True, 7, 8), ("dynamic8_unsigned", False, 7, 8),
    ("dynamic4", True, 3, 4)])
def test_dynamic_maps_equal_exact_closed_form(name, signed, e, bits):
  np.testing.assert_array_equal(codebooks.get(name).levels_array,
                                ref.dynamic_levels(signed, e, bits))


def test_dynamic_map_hand_values():
  d8 = codebooks.get("dynamic8").levels_array
  assert d8.shape == (256,) and d8[-1] == 1.0 and 0.0 in d8
  assert d8[0] == F32(-0.99296875)  # -(0.1 + 0.9 * 63.5/64): no -1 in the signed map
  assert d8[d8 > 0][0] == F32(0.55e-6)  # 10^-6 * (0.1 + 0.9 * 0.5)
  u8 = codebooks.get("dynamic8_unsigned").levels_array
  assert u8[0] == 0.0 and u8[1] == F32(0.325e-6) and u8[-2] == F32(0.996484375)
  np.testing.assert_array_equal(codebooks.get("dynamic4").levels_array, np.array(
      [-0.8875, -0.6625, -0.4375, -0.2125, -0.0775, -0.0325, -0.0055, 0.0, 0.0055,
       0.0325, 0.0775, 0.2125, 0.4375, 0.6625, 0.8875, 1.0], F32))
  np.testing.assert_array_equal(codebooks.get("linear4_unsigned").levels_array,
                                np.arange(1, 17, dtype=F32) / 16)
  np.testing.assert_array_equal(codebooks.get("nf4").levels_array, ref.NF4_PUBLISHED)


def test_signedness_and_lookup_errors():
  assert codebooks.get("nf4").signed and not codebooks.get("linear4_unsigned").signed
  with pytest.raises(ValueError, match="unknown codebook"):
    codebooks.get("nf3")
  with pytest.raises(TypeError):
    codebooks.get(3)
  with pytest.raises(ValueError, match="exceeds"):
    codebooks.dynamic_map(True, 8, 8)


def _probe_values(levels):
  t = ref.thresholds(levels)
  up = np.nextafter(t, F32(np.inf))
  down = np.nextafter(t, F32(-np.inf))
  rng = np.random.default_rng(0)
  rand = rng.uniform(-1.2, 1.2, 2000).astype(F32)
  return np.concatenate([levels, t, up, down, rand, F32([-2.0, 2.0, 0.0, -0.0])])


@pytest.mark.parametrize("name", codebooks.names())
def test_nearest_codes_equal_threshold_count_reference(name):
  lv = codebooks.get(name).levels_array
  x = _probe_values(lv)
  got = np.asarray(codebooks.encode(jnp.asarray(x), name))
  np.testing.assert_array_equal(got, ref.nearest_codes(x, lv))
  # Semantics: a nearest level (exactly, in float64) away from the float32 thresholds.
  far = np.min(np.abs(x[:, None].astype(np.float64) - ref.thresholds(lv)[None, :]),
               axis=1) > 1e-6
  d = np.abs(x[:, None].astype(np.float64) - lv[None, :].astype(np.float64))
  chosen = d[np.arange(x.size), got]
  np.testing.assert_array_equal(chosen[far], d.min(axis=1)[far])
  # A value exactly on a threshold goes to the lower code.
  t = ref.thresholds(lv)
  np.testing.assert_array_equal(np.asarray(codebooks.encode(jnp.asarray(t), name)),
                                np.arange(t.size))


@pytest.mark.parametrize("name", ["dynamic8", "nf4", "linear4_unsigned"])
def test_blockwise_quantize_dequantize_equal_reference(name):
  rng = np.random.default_rng(1)
  x = (rng.standard_normal((12, 64)) * np.exp2(rng.integers(-30, 30, (12, 1)))).astype(F32)
  if not codebooks.get(name).signed:
    x = np.abs(x)
  x[3] = 0.0                                 # all-zero block
  x[4] = F32(1e-39) * np.sign(x[4])          # subnormal-only block: flushed to 0
  x[5, 7] = np.nan                           # poisoned block
  x[6, 0] = np.inf
  codes, absmax = codebooks.quantize_blocks(jnp.asarray(x), name)
  deq = codebooks.dequantize_blocks(codes, absmax, name)
  r_codes, r_absmax, r_deq = ref.codebook_blocks(x, codebooks.get(name).levels_array)
  ok = np.isfinite(r_absmax)
  np.testing.assert_array_equal(np.asarray(codes)[ok], r_codes[ok])
  np.testing.assert_array_equal(np.asarray(absmax), r_absmax)
  np.testing.assert_array_equal(np.asarray(deq), r_deq)
  assert np.all(np.asarray(deq)[3:5] == 0) and np.all(np.isnan(np.asarray(deq)[5:7]))


_words_jit = jax.jit(random_bits.random_words, static_argnums=1)


def _words(seed, shape):
  return _words_jit(jax.random.key(seed), shape)


def test_stochastic_threshold_is_exact_in_the_top_24_bits():
  # dynamic4 levels 0.0325 and 0.0775: x = 0.0325 + 0.3 * 0.045.
  lv = codebooks.get("dynamic4").levels_array
  lo, hi = lv[9], lv[10]
  x = F32(lo + F32(0.3) * (hi - lo))
  frac = (x - lo) / (hi - lo)  # float32, as the implementation computes it
  j = int(np.ceil(np.float64(frac) * 2 ** 24))  # words with (w >> 8) < j round up
  words = np.array([(j - 1) << 8, ((j - 1) << 8) | 0xFF, j << 8, 0, 0xFFFFFFFF],
                   np.uint32)
  got = codebooks.encode(jnp.full(5, x), "dynamic4", rounding=Stochastic(),
                         words=jnp.asarray(words))
  np.testing.assert_array_equal(np.asarray(got), [10, 10, 9, 10, 9])


@pytest.mark.parametrize("name", ["dynamic8", "nf4"])
def test_stochastic_levels_fixed_and_one_step(name):
  lv = codebooks.get(name).levels_array
  rand = np.random.default_rng(2).uniform(lv[0], 1.0, 4096 - lv.size).astype(F32)
  x = np.concatenate([lv, rand])
  sr = np.asarray(codebooks.encode(jnp.asarray(x), name, rounding=Stochastic(),
                                   words=_words(1, x.shape))).astype(int)
  np.testing.assert_array_equal(sr[:lv.size], np.arange(lv.size))  # levels never move
  below = np.searchsorted(lv, x, side="right") - 1
  assert np.all((sr == below) | (sr == below + 1))
  np.testing.assert_array_equal(lv[sr] <= x, sr == below)


def test_stochastic_midpoint_is_fair():
  # x halfway between NF4 levels 8 and 9: P(up) = 1/2 up to 2^-21.
  # False-failure probability of |k/N - 1/2| > 5 sigma (normal approx.): 5.7e-7.
  lv = codebooks.get("nf4").levels_array
  x = F32((np.float64(lv[8]) + lv[9]) / 2)
  n = 4096 * 5
  codes = np.asarray(codebooks.encode(jnp.full(n, x), "nf4", rounding=Stochastic(),
                                      words=_words(7, (n,))))
  assert set(np.unique(codes)) <= {8, 9}
  k = np.count_nonzero(codes == 9)
  assert abs(k / n - 0.5) < 5 * np.sqrt(0.25 / n)


def test_encode_argument_errors():
  x = jnp.zeros(4)
  with pytest.raises(ValueError, match="words"):
    codebooks.encode(x, "nf4", rounding=Stochastic())
  with pytest.raises(ValueError, match="only used"):
    codebooks.encode(x, "nf4", words=jnp.zeros(4, jnp.uint32))
  with pytest.raises(ValueError, match="rounding"):
    codebooks.encode(x, "nf4", rounding=TowardZero())
  with pytest.raises(ValueError, match="blocks"):
    codebooks.quantize_blocks(jnp.zeros(8), "nf4")
