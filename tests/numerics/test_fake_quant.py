"""fake_quant: forward equals dequantize(quantize(.)), gradient is straight-through."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numerics
from numerics import quantizer as fq


@pytest.mark.parametrize("kwargs", [
    dict(fmt="e4m3"), dict(fmt="e2m1", block_shape=(32, 32)),
    dict(fmt="e2m1", scale_rule="alto"), dict(fmt="nvfp4"),
    dict(fmt="bf16"), dict(fmt="e5m2", scaling="none")])
def test_forward_matches_qdq_and_gradient_is_identity(kwargs):
  x = jax.random.normal(jax.random.key(0), (64, 64)) * 3
  y = numerics.fake_quant(x, **kwargs)
  fmt = kwargs["fmt"]
  if fmt == "nvfp4":
    want = numerics.dequantize(numerics.quantize_nvfp4(x))
  elif fmt == "bf16" or kwargs.get("scaling") == "none":
    want = numerics.cast(x, fmt)
  else:
    rest = {k: v for k, v in kwargs.items() if k != "fmt"}
    want = numerics.dequantize(numerics.quantize_mx(x, fmt, **rest))
  chex.assert_trees_all_equal(y, want)
  assert not np.array_equal(np.asarray(y), np.asarray(x))
  w = jax.random.normal(jax.random.key(1), x.shape)
  g = jax.grad(lambda x: jnp.sum(numerics.fake_quant(x, **kwargs) * w))(x)
  chex.assert_trees_all_equal(g, w)


def test_stochastic_needs_key_and_is_reproducible():
  x = jax.random.normal(jax.random.key(0), (8, 32))
  with pytest.raises(ValueError, match="PRNG key"):
    numerics.fake_quant(x, "e2m1", rounding="stochastic")
  k = jax.random.key(4)
  f = jax.jit(lambda x, k: numerics.fake_quant(x, "e2m1", rounding="stochastic", key=k))
  chex.assert_trees_all_equal(f(x, k), f(x, k))
  assert not np.array_equal(f(x, k), f(x, jax.random.key(5)))
  g = jax.grad(lambda x: jnp.sum(f(x, k)))(x)
  chex.assert_trees_all_equal(g, jnp.ones_like(x))


def test_dtype_preserved_and_spec_validation():
  x = jax.random.normal(jax.random.key(0), (4, 32)).astype(jnp.bfloat16)
  assert numerics.fake_quant(x, "e4m3").dtype == jnp.bfloat16
  with pytest.raises(ValueError, match="unknown format"):
    fq.QuantSpec(fmt="e1m1")
  with pytest.raises(ValueError, match="rounding"):
    fq.QuantSpec(rounding="up")
  with pytest.raises(ValueError, match="element-wise cast"):
    fq.quantize(x, fq.QuantSpec(fmt="bf16"))
  assert hash(fq.QuantSpec()) == hash(fq.QuantSpec())
