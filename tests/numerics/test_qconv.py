"""numerics.qconv: a convolution as an im2col GEMM under a recipe.

On operands every recipe represents exactly (small integers: MX blocks scale them by a
power of two that keeps them on the element grid) and whose sums float32 holds exactly,
the quantized convolution equals XLA's convolution bit for bit, in every layout, stride,
padding and dilation, and so do its gradients: the GEMM view, the (window, channel)
order of K and the patches' adjoint are checked independently of any rounding. The
rounding itself is held against an im2col product written in NumPy from the module's
definition, on data that does round.
"""

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np
import pytest

from lowprec import numerics
from lowprec.numerics import qconv

CASES = [
    (("NHWC", "HWIO", "NHWC"), (2, 9, 9, 32), (3, 3, 32, 8), (1, 1), "SAME", (1, 1), None),
    (("NCHW", "OIHW", "NCHW"), (2, 32, 9, 9), (8, 32, 3, 3), (2, 2), "VALID", (1, 1), None),
    (("NHWC", "HWIO", "NCHW"), (1, 8, 8, 3), (4, 4, 3, 6), (4, 4), "VALID", (1, 1), None),
    (("NHWC", "HWIO", "NHWC"), (1, 10, 10, 16), (3, 3, 16, 4), (1, 1), ((1, 2), (0, 1)),
     (2, 1), (1, 2)),
    (("NWC", "WIO", "NWC"), (2, 17, 32), (5, 32, 4), (2,), "SAME", (1,), None),
]


def _small_ints(key, shape):
  return jax.random.randint(key, shape, -4, 5).astype(jnp.float32)


# Every layout, stride, padding and dilation with a float32 GEMM; the block-scaled and
# bf16 recipes on a subset (each pair compiles a forward and a backward program).
_RECIPE_CASES = ([("fp32", c) for c in range(len(CASES))]
                 + [("mxfp8", c) for c in (0, 2, 3)] + [("bf16", 1)])


@pytest.mark.parametrize("recipe,case", _RECIPE_CASES)
def test_equals_xla_convolution_and_its_gradients_on_exact_data(case, recipe):
  dn, xs, ws, strides, pad, rhs_dil, lhs_dil = CASES[case]
  kx, kw, kc = jax.random.split(jax.random.key(case), 3)
  x, w = _small_ints(kx, xs), _small_ints(kw, ws)
  args = dict(window_strides=strides, padding=pad, rhs_dilation=rhs_dil,
              lhs_dilation=lhs_dil, dimension_numbers=dn)
  ref = lambda x, w: lax.conv_general_dilated(x, w, precision=lax.Precision.HIGHEST, **args)
  ours = lambda x, w: qconv.quantized_conv_general_dilated(x, w, recipe=recipe,
                                                           key=jax.random.key(3), **args)
  want = jax.jit(ref)(x, w)
  np.testing.assert_array_equal(jax.jit(ours)(x, w), want)
  if recipe == "bf16":
    return  # its backward GEMMs return bf16, which rounds sums above 256
  # A cotangent of small integers keeps the backward GEMMs exact too.
  c = _small_ints(kc, want.shape)
  grad = lambda f: jax.jit(jax.grad(lambda x, w: jnp.sum(f(x, w) * c), argnums=(0, 1)))(x, w)
  for got, exp in zip(grad(ours), grad(ref)):
    np.testing.assert_array_equal(got, exp)


def _im2col_reference(x_nhwc, w_hwio, stride):
  """NumPy: VALID, unit dilation; patches with K ordered (kh, kw, c), float64 GEMM."""
  n, h, wd, c = x_nhwc.shape
  kh, kw, _, o = w_hwio.shape
  oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
  p = np.empty((n, oh, ow, kh, kw, c), np.float64)
  for i in range(oh):
    for j in range(ow):
      p[:, i, j] = x_nhwc[:, i * stride:i * stride + kh, j * stride:j * stride + kw, :]
  return p.reshape(n, oh, ow, kh * kw * c), w_hwio.reshape(kh * kw * c, o)


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_rounding_follows_1x32_blocks_along_window_then_channel(fmt):
  """The mxfp8/mxfp4_1d2d-like forward GEMM: MX 1x32 blocks of K on both operands."""
  op = numerics.recipes.MXQuant(fmt, block_shape=32, scale_rule="floor")
  recipe = numerics.recipes.Recipe(f"mx_{fmt}_forward",
                                   forward=numerics.recipes.GemmRecipe(op, op))
  x = np.asarray(jax.random.normal(jax.random.key(0), (2, 8, 8, 32)), np.float32)
  w = np.asarray(jax.random.normal(jax.random.key(1), (2, 2, 32, 16)), np.float32)
  got = qconv.quantized_conv_general_dilated(
      jnp.asarray(x), jnp.asarray(w), (2, 2), "VALID",
      dimension_numbers=("NHWC", "HWIO", "NHWC"), recipe=recipe)
  p, k = _im2col_reference(x, w, 2)
  pq = np.asarray(numerics.fake_quant(jnp.asarray(p, jnp.float32), fmt, block_shape=32,
                                      axis=-1))
  kq = np.asarray(numerics.fake_quant(jnp.asarray(k, jnp.float32), fmt, block_shape=32,
                                      axis=0))
  want = pq.astype(np.float64) @ kq.astype(np.float64)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)
  assert not np.allclose(np.asarray(got), p @ k, rtol=1e-4, atol=1e-4)  # it did round


def test_boundary_errors():
  x, w = jnp.ones((1, 8, 8, 4)), jnp.ones((3, 3, 2, 4))
  with pytest.raises(ValueError, match="grouped convolution.*feature_group_count=2"):
    qconv.quantized_conv_general_dilated(x, w, (1, 1), "SAME", feature_group_count=2,
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                         recipe="mxfp8")
  with pytest.raises(TypeError, match="lhs must be a float array"):
    qconv.quantized_conv_general_dilated(jnp.ones((1, 8, 8, 2), jnp.int32), w, (1, 1),
                                         "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                         recipe="mxfp8")
  with pytest.raises(ValueError, match="input features"):
    qconv.quantized_conv_general_dilated(x, w, (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                         recipe="mxfp8")
  with pytest.raises(ValueError, match="delayed scaling"):
    qconv.quantized_conv_general_dilated(x, jnp.ones((3, 3, 4, 4)), (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                         recipe="fp8_delayed")
