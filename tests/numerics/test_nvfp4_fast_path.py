"""NVFP4's fast round-to-nearest path (TE convention) against TE's chain in NumPy.

``quantize_nvfp4`` and ``quantize_dequantize_nvfp4`` take a two-pass path for
``convention="te", rounding="nearest"`` (block amax in one variadic reduction, ``enc``
from a 128-entry table, E2M1 by threshold comparisons); these tests hold it to the
independent NumPy transcription of Transformer Engine's formula in ``mx_reference``
on inputs chosen to reach every branch: tiny and huge block scales, E2M1 ties, float32
subnormals, zero blocks and blocks holding NaN or Inf.
"""

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numerics
from numerics import blockscale
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
