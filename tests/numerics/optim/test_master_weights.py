"""numerics.optim.master_weights: rounding float32 updates onto bf16 params.

References: ml_dtypes bf16 rounding of the float32 sum, a NumPy Kahan summation with
ml_dtypes, optax.apply_updates. Statistical tests state their false-failure probability.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from lowprec.numerics.optim import master_weights as mw
from lowprec.numerics.rounding import Nearest, Stochastic, TowardZero

F32 = np.float32
BF16 = ml_dtypes.bfloat16


def _bf16(x):
  return jnp.asarray(np.asarray(x, F32).astype(BF16))


def _apply(tx, params, updates, state):
  d, state = tx.update(updates, state, params)
  return optax.apply_updates(params, d), state


def test_nearest_equals_plain_apply_updates_and_float32_passes_through():
  rng = np.random.default_rng(0)
  p = {"w": _bf16(rng.standard_normal(256)), "f": jnp.asarray(rng.standard_normal(8), F32)}
  u = {"w": jnp.asarray(rng.standard_normal(256) * 1e-3, F32),
       "f": jnp.asarray(rng.standard_normal(8) * 1e-3, F32)}
  tx = mw.bf16_master_weights(Nearest())
  got, state = _apply(tx, p, u, tx.init(p))
  want = optax.apply_updates(p, u)
  for k in p:
    assert got[k].dtype == p[k].dtype
    np.testing.assert_array_equal(np.asarray(got[k], F32), np.asarray(want[k], F32))
  assert state.compensation == {"w": None, "f": None}


def test_apply_updates_lands_exactly_on_the_rounded_value_even_far_apart():
  # Exponent gaps far beyond float32's 24 bits between the param and the new value
  # (float32 subnormal sums are left out: XLA:CPU flushes them to zero).
  p = _bf16([1e-30, -3e20, 1.0, 0.0, 7.5e-39, 2.0, -1e-35, 65504.0])
  u = jnp.asarray([1e3, 1.0, -3e-30, 1e-30, 1e10, -2.0, 5e-3, -1e-3], F32)
  tx = mw.bf16_master_weights(mw.Kahan(jnp.float32))
  got, _ = _apply(tx, p, u, tx.init(p))
  s = np.asarray(p, F32) + np.asarray(u)  # c = 0 at the first step
  np.testing.assert_array_equal(np.asarray(got, F32), s.astype(BF16).astype(F32))


@pytest.mark.parametrize("comp", [jnp.bfloat16, jnp.float32])
def test_kahan_equals_numpy_reference(comp):
  rng = np.random.default_rng(1)
  p0 = rng.standard_normal(512).astype(F32).astype(BF16)
  us = (rng.standard_normal((30, 512)) * 1e-4).astype(F32)
  tx = mw.bf16_master_weights(mw.Kahan(comp))
  p, state = jnp.asarray(p0), tx.init(jnp.asarray(p0))
  step = jax.jit(lambda p, u, s: _apply(tx, p, u, s))
  rp, rc = p0.astype(F32), np.zeros(512, F32)
  for u in us:
    p, state = step(p, jnp.asarray(u), state)
    y = u + rc
    s = rp + y
    new = s.astype(BF16).astype(F32)
    rc = (s - new).astype(np.dtype(comp)).astype(F32)
    rp = new
  np.testing.assert_array_equal(np.asarray(p, F32), rp)
  np.testing.assert_array_equal(np.asarray(state.compensation, F32), rc)
  # Kahan tracks the float32 sum (within the bf16 rounding of the buffer); nearest
  # alone drifts.
  exact = p0.astype(np.float64) + us.astype(np.float64).sum(0)
  err_kahan = np.abs(rp.astype(np.float64) + rc - exact).max()
  plain = p0.astype(F32)
  for u in us:
    plain = (plain + u).astype(BF16).astype(F32)
  assert err_kahan < 0.1 * np.abs(plain.astype(np.float64) - exact).max()


def test_stochastic_rounding_is_reproducible_neighbouring_and_unbiased():
  # p = 1 (bf16 ulp 2^-7) plus u = 2^-9: P(up) = 1/4 exactly (all discarded bits
  # random). False-failure probability of |k/N - 1/4| > 5 sigma (normal approx.): 5.7e-7.
  n = 16384
  p = jnp.ones(n, jnp.bfloat16)
  u = jnp.full(n, 2.0 ** -9, F32)
  tx = mw.bf16_master_weights(Stochastic(), key=jax.random.key(0))
  got, state = _apply(tx, p, u, tx.init(p))
  again, _ = _apply(tx, p, u, tx.init(p))
  np.testing.assert_array_equal(np.asarray(got, F32), np.asarray(again, F32))
  vals = np.asarray(got, F32)
  assert set(np.unique(vals)) <= {1.0, 1.0 + 2.0 ** -7}
  k = np.count_nonzero(vals > 1)
  assert abs(k / n - 0.25) < 5 * np.sqrt(0.25 * 0.75 / n)
  # The next step (count 2) draws other bits.
  got2, _ = _apply(tx, p, u, state)
  assert not np.array_equal(np.asarray(got2, F32), vals)
  # Nearest would never move: the update is below half an ulp.
  tx_n = mw.bf16_master_weights(Nearest())
  assert np.all(np.asarray(_apply(tx_n, p, u, tx_n.init(p))[0], F32) == 1.0)


def test_errors():
  p = {"w": jnp.ones(4, jnp.bfloat16)}
  with pytest.raises(ValueError, match="key"):
    mw.bf16_master_weights(Stochastic())
  with pytest.raises(ValueError, match="key"):
    mw.bf16_master_weights(mw.Kahan(), key=0)
  with pytest.raises(ValueError, match="unknown rounding"):
    mw.parse_rounding("toward_zero")
  with pytest.raises(ValueError, match="TowardZero"):
    mw.bf16_master_weights(TowardZero())
  with pytest.raises(TypeError, match="parse_rounding"):
    mw.bf16_master_weights("kahan")
  with pytest.raises(ValueError, match="compensation_dtype"):
    mw.Kahan(jnp.float16)
  assert mw.parse_rounding("kahan") == mw.Kahan(jnp.bfloat16)
  assert mw.parse_rounding("stochastic", bits=8) == Stochastic(bits=8)
  tx = mw.bf16_master_weights(Nearest())
  with pytest.raises(ValueError, match="params"):
    tx.update(p, tx.init(p))
  with pytest.raises(TypeError, match="int32"):
    tx.init({"i": jnp.ones(3, jnp.int32)})
