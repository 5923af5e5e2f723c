"""numerics.error_feedback: q = RNE(x + r), r' = (x + r) - q."""

import functools

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec import numerics
from lowprec.numerics import formats

NAMES = formats.names()


def grid_ulp(q, name):
  """Spacing of the format's grid just above |q| (float64)."""
  f = formats.get(name)
  a = np.abs(np.asarray(q, np.float64))
  if f.kind == "int":
    return np.ones_like(a)
  _, e = np.frexp(a)
  e = np.where(a > 0, e - 1, f.emin)
  if f.kind == "scale":
    return np.ldexp(1.0, np.maximum(e, -127))
  return np.ldexp(1.0, np.maximum(e, f.emin) - f.man_bits)


@functools.lru_cache(maxsize=None)
def _jef(name):
  return jax.jit(lambda x, r: numerics.error_feedback(x, r, name))


@pytest.mark.parametrize("name", NAMES)
def test_residual_at_most_half_ulp(name):
  f = formats.get(name)
  rng = np.random.default_rng(0)
  # magnitudes well inside the normal range (XLA:CPU flushes float32 subnormals in x + r)
  lo_exp = max(np.log2(f.min_subnormal), -100)
  mags = np.exp2(rng.uniform(lo_exp, np.log2(f.max) - 0.1, size=4096))
  x = (mags * rng.choice([-1.0, 1.0], size=mags.size)).astype(np.float32)
  if not f.signed:
    x = np.abs(x)
  x = np.minimum(x, np.float32(f.max * 0.9)).astype(np.float32)
  r0 = (rng.uniform(-0.5, 0.5, size=x.size) * grid_ulp(x, name) * 0.5).astype(np.float32)
  q, r = (np.asarray(v) for v in _jef(name)(jnp.asarray(x), jnp.asarray(r0)))
  assert q.dtype == np.float32 and r.dtype == np.float32
  target = x.astype(np.float64) + r0.astype(np.float64)
  # q is RNE of the (float32) target and exact in the format
  t32 = (x + r0).astype(np.float32)
  np.testing.assert_array_equal(q, np.asarray(numerics.cast(jnp.asarray(t32), name)))
  np.testing.assert_array_equal(q, np.asarray(numerics.cast(jnp.asarray(q), name)))
  # the residual is what was left out, and at most half an ulp of q
  np.testing.assert_array_equal(r.astype(np.float64), t32.astype(np.float64) - q)
  assert np.all(np.abs(r.astype(np.float64)) <= grid_ulp(q, name) / 2)
  np.testing.assert_allclose(q.astype(np.float64) + r, target, rtol=2 ** -23, atol=0)


def _accumulate(name, w0, u, steps, feedback):
  """Adds u to w0 `steps` times, storing w in `name` (error feedback or plain RNE)."""
  def body(_, carry):
    w, r = carry
    if feedback:
      return numerics.error_feedback(w + u, r, name)
    return numerics.cast(w + u, name), r
  init = (jnp.asarray(w0, jnp.float32), jnp.zeros_like(jnp.asarray(w0, jnp.float32)))
  return jax.jit(lambda c: lax.fori_loop(0, steps, body, c))(init)


def test_tiny_updates_are_not_lost_bf16():
  steps, u = 10_000, np.float32(1e-5)
  exact = 1.0 + steps * float(u)  # 1.1 (float64)
  w_plain, _ = _accumulate("bf16", np.float32(1.0), u, steps, feedback=False)
  assert float(w_plain) == 1.0  # every 1.0 + 1e-5 rounds back to 1.0: the sum stalls
  w, r = _accumulate("bf16", np.float32(1.0), u, steps, feedback=True)
  ulp = 2.0 ** -7  # bf16 spacing on [1, 2)
  assert abs(float(w) - exact) <= ulp
  assert abs(float(r)) <= ulp / 2
  assert abs(float(w) + float(r) - exact) < 1e-3  # float32 accumulation error only
  assert float(numerics.cast(w, "bf16")) == float(w)


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "fp16", "bf16", "int8", "e3m2"])
def test_error_feedback_tracks_exact_sum_vector(name):
  f = formats.get(name)
  rng = np.random.default_rng(1)
  w0 = np.asarray(numerics.cast(jnp.asarray(
      rng.uniform(0.5, 2.0, size=256).astype(np.float32) * min(f.max / 8, 4.0)), name))
  ulp0 = grid_ulp(w0, name)
  u = (ulp0 * rng.uniform(0.01, 0.2, size=w0.size)).astype(np.float32)  # < ulp/2: lost
  steps = 20  # the sum grows by at most 4 ulps
  exact = w0.astype(np.float64) + steps * u.astype(np.float64)
  assert np.all(np.abs(exact) < f.max)
  w_plain, _ = _accumulate(name, w0, u, steps, feedback=False)
  np.testing.assert_array_equal(np.asarray(w_plain), w0)  # stalls
  w, r = (np.asarray(v) for v in _accumulate(name, w0, u, steps, feedback=True))
  assert np.all(np.abs(w - exact) <= grid_ulp(w, name))
  assert np.all(np.abs(r) <= grid_ulp(w, name) / 2)
  np.testing.assert_allclose(w + r.astype(np.float64), exact, rtol=1e-4)


def test_errors():
  x = jnp.ones((4,), jnp.float32)
  with pytest.raises(TypeError):
    numerics.error_feedback(x.astype(jnp.bfloat16), jnp.zeros((4,), jnp.float32), "bf16")
  with pytest.raises(TypeError):
    numerics.error_feedback(x, jnp.zeros((4,), jnp.float16), "bf16")
  with pytest.raises(TypeError):
    numerics.error_feedback(x, jnp.zeros((4,), jnp.int32), "bf16")
  with pytest.raises(ValueError):
    numerics.error_feedback(x, jnp.zeros((3,), jnp.float32), "bf16")
  with pytest.raises(ValueError):
    numerics.error_feedback(x, jnp.zeros((), jnp.float32), "bf16")
  with pytest.raises(ValueError):
    numerics.error_feedback(x, jnp.zeros((4, 1), jnp.float32), "bf16")
  with pytest.raises(ValueError):
    numerics.error_feedback(x, jnp.zeros((4,), jnp.float32), "nope")


def test_shapes_and_zero_residual_is_plain_rne():
  x = jnp.asarray(np.random.default_rng(2).standard_normal((3, 5)).astype(np.float32))
  q, r = _jef("e4m3")(x, jnp.zeros_like(x))
  assert q.shape == r.shape == (3, 5)
  np.testing.assert_array_equal(np.asarray(q), np.asarray(numerics.cast(x, "e4m3")))
  np.testing.assert_array_equal(np.asarray(r), np.asarray(x) - np.asarray(q))
