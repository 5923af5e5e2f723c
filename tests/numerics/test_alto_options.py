"""ALTO recipe options: DGE, static/dynamic clipping, macro-block scaling."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec.numerics import blockscale, clipping, dge, macro_scaling, operator_snr, qdot, quantizer
from lowprec.numerics import recipes as R

SPEC = quantizer.QuantSpec(fmt="e2m1", block_shape=32, scale_rule="alto")


def test_dge_hand_values():
  # One block with amax 6 (alto rule: scale 1), so v = w. E2M1 bin [1, 1.5]: m = 1.25,
  # delta/2 = 0.25. f'(1.3) = (1/5) 0.25^(4/5) 0.05^(-4/5) = 0.2 * 5^(4/5).
  w = jnp.zeros(32).at[0].set(6.0).at[1].set(1.3).at[2].set(1.5).at[3].set(1.25)
  w = w.at[4].set(-1.3).at[5].set(5.0)
  d = np.asarray(jax.jit(lambda w: dge.surrogate_derivative(w, SPEC, k=5, clamp=3.0))(w))
  np.testing.assert_allclose(d[1], 0.2 * 5 ** 0.8, rtol=1e-5)
  np.testing.assert_allclose(d[2], 0.2, rtol=1e-5)  # bin edge: 1/k
  assert d[3] == 3.0  # centre: clamped
  assert d[4] == d[1]  # symmetric in sign
  np.testing.assert_allclose(d[5], 3.0)  # 5 is the centre of [4, 6]
  assert np.all((d >= 0) & (d <= 3))


def test_dge_scale_invariant():
  w = jax.random.normal(jax.random.key(0), (4, 64))
  derivative = jax.jit(lambda w: dge.surrogate_derivative(w, SPEC))
  a, b = derivative(w), derivative(w * 2.0 ** -20)
  chex.assert_trees_all_close(a, b, rtol=1e-5)


def test_dge_validation():
  with pytest.raises(ValueError):
    dge.surrogate_derivative(jnp.ones(32), quantizer.QuantSpec(fmt="bf16"))
  with pytest.raises(ValueError):
    dge.surrogate_derivative(jnp.ones(32), SPEC, k=0)


def test_grid_exponents_match_dequantized_scale():
  x = jax.random.normal(jax.random.key(1), (8, 64)) * 10
  s = blockscale.mx_grid_exponents(x, "e2m1", block_shape=32, scale_rule="alto")
  q = blockscale.quantize_mx(x, "e2m1", block_shape=32, scale_rule="alto")
  elems = np.asarray(q.element_values())
  np.testing.assert_array_equal(np.asarray(blockscale.dequantize(q)),
                                elems * np.exp2(np.asarray(s, np.float64)))


def test_rms_clipping_hand_case():
  x = jnp.concatenate([jnp.ones(31), jnp.array([100.0])])
  rms = np.sqrt((31 + 1e4) / 32)
  y = np.asarray(clipping.clip_to_block_rms(x, block_shape=32))
  np.testing.assert_allclose(y[-1], 2.922 * rms, rtol=1e-6)
  np.testing.assert_array_equal(y[:31], 1.0)
  # A constant block is left alone (rms = |value|).
  np.testing.assert_array_equal(clipping.clip_to_block_rms(jnp.full(32, -3.0), block_shape=32),
                                jnp.full(32, -3.0))


def test_macro_block_scales():
  x = jnp.concatenate([jnp.full(128, 0.5).at[3].set(-12.0), jnp.zeros(128)])
  s = np.asarray(macro_scaling.macro_block_scales(x, 6.0, block_shape=128))
  np.testing.assert_array_equal(s[:128], 2.0)
  np.testing.assert_array_equal(s[128:], 1.0)


def test_static_clipping_compensates_exactly_on_representable_data():
  # Values whose x 3/4 is again exactly representable and unsaturated: the GEMM output
  # equals the unclipped recipe's.
  x = jnp.full((32, 64), 1.0).at[0, 0].set(4.0)
  w = jnp.full((64, 32), 2.0)
  dn = (((1,), (0,)), ((), ()))
  base = qdot.quantized_dot_general(x, w, dn, "mxfp4_1d2d", preferred_element_type=jnp.float32)
  clip = qdot.quantized_dot_general(x, w, dn, R.with_static_clipping("mxfp4_1d2d"),
                                    preferred_element_type=jnp.float32)
  chex.assert_trees_all_close(base, clip, rtol=1e-6)


def test_options_raise_macro_block_snr_and_keep_grads_finite():
  base = operator_snr.snr("mxfp4", tokens=256, k=256, n=256)
  mbs = operator_snr.snr(R.with_macro_blocks("mxfp4"), tokens=256, k=256, n=256)
  assert mbs["forward"] > base["forward"] + 0.5
  for r in (R.with_dge("mxfp4"), R.with_dynamic_clipping("mxfp4"),
            R.with_static_clipping("mxfp4")):
    x = jax.random.normal(jax.random.key(2), (64, 64))
    w = jax.random.normal(jax.random.key(3), (64, 64))
    f = lambda x, w: jnp.sum(qdot.quantized_dot_general(
        x, w, (((1,), (0,)), ((), ())), r, key=jax.random.key(4),
        preferred_element_type=jnp.float32) ** 2)
    chex.assert_tree_all_finite(jax.jit(jax.grad(f, argnums=(0, 1)))(x, w))


def test_dge_multiplies_weight_gradient():
  x = jax.random.normal(jax.random.key(5), (64, 64))
  w = jax.random.normal(jax.random.key(6), (64, 64))
  dn = (((1,), (0,)), ((), ()))
  grad = lambda r: jax.grad(lambda w: jnp.sum(qdot.quantized_dot_general(
      x, w, dn, r, key=jax.random.key(7), preferred_element_type=jnp.float32)))(w)
  base, with_dge = grad("mxfp4"), grad(R.with_dge("mxfp4"))
  wspec = R.get("mxfp4").forward.rhs.spec(-2, -1)
  chex.assert_trees_all_close(with_dge, base * dge.surrogate_derivative(w, wspec),
                              rtol=1e-6)


def test_option_validation():
  with pytest.raises(ValueError, match="multiple"):
    R.MXQuant(fmt="e2m1", macro_block=48)
  with pytest.raises(ValueError, match="prescale"):
    R.MXQuant(fmt="e2m1", prescale=0.0)
  with pytest.raises(ValueError, match="clip"):
    R.MXQuant(fmt="e2m1", clip="quest")
  with pytest.raises(ValueError, match="bf16-exact"):
    R.replace(R.with_macro_blocks("mxfp4"), compute_dtype="bf16")
  with pytest.raises(ValueError, match="DGE"):
    R.with_dge("nvfp4")


def test_dge_factor_is_what_the_backward_applies():
  # Static clipping prescales the weight, so the factor must be taken on the prescaled
  # weight's grid: compare against the plain (no-DGE) backward times the factor.
  x = jax.random.normal(jax.random.key(8), (64, 64))
  w = jax.random.normal(jax.random.key(9), (64, 64))
  dn = (((1,), (0,)), ((), ()))
  clipped = R.with_static_clipping("mxfp4")
  grad = lambda r: jax.grad(lambda w: jnp.sum(qdot.quantized_dot_general(
      x, w, dn, r, key=jax.random.key(7), preferred_element_type=jnp.float32)))(w)
  with_dge = R.with_dge(clipped)
  chex.assert_trees_all_close(grad(with_dge), grad(clipped) * qdot.dge_factor(with_dge, w),
                              rtol=1e-6)
  wspec = R.get("mxfp4").forward.rhs.spec(-2, -1)
  np.testing.assert_array_equal(qdot.dge_factor(R.with_dge("mxfp4"), w),
                                dge.surrogate_derivative(w, wspec))


def test_dge_factor_validation():
  with pytest.raises(ValueError, match="no DGE"):
    qdot.dge_factor("mxfp4", jnp.ones((32, 32)))
  with pytest.raises(ValueError, match="K, N"):
    qdot.dge_factor(R.with_dge("mxfp4"), jnp.ones(32))
