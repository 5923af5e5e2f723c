"""The public boundary: every input that used to give a silent wrong answer (or a crash
deep inside jnp) now works or raises a clear error naming the value (issue 21, §4).

One test per case of the boundary table in the issue's closing note.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec import numerics
from lowprec.numerics import blockscale, kernels, qdot, quantizer, recipes
from lowprec.numerics.rounding import Nearest, Stochastic

X = jax.random.normal(jax.random.key(0), (64, 64))
DN = (((1,), (0,)), ((), ()))


def test_int_axis_with_a_2d_block_raises():
  # Before: axis=0 was ignored and the last two axes tiled.
  with pytest.raises(ValueError, match=r"tiles 2 axes.*axis=0"):
    numerics.quantize_mx(X, "e4m3", block_shape=(32, 32), axis=0)
  with pytest.raises(ValueError, match="needs 2 axes"):
    numerics.quantize_mx(X, "e4m3", block_shape=(32, 32), axis=(0,))
  q = numerics.quantize_mx(X, "e4m3", block_shape=(32, 16), axis=(1, 0))
  assert q.axes == (0, 1) and q.block_shape == (16, 32)


def test_one_name_for_block_geometry():
  # Before: block_size was silently dropped when block_shape was given.
  with pytest.raises(TypeError, match="block_size"):
    numerics.quantize_mx(X, "e4m3", block_size=16, block_shape=(32, 32))
  chex.assert_trees_all_equal(numerics.quantize_mx(X, "e4m3", block_shape=32),
                              numerics.quantize_mx(X, "e4m3", block_shape=(32,), axis=-1))


def test_quantized_array_fields_are_validated():
  # Before: scales of the wrong shape broadcast into wrong values.
  q = numerics.quantize_mx(X, "e4m3")
  fields = dict(codes=q.codes, scales=q.scales, tensor_scale=q.tensor_scale, fmt=q.fmt,
                scale_fmt=q.scale_fmt, axes=q.axes, block_shape=q.block_shape,
                shape=q.shape, scale_rule=q.scale_rule)
  for bad, match in ((dict(scales=q.scales[:, :1]), "scales have shape"),
                     (dict(codes=q.codes[:, :32]), "codes have shape"),
                     (dict(codes=q.codes.astype(jnp.int32)), "uint8"),
                     (dict(axes=(2,)), "axes"),
                     (dict(scale_fmt="e4m3"), "NVFP4"),
                     (dict(tensor_scale=jnp.ones(3)), "tensor_scale")):
    with pytest.raises((ValueError, TypeError), match=match):
      blockscale.QuantizedArray(**{**fields, **bad})


def test_batched_quantized_array_dequantizes_per_example():
  # Before: vmap(quantize_mx) then dequantize outside the vmap crashed in broadcasting.
  xb = X.reshape(2, 32, 64)
  for quantize in (lambda r: numerics.quantize_mx(r, "e4m3"),
                   lambda r: numerics.quantize_mx(r, "e2m1", block_shape=(16, 16))):
    qb = jax.vmap(quantize)(xb)
    assert qb.batch_shape == (2,)
    want = jnp.stack([numerics.dequantize(quantize(r)) for r in xb])
    chex.assert_trees_all_equal(numerics.dequantize(qb), want)
  with pytest.raises(ValueError):  # a batch axis that is not leading fails clearly
    jax.vmap(lambda r: numerics.quantize_mx(r, "e4m3"), out_axes=1)(xb)


def test_gradient_policy_per_function():
  # Before: all four gave an exactly zero gradient with no warning.
  w = jax.random.normal(jax.random.key(1), X.shape)
  ste = {
      "cast": lambda x: numerics.cast(x, "e4m3"),
      "quantize_dequantize_mx": lambda x: blockscale.quantize_dequantize_mx(x, "e4m3"),
      "quantizer.quantize_dequantize": lambda x: quantizer.quantize_dequantize(
          x, quantizer.QuantSpec("nvfp4")),
      "fake_quant": lambda x: numerics.fake_quant(x, "e2m1"),
  }
  for name, f in ste.items():
    g = jax.grad(lambda x: jnp.sum(f(x) * w))(X)
    chex.assert_trees_all_equal(g, w, custom_message=name)
  xb = X.astype(jnp.bfloat16)
  assert jax.grad(lambda x: jnp.sum(numerics.cast(x, "e4m3")))(xb).dtype == jnp.bfloat16
  for f, name in ((lambda x: numerics.dequantize(numerics.quantize_nvfp4(x)),
                   "quantize_nvfp4"),
                  (lambda x: numerics.dequantize(numerics.quantize_mx(x)), "quantize_mx")):
    with pytest.raises(TypeError, match=f"{name} has no gradient"):
      jax.grad(lambda x: jnp.sum(f(x)))(X)
  # Not differentiating through them is fine.
  jax.grad(lambda x: jnp.sum(x * numerics.dequantize(numerics.quantize_mx(
      jax.lax.stop_gradient(x)))))(X)


def test_specs_and_recipes_validate_at_construction():
  with pytest.raises(ValueError, match="positive ints"):
    quantizer.QuantSpec(block_shape=-3)
  with pytest.raises(ValueError, match="positive ints"):
    recipes.MXQuant(fmt="e4m3", block_shape=-32)
  with pytest.raises(ValueError, match="no block scaling"):
    quantizer.QuantSpec(fmt="bf16", block_shape=32)
  assert quantizer.QuantSpec(fmt="bf16").is_cast  # a bf16 spec is a cast by default
  with pytest.raises(ValueError, match="power of two"):
    recipes.GemmRecipe(hadamard=24)
  with pytest.raises(ValueError, match="NVFP4 blocks"):
    numerics.quantize_nvfp4(X, block_shape=(32, 32))
  with pytest.raises(ValueError, match="scale_rule is for MX"):
    quantizer.QuantSpec(fmt="nvfp4", scale_rule="rceil")
  with pytest.raises(TypeError, match="rounding must be Nearest"):
    quantizer.QuantSpec(fmt="e4m3", rounding="stochastic")


def test_empty_arrays():
  # Before: quantize_nvfp4 failed in a reduction, random_hadamard divided by zero.
  q = numerics.quantize_nvfp4(jnp.zeros((0, 16)))
  assert q.codes.shape == (0, 16) and numerics.dequantize(q).shape == (0, 16)
  for shape in ((16, 0), (0,)):
    q = numerics.quantize_mx(jnp.zeros(shape), "e4m3", pad=True)
    assert q.codes.shape == shape and numerics.dequantize(q).shape == shape
  assert numerics.random_hadamard(jnp.zeros((0, 32)), key=jax.random.key(0)).shape == (0, 32)
  assert numerics.quantize_mx(jnp.zeros((0, 32)), "e4m3").scales.shape == (0, 1)


def test_list_block_shape():
  # Before: "Non-hashable static arguments are not supported".
  chex.assert_trees_all_equal(numerics.quantize_mx(X, "e2m1", block_shape=[32, 32]),
                              numerics.quantize_mx(X, "e2m1", block_shape=(32, 32)))
  assert quantizer.QuantSpec("e4m3", [32, 32], axis=[0, 1]) == quantizer.QuantSpec(
      "e4m3", (32, 32), axis=(0, 1))


def test_one_convention_key_dtype_and_recipe_names():
  key = jax.random.key(0)
  with pytest.raises(TypeError):
    numerics.random_hadamard(X, key)  # key is keyword-only everywhere
  with pytest.raises(TypeError):
    qdot.quantized_dot_general(X, X, DN, "mxfp4", key)
  with pytest.raises(ValueError, match="would ignore"):
    numerics.cast(X, "e4m3", key=key)  # a key that nearest rounding would ignore
  with pytest.raises(ValueError, match="compute_dtype"):
    recipes.Recipe(name="r", compute_dtype="bfloat16")  # one spelling: "bf16"/"fp32"
  assert recipes.names()[:2] == ("fp32", "bf16")  # fp32 is a recipe like the others
  chex.assert_trees_all_equal(
      qdot.quantized_dot_general(X, X, DN, "fp32"),
      jax.lax.dot_general(X, X, DN, precision=jax.lax.Precision.HIGHEST))


@pytest.mark.parametrize("bad, error, match", [
    (dict(rounding="nearest"), TypeError, r"parse\('nearest'\)"),
    (dict(rounding=Stochastic()), ValueError, "needs a PRNG key"),
    (dict(key=jax.random.key(0)), ValueError, "would ignore"),
    (dict(rounding=Nearest(), key=jax.random.key(0)), ValueError, "would ignore"),
])
def test_every_quantizer_checks_rounding_arguments_alike(bad, error, match):
  """One check (``rounding.check_rounding_and_key``, once written four times) behind
  the element cast, the MX and NVFP4 quantizers and their Pallas kernels; a rounding
  name is refused (parsed only where flags are read)."""
  x = jnp.ones((8, 64), jnp.float32)
  entry_points = [
      lambda **kw: numerics.cast(x, "e4m3", **kw),
      lambda **kw: numerics.quantize_mx(x, "e4m3", **kw),
      lambda **kw: numerics.quantize_nvfp4(x, **kw),
      lambda **kw: kernels.mx_quantize(x, "e4m3", **kw),
      lambda **kw: kernels.nvfp4_quantize(x, **kw),
  ]
  for fn in entry_points:
    with pytest.raises(error, match=match):
      fn(**bad)


def test_kernels_refuse_a_generator_they_do_not_draw():
  """The Pallas kernels draw the hash generator's words in the kernel: a Stochastic
  rounding with another generator is refused at their entry points (before, they had
  no generator argument and the jnp fallback drew hash words too)."""
  x = jnp.ones((8, 64), jnp.float32)
  sr = dict(rounding=Stochastic(rng="threefry"), key=jax.random.key(0))
  for fn in (kernels.mx_quantize, kernels.mx_quantize_dequantize):
    with pytest.raises(ValueError, match="'hash' generator"):
      fn(x, "e4m3", **sr)
  for fn in (kernels.nvfp4_quantize, kernels.nvfp4_quantize_dequantize,
             kernels.nvfp4_quantize_dequantize_blocks):
    with pytest.raises(ValueError, match="'hash' generator"):
      fn(x, **sr)
