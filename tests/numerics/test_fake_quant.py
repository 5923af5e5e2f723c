"""fake_quant: forward equals dequantize(quantize(.)), gradient is straight-through."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec import numerics
from lowprec.numerics import quantizer as fq
from lowprec.numerics.rounding import Stochastic


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
    numerics.fake_quant(x, "e2m1", rounding=Stochastic())
  k = jax.random.key(4)
  f = jax.jit(lambda x, k: numerics.fake_quant(x, "e2m1", rounding=Stochastic(), key=k))
  chex.assert_trees_all_equal(f(x, k), f(x, k))
  assert not np.array_equal(f(x, k), f(x, jax.random.key(5)))
  g = jax.grad(lambda x: jnp.sum(f(x, k)))(x)
  chex.assert_trees_all_equal(g, jnp.ones_like(x))


def test_dtype_preserved_and_spec_validation():
  x = jax.random.normal(jax.random.key(0), (4, 32)).astype(jnp.bfloat16)
  assert numerics.fake_quant(x, "e4m3").dtype == jnp.bfloat16
  with pytest.raises(ValueError, match="unknown format"):
    fq.QuantSpec(fmt="e1m1")
  with pytest.raises(TypeError, match="rounding"):
    fq.QuantSpec(rounding="up")
  with pytest.raises(ValueError, match="element-wise cast"):
    fq.quantize(x, fq.QuantSpec(fmt="bf16"))
  assert hash(fq.QuantSpec()) == hash(fq.QuantSpec())


# Issue 35: fake_quant accepted complex (dropping the imaginary part), integer and bool
# inputs and returned them "quantized" in their own dtype, while cast and quantize_mx
# raised. Every public quantizer now rejects them, naming itself and the dtype.
def _public_quantizers():
  from lowprec.numerics import codebooks, delayed_scaling, kernels, nf4
  from lowprec.numerics import blockscale as bs
  spec, nv = fq.QuantSpec("e4m3"), fq.QuantSpec("nvfp4")
  return {
      "fake_quant": lambda x: numerics.fake_quant(x),
      "fake_quant nvfp4": lambda x: numerics.fake_quant(x, "nvfp4"),
      "fake_quant bf16": lambda x: numerics.fake_quant(x, "bf16"),
      "fake_quant tensor": lambda x: numerics.fake_quant(x, "e4m3", scaling="tensor"),
      "fake_quant_spec": lambda x: fq.fake_quant_spec(x, spec),
      "quantizer.quantize_dequantize": lambda x: fq.quantize_dequantize(x, nv),
      "quantizer.quantize": lambda x: fq.quantize(x, spec),
      "cast": lambda x: numerics.cast(x, "e4m3"),
      "cast_with_words": lambda x: numerics.cast_with_words(
          x, "e4m3", jnp.zeros(x.shape, jnp.uint32)),
      "quantize_mx": lambda x: numerics.quantize_mx(x),
      "quantize_dequantize_mx": lambda x: bs.quantize_dequantize_mx(x),
      "quantize_nvfp4": lambda x: numerics.quantize_nvfp4(x),
      "quantize_dequantize_nvfp4": lambda x: bs.quantize_dequantize_nvfp4(x),
      "quantize_dequantize_nvfp4_blocks":
          lambda x: bs.quantize_dequantize_nvfp4_blocks(x),
      "kernels.quantize_dequantize": lambda x: kernels.quantize_dequantize(x, spec),
      "kernels.quantize_dequantize_split": lambda x: kernels.quantize_dequantize_split(
          x, nv),
      "mx_quantize": lambda x: kernels.mx_quantize(x),
      "mx_quantize_dequantize": lambda x: kernels.mx_quantize_dequantize(x),
      "nvfp4_quantize": lambda x: kernels.nvfp4_quantize(x),
      "nvfp4_quantize_dequantize": lambda x: kernels.nvfp4_quantize_dequantize(x),
      "nvfp4_quantize_dequantize_blocks":
          lambda x: kernels.nvfp4_quantize_dequantize_blocks(x),
      "quantize_nf4": lambda x: nf4.quantize_nf4(x),
      "delayed_scaling.quantize_dequantize":
          lambda x: delayed_scaling.quantize_dequantize(
              x, delayed_scaling.init_state(4), "e4m3"),
      "delayed_scaling.quantize": lambda x: delayed_scaling.quantize(
          x, delayed_scaling.init_state(4), "e4m3"),
      "quantizer.tensor_quantize": lambda x: fq.tensor_quantize(
          x, fq.QuantSpec(fmt="e4m3", scaling="tensor")),
      "codebooks.encode": lambda x: codebooks.encode(x, "nf4"),
      "codebooks.quantize_blocks": lambda x: codebooks.quantize_blocks(x, "nf4"),
  }


@pytest.mark.parametrize("dtype", [jnp.complex64, jnp.int32, jnp.bool_, jnp.uint8])
@pytest.mark.parametrize("name", list(_public_quantizers()))
def test_public_quantizers_reject_complex_integer_and_bool(name, dtype):
  x = jnp.ones((4, 64), dtype)
  want = name.split(" ")[0]
  with pytest.raises(TypeError, match=rf"{want}.*{jnp.dtype(dtype).name}"):
    _public_quantizers()[name](x)


def test_fake_quant_still_takes_half_precision_inputs():
  x = jax.random.normal(jax.random.key(0), (8, 64))
  for dtype in (jnp.bfloat16, jnp.float16):
    y = numerics.fake_quant(x.astype(dtype))
    assert y.dtype == dtype
    chex.assert_trees_all_equal(y, numerics.fake_quant(x.astype(dtype).astype(jnp.float32)
                                                       ).astype(dtype))
