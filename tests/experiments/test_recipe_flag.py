"""The --recipe -> dot_general lookup."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.common import recipe_flag

DN = (((1,), (0,)), ((), ()))
HAVE_NUMERICS_RECIPES = (importlib.util.find_spec("numerics.recipes") is not None
                         and importlib.util.find_spec("numerics.qdot") is not None)


def test_fp32_and_bf16():
  x = jax.random.normal(jax.random.PRNGKey(0), (8, 64))
  w = jax.random.normal(jax.random.PRNGKey(1), (64, 16))
  key = jax.random.PRNGKey(2)
  ref = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  out32 = recipe_flag.make_dot_general("fp32")(x, w, DN, key)
  out16 = recipe_flag.make_dot_general("bf16")(x, w, DN, key)
  assert out32.dtype == jnp.float32 and out16.dtype == jnp.float32
  np.testing.assert_allclose(out32, ref, rtol=1e-5, atol=1e-4)
  err16 = np.abs(np.asarray(out16) - ref).max()
  assert 1e-4 < err16 < 0.5  # rounded inputs, but accumulated in fp32
  bf = recipe_flag.bf16_dot_general(x, w, DN, None)
  exact = (np.asarray(x.astype(jnp.bfloat16), np.float64)
           @ np.asarray(w.astype(jnp.bfloat16), np.float64))
  np.testing.assert_allclose(bf, exact, rtol=1e-5, atol=1e-5)


def test_unknown_recipe():
  with pytest.raises(ValueError, match="nope"):
    recipe_flag.make_dot_general("nope")


def test_available_recipes():
  names = recipe_flag.available_recipes()
  assert names[:2] == ("fp32", "bf16")
  if HAVE_NUMERICS_RECIPES:
    assert "mxfp8" in names


@pytest.mark.skipif(HAVE_NUMERICS_RECIPES, reason="numerics.recipes is installed")
def test_quantized_recipe_without_numerics_says_why():
  with pytest.raises(ValueError, match="numerics.recipes"):
    recipe_flag.make_dot_general("mxfp8")


@pytest.mark.skipif(not HAVE_NUMERICS_RECIPES, reason="numerics.recipes not available yet")
def test_mxfp8_through_numerics():
  x = jax.random.normal(jax.random.PRNGKey(0), (8, 64))
  w = jax.random.normal(jax.random.PRNGKey(1), (64, 16))
  out = recipe_flag.make_dot_general("mxfp8")(x, w, DN, jax.random.PRNGKey(2))
  assert out.shape == (8, 16) and out.dtype == jnp.float32
  ref = np.asarray(x) @ np.asarray(w)
  assert np.abs(np.asarray(out) - ref).max() < 0.2 * np.abs(ref).max()


@pytest.mark.skipif(not HAVE_NUMERICS_RECIPES, reason="numerics.recipes not available yet")
def test_bf16_through_numerics_accumulates_in_fp32():
  x = jax.random.normal(jax.random.PRNGKey(0), (4, 256))
  w = jax.random.normal(jax.random.PRNGKey(1), (256, 8))
  out = recipe_flag.make_dot_general("bf16")(x, w, DN, jax.random.PRNGKey(2))
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out, recipe_flag.bf16_dot_general(x, w, DN, None),
                             rtol=1e-6, atol=1e-5)
