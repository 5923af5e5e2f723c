"""NVFP4's fast path (TE convention) against TE's chain in NumPy and the reference core.

``quantize_nvfp4`` and ``quantize_dequantize_nvfp4`` take a two-pass path for
``convention="te"`` and every rounding (``blockscale.nvfp4_te_fast``: block amax in
one variadic reduction, per-block scales materialized once, elements in the blocked
shape, E2M1 round-to-nearest by float adds); these tests hold it to the independent
NumPy transcription of Transformer Engine's formula in ``mx_reference`` (stochastic
rounding with the NumPy transcription of the hash words) and bit for bit to the
reference jnp core ``blockscale.nvfp4_quantize_core`` (which the Pallas kernels run),
on inputs chosen to reach every branch: tiny and huge block and tensor scales, E2M1
ties, float32 subnormals, signed zeros, zero blocks, all-zero tensors and blocks
holding NaN or Inf.
"""

import functools

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from lowprec import numerics
from lowprec.numerics import blockscale
from lowprec.numerics import nvfp4_fast
from lowprec.numerics import nvfp4_te
from lowprec.numerics import random_bits
from lowprec.numerics.rounding import Stochastic, parse
from tests.numerics import hash_reference
from tests.numerics import mx_reference as ref

_E2M1_TIES = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)


def _bits(a) -> np.ndarray:
  return np.asarray(a, np.float32).view(np.uint32)


def _wide_rows(seed: int, rows: int = 8) -> np.ndarray:
  """Rows of 64 elements whose blocks span 2^-40 .. 2^40 (tiny E4M3 scales too)."""
  rng = np.random.default_rng(seed)
  mant = rng.standard_normal((rows, 4, 16)).astype(np.float32)
  gain = np.exp2(rng.integers(-40, 40, (rows, 4, 1))).astype(np.float32)
  return (mant * gain).reshape(rows, 64)


def _check(x: np.ndarray, axis: int = -1):
  codes, scales, inv, deq = ref.quantize_nvfp4(x, axis=axis)
  q = numerics.quantize_nvfp4(jnp.asarray(x), axis=axis)
  np.testing.assert_array_equal(np.asarray(q.codes), codes)
  np.testing.assert_array_equal(np.asarray(q.scales), scales)
  assert _bits(q.tensor_scale) == _bits(inv)
  fused = numerics.blockscale.quantize_dequantize_nvfp4(jnp.asarray(x), axis=axis)
  # CPU flushes float32 subnormal products to zero; compare where the spec's value
  # is normal (the codes above already cover the subnormal ones bit for bit)
  normal = (np.abs(deq) >= np.finfo(np.float32).tiny) | ~np.isfinite(deq) | (deq == 0)
  np.testing.assert_array_equal(_bits(fused)[normal], _bits(deq)[normal])
  np.testing.assert_array_equal(_bits(numerics.dequantize(q))[normal], _bits(deq)[normal])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_wide_dynamic_range_matches_te_reference(seed):
  _check(_wide_rows(seed))


def test_e2m1_ties_round_to_even():
  # Block amax 6 with a tensor amax of 6: S_enc = 448, S_dec = 1, enc = 1 exactly, so
  # each tie reaches E2M1 unscaled.
  x = np.zeros((1, 16), np.float32)
  x[0, :7] = _E2M1_TIES
  x[0, 7:14] = -_E2M1_TIES
  x[0, 14] = 6.0
  codes, _, _, deq = ref.quantize_nvfp4(x)
  q = numerics.quantize_nvfp4(jnp.asarray(x))
  np.testing.assert_array_equal(np.asarray(q.codes), codes)
  np.testing.assert_array_equal(deq[0, :7], [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0])


def test_specials_zero_blocks_and_axis0():
  x = _wide_rows(7, rows=4)
  x[0, 3] = np.nan
  x[1, 20] = np.inf
  x[2, 32:48] = 0.0
  x[3, 48:] = 3e-39  # float32 subnormals
  _check(x)
  _check(np.ascontiguousarray(_wide_rows(8, rows=32).T[:64, :32]), axis=0)


def test_two_d_tiles_match_reference():
  x = _wide_rows(9, rows=16)
  q = numerics.quantize_nvfp4(jnp.asarray(x), block_shape=(16, 16))
  rows = ref.tiles_to_rows(x, 16, 16)
  want_r, want_s, want_t = ref.quantize_dequantize_nvfp4(rows, block=256)
  np.testing.assert_array_equal(np.asarray(q.scale_values()),
                                want_s.reshape(1, 4))
  assert _bits(q.tensor_scale) == _bits(want_t)
  fused = blockscale.quantize_dequantize_nvfp4(jnp.asarray(x), block_shape=(16, 16))
  np.testing.assert_array_equal(_bits(fused),
                                _bits(ref.rows_to_tiles(want_r, 16, 64, 16, 16)))


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(st.integers(0, 2**31 - 1), st.integers(-60, 60))
def test_random_blocks_match_reference(seed, log2_gain):
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal((2, 32)) * np.exp2(log2_gain)).astype(np.float32)
  _check(x)


def test_quantize_dequantize_has_straight_through_gradient():
  x = jnp.asarray(_wide_rows(3, rows=2))
  g = jax.grad(lambda v: jnp.sum(blockscale.quantize_dequantize_nvfp4(v) * 3.0))(x)
  np.testing.assert_array_equal(np.asarray(g), np.full(x.shape, 3.0, np.float32))


# ------------------------------------------------ every rounding: fast path vs reference


def _special_tensor(seed: int, shape: tuple[int, ...], log2_gain: int) -> np.ndarray:
  """float32 blocks of 16 along the last axis with per-block gains over 2^-60..2^60
  times ``2^log2_gain`` (so whole tensors of float32 subnormals too), and some blocks
  replaced by zeros, signed zeros, subnormal-only values, exact E2M1 ties or a NaN/Inf.
  """
  rng = np.random.default_rng(seed)
  rows, n = int(np.prod(shape[:-1])), shape[-1]
  xb = rng.standard_normal((rows, n // 16, 16)) * np.exp2(
      rng.integers(-60, 61, (rows, n // 16, 1)) + log2_gain)
  kind = rng.integers(0, 12, (rows, n // 16))
  xb[kind == 0] = 0.0
  xb[kind == 1] = -0.0
  xb[kind == 2] = rng.standard_normal(16) * 1e-40  # float32 subnormals
  ties = np.concatenate([_E2M1_TIES, -_E2M1_TIES, [6.0, -6.0]])
  xb[kind == 3] = ties * np.exp2(log2_gain)
  x = xb.astype(np.float32)
  flat = x.reshape(rows, n)
  for code, v in ((4, np.nan), (5, np.inf), (6, -np.inf)):
    r, b = np.nonzero(kind == code)
    flat[r, b * 16 + rng.integers(0, 16, r.shape)] = v
  return flat.reshape(shape)


@functools.partial(jax.jit, static_argnames=("axes", "blocks", "rounding", "fast"))
def _run_path(x, key, *, axes, blocks, rounding, fast):
  """(codes, scale codes, 1/S_enc, dequantized) by the fast path or the reference."""
  words = (random_bits.random_words(key, x.shape) if rounding.needs_key else None)
  if fast:
    kw = dict(rounding=rounding, words=words)
    codes, scales, inv = blockscale.nvfp4_te_fast(x, axes, blocks, dequantize=False, **kw)
    return codes, scales, inv, blockscale.nvfp4_te_fast(x, axes, blocks, dequantize=True,
                                                         **kw)
  s_enc, inv = blockscale.nvfp4_tensor_scale(x)
  codes, scales, values = blockscale.nvfp4_quantize_core(x, s_enc, axes, blocks,
                                                         rounding, words)
  return codes, scales, inv, values * inv


def _assert_fast_equals_reference(x, axes, blocks, rounding, rand_bits=None, seed=0):
  key = jax.random.key(seed) if rounding == "stochastic" else None
  kw = dict(axes=axes, blocks=blocks, rounding=parse(rounding, bits=rand_bits))
  fast = _run_path(jnp.asarray(x), key, fast=True, **kw)
  want = _run_path(jnp.asarray(x), key, fast=False, **kw)
  for name, a, b in zip(("codes", "scales", "1/S_enc", "dequantized"), fast, want):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, name
    if a.dtype == np.float32:
      a, b = a.view(np.uint32), b.view(np.uint32)
    np.testing.assert_array_equal(a, b, err_msg=name)


_LAYOUTS = [((1,), (16,)), ((0,), (16,)), ((0, 1), (16, 16))]


@pytest.mark.parametrize("rounding,rand_bits", [("nearest", None), ("stochastic", None),
                                                ("stochastic", 3), ("toward_zero", None)])
@pytest.mark.parametrize("axes,blocks", _LAYOUTS)
def test_fast_path_equals_reference_core_on_specials(axes, blocks, rounding, rand_bits):
  x = _special_tensor(1, (32, 64), 0)
  if axes == (0,):
    x = np.ascontiguousarray(x.T)  # blocks down the columns
  _assert_fast_equals_reference(x, axes, blocks, rounding, rand_bits)


@hypothesis.settings(max_examples=20, deadline=None)
@hypothesis.given(st.integers(0, 2**31 - 1), st.integers(-140, 100),
                  st.sampled_from(["nearest", "stochastic", "toward_zero"]),
                  st.sampled_from(_LAYOUTS))
def test_fast_path_equals_reference_core_hypothesis(seed, log2_gain, rounding, layout):
  x = _special_tensor(seed, (16, 32), log2_gain)
  if layout[0] == (0,):
    x = np.ascontiguousarray(x.T)
  _assert_fast_equals_reference(x, *layout, rounding, seed=seed)


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("block_shape", [16, (16, 16)])
def test_all_zero_tensor(rounding, block_shape):
  axes, blocks = blockscale.nvfp4_layout(2, block_shape, None)
  for x in (np.zeros((16, 32), np.float32), np.full((16, 32), -0.0, np.float32)):
    _assert_fast_equals_reference(x, axes, blocks, rounding)
    q = numerics.quantize_nvfp4(jnp.asarray(x), block_shape=block_shape,
                                rounding=parse(rounding),
                                key=jax.random.key(0) if rounding == "stochastic" else None)
    np.testing.assert_array_equal(np.asarray(q.scales), 0)
    assert float(q.tensor_scale) == 1.0


@hypothesis.settings(max_examples=15, deadline=None)
@hypothesis.given(st.integers(0, 2**31 - 1), st.integers(-140, 100),
                  st.sampled_from([None, 4]))
def test_stochastic_matches_numpy_reference(seed, log2_gain, rand_bits):
  """quantize_nvfp4 with SR against TE's chain in NumPy on the NumPy hash words."""
  x = _special_tensor(seed, (4, 64), log2_gain)
  key = jax.random.key(seed)
  words = hash_reference.hash_words_np(key, x.shape)
  codes, scales, inv, deq = ref.quantize_nvfp4(x, rounding="stochastic", words=words,
                                               rand_bits=rand_bits)
  q = numerics.quantize_nvfp4(jnp.asarray(x), rounding=Stochastic(bits=rand_bits),
                              key=key)
  np.testing.assert_array_equal(np.asarray(q.codes), codes)
  np.testing.assert_array_equal(np.asarray(q.scales), scales)
  assert _bits(q.tensor_scale) == _bits(inv)
  fused = blockscale.quantize_dequantize_nvfp4(
      jnp.asarray(x), rounding=Stochastic(bits=rand_bits), key=key)
  normal = (np.abs(deq) >= np.finfo(np.float32).tiny) | ~np.isfinite(deq) | (deq == 0)
  np.testing.assert_array_equal(_bits(fused)[normal], _bits(deq)[normal])


def test_stochastic_two_d_tiles_match_numpy_reference():
  x = _special_tensor(5, (32, 64), 0)
  key = jax.random.key(5)
  words = hash_reference.hash_words_np(key, x.shape)
  codes, scales, inv, _ = ref.quantize_nvfp4(
      ref.tiles_to_rows(x, 16, 16), rounding="stochastic",
      words=ref.tiles_to_rows(words, 16, 16), block=256)
  q = numerics.quantize_nvfp4(jnp.asarray(x), block_shape=(16, 16),
                              rounding=Stochastic(), key=key)
  np.testing.assert_array_equal(np.asarray(q.codes),
                                ref.rows_to_tiles(codes, 32, 64, 16, 16))
  np.testing.assert_array_equal(np.asarray(q.scales), scales.reshape(2, 4))
  assert _bits(q.tensor_scale) == _bits(inv)


def test_e2m1_rne_by_float_adds_matches_ml_dtypes():
  """``(m + C) - C`` against ml_dtypes' float4_e2m1fn RNE on every float32 within 64
  ulps of each grid point and tie, a dense sweep of [0, 16], huge values and Inf."""
  anchors = np.concatenate([_E2M1_TIES, [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 7.0,
                                         8.0, 2.0**23, 2.0**24, 2.0**25]])
  bits = anchors.astype(np.float32).view(np.int32)[:, None] + np.arange(-64, 65)
  m = np.concatenate([bits[bits >= 0].view(np.float32),
                      np.linspace(0, 16, 200_001, dtype=np.float32),
                      np.float32([1e-40, 1e30, np.finfo(np.float32).max, np.inf])])
  got = np.asarray(jax.jit(nvfp4_fast._e2m1_rne_magnitude)(jnp.asarray(m)))
  want = np.minimum(m, np.float32(6.0)).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("rand_bits", [None, 1, 3, 8, 23, 24, 25, 31, 32])
def test_e2m1_stochastic_rounding_in_floats_matches_numpy_reference(rand_bits):
  """The fast path's float-arithmetic E2M1 SR against the NumPy grid reference
  (``mx_reference.round_to_grid``) on every float32 within 64 ulps of each grid point,
  tie and binade edge, a dense sweep of [0, 16], tiny, subnormal and huge values, each
  with random words and the words that decide a carry (0, 1, 2^31 - 1, 2^31,
  2^32 - 1 and the complement of the fraction's bits)."""
  anchors = np.concatenate([_E2M1_TIES, [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 7.0, 8.0,
                                         2.0**-20, 2.0**23, 2.0**24, 2.0**25]])
  bits = anchors.astype(np.float32).view(np.int32)[:, None] + np.arange(-64, 65)
  m = np.concatenate([bits.ravel().view(np.float32),
                      np.linspace(0, 16, 20_001, dtype=np.float32),
                      np.float32([0.0, 1e-40, 2.0**-126, 1e-30, 1e30,
                                  np.finfo(np.float32).max])])
  rng = np.random.default_rng(0 if rand_bits is None else rand_bits)
  t = m.astype(np.float64) / np.where(m < 2, 0.5, np.where(m < 4, 1.0, 2.0))
  frac_bits = np.floor((t - np.floor(t)) * 2.0**32).astype(np.uint64).astype(np.uint32)
  word_sets = [rng.integers(0, 2**32, m.shape, dtype=np.uint64).astype(np.uint32)
               for _ in range(3)]
  word_sets += [np.full(m.shape, w, np.uint32) for w in (0, 1, 2**31 - 1, 2**31,
                                                          2**32 - 1)]
  word_sets += [~frac_bits, ~frac_bits + np.uint32(1)]
  fast = jax.jit(nvfp4_fast._e2m1_sr_magnitude, static_argnums=2)
  for words in word_sets:
    want = ref.round_to_grid(m, "e2m1", "stochastic", words=words, rand_bits=rand_bits)
    got = np.asarray(fast(jnp.asarray(m), jnp.asarray(words), rand_bits))
    np.testing.assert_array_equal(got.view(np.uint32),
                                  want.astype(np.float32).view(np.uint32))
  inf = fast(jnp.float32([np.inf, np.inf]), jnp.uint32([0, 2**32 - 1]), rand_bits)
  np.testing.assert_array_equal(np.asarray(inf), [6.0, 6.0])


@pytest.mark.parametrize("convention", ["te", "torchao"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "toward_zero"])
def test_public_fused_path_equals_the_two_step_form_for_every_rounding(rounding,
                                                                        convention):
  """quantize_dequantize_nvfp4 (one pass; ``te`` behind the tensor-scale branch) equals
  dequantize(quantize_nvfp4(.)) for every rounding, on normal and on tiny tensors."""
  key = jax.random.key(3) if rounding == "stochastic" else None
  for log2_gain in (0, -125):
    x = jnp.asarray(_special_tensor(5, (16, 64), log2_gain))
    kw = dict(rounding=parse(rounding), key=key, convention=convention)
    fused = blockscale.quantize_dequantize_nvfp4(x, **kw)
    two_step = numerics.dequantize(numerics.quantize_nvfp4(x, **kw))
    np.testing.assert_array_equal(_bits(fused), _bits(two_step))


# ------------------------------------------- the block-scale chain in float arithmetic


def test_e4m3_rounding_by_float_adds_equals_round_f32():
  # Every float32 exponent up to 448's (float32 subnormals included) with every pattern
  # of the top 11 mantissa bits (E4M3 keeps 3, the guard is the 4th) and low bits that
  # make exact ties, just above and just below them; plus 448 and its neighbours.
  e = np.arange(0, 136, dtype=np.uint32)[:, None, None] << 23
  top = np.arange(2048, dtype=np.uint32)[None, :, None] << 12
  low = np.array([0, 1, 0x7FF, 0x800, 0xFFF], np.uint32)[None, None, :]
  bits = (e | top | low).ravel()
  m = bits.view(np.float32)
  m = np.concatenate([m[m <= 448.0], np.float32([448.0, np.nextafter(np.float32(448.0),
                                                                     np.float32(0))])])
  got = jax.jit(nvfp4_fast._e4m3_rne_nonnegative)(jnp.asarray(m))
  # The independent reference: ml_dtypes' float32 -> E4M3 cast (round to nearest even).
  # On CPU it reads float32 subnormals as themselves, which E4M3 rounds to 0 as well.
  want = m.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
  np.testing.assert_array_equal(_bits(got), _bits(want))


def _e4m3_grid_and_midpoints() -> np.ndarray:
  v = np.arange(127, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
  mid = (v[1:] + v[:-1]) / 2
  pts = np.concatenate([v, mid, mid * (1 + 2.0 ** -20), mid * (1 - 2.0 ** -20),
                        [500.0, 1e4]])
  return np.sort(pts)


# Jitted, as the quantizers run them (op by op, each test compiled about 80 programs).
_te_chain = jax.jit(nvfp4_te.te_block_scales)
_by_table = jax.jit(nvfp4_fast.te_block_scales_by_table)


@pytest.mark.parametrize("log2_gain", [-140, -130, -120, -100, 0, 100])
def test_block_scales_by_table_equal_te_chain(log2_gain):
  # Blocks of the special tensors, and block amaxes that put S_dec on every E4M3 value,
  # on each midpoint and just either side of it, and above 448, under tensor scales
  # whose 1/S_enc is subnormal, tiny or normal.
  x = jnp.asarray(_special_tensor(5, (64, 64), log2_gain))
  block_amax = nvfp4_te.finite_block_amax(x, (1,), (16,))[0]
  s_enc, inv = blockscale.nvfp4_tensor_scale(x)
  points = _e4m3_grid_and_midpoints()
  amaxes = points * 6.0 / float(s_enc)
  amaxes = amaxes[amaxes < np.finfo(np.float32).max].astype(np.float32)
  # Padded with its largest amax to one length for every gain: one program per shape.
  grid = jnp.asarray(np.pad(amaxes, (0, len(points) - len(amaxes)), mode="edge"))
  for amax in (block_amax.ravel(), grid):
    want = _te_chain(amax, s_enc)
    got = _by_table(amax, s_enc, inv)
    for a, b in zip(got, want):
      np.testing.assert_array_equal(_bits(a), _bits(b))


def _bits_equal(a, b):
  np.testing.assert_array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


def test_many_tensors_share_a_chain_with_the_same_bits():
  """quantize_dequantize_nvfp4_blocks_many equals one call per tensor, bit for bit:
  1x16 blocks, 16x16 tiles with stochastic rounding, a padded ragged axis, a poisoned
  block and a tensor tiny enough for a subnormal 1/S_enc."""
  k = jax.random.split(jax.random.key(11), 4)
  a = jax.random.normal(k[0], (48, 64)) * 5.0
  b = (jax.random.normal(k[1], (32, 48)) * 1e-36).at[3, 5].set(jnp.nan)
  c = jax.random.normal(k[2], (40, 20))
  options = [dict(axis=1), dict(block_shape=(16, 16), rounding=Stochastic(), key=k[3]),
             dict(axis=1, pad=True)]
  many = blockscale.quantize_dequantize_nvfp4_blocks_many([a, b, c], options)
  for x, opt, (values, inv) in zip((a, b, c), options, many):
    want_values, want_inv = blockscale.quantize_dequantize_nvfp4_blocks(x, **opt)
    _bits_equal(values, want_values)
    _bits_equal(inv, want_inv)
  assert np.asarray(many[1][1]).view(np.uint32) < 0x00800000  # subnormal 1/S_enc


def test_many_tensors_validate_their_options():
  x = jnp.ones((16, 16))
  with pytest.raises(ValueError, match="as many options as tensors"):
    blockscale.quantize_dequantize_nvfp4_blocks_many([x, x], [{}])
  with pytest.raises(ValueError, match="unknown option"):
    blockscale.quantize_dequantize_nvfp4_blocks_many([x], [dict(axes=1)])
  with pytest.raises(ValueError, match="key"):
    blockscale.quantize_dequantize_nvfp4_blocks_many([x], [dict(rounding=Stochastic())])
