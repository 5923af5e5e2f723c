"""The --recipe -> dot_general lookup."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.common import recipe_flag
from models.transformer import bf16_dot_general

DN = (((1,), (0,)), ((), ()))


def test_fp32_and_bf16():
  x = jax.random.normal(jax.random.PRNGKey(0), (8, 64))
  w = jax.random.normal(jax.random.PRNGKey(1), (64, 16))
  key = jax.random.PRNGKey(2)
  ref = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  out32 = recipe_flag.recipe_dot_general("fp32")(x, w, DN, key)
  out16 = recipe_flag.recipe_dot_general("bf16")(x, w, DN, key)
  assert out32.dtype == jnp.float32 and out16.dtype == jnp.float32
  np.testing.assert_allclose(out32, ref, rtol=1e-5, atol=1e-4)
  # bf16: operands rounded to bf16, products accumulated in fp32 (vs a float64 reference
  # of the rounded operands).
  exact = (np.asarray(x.astype(jnp.bfloat16), np.float64)
           @ np.asarray(w.astype(jnp.bfloat16), np.float64))
  np.testing.assert_allclose(out16, exact, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(bf16_dot_general(x, w, DN, None), exact, rtol=1e-5, atol=1e-5)


def test_unknown_recipe():
  with pytest.raises(ValueError, match="nope"):
    recipe_flag.recipe_dot_general("nope")
  with pytest.raises(ValueError, match="Recipe"):
    recipe_flag.recipe_dot_general(3)


def test_available_recipes():
  names = recipe_flag.available_recipes()
  assert names[:2] == ("fp32", "bf16") and "mxfp8" in names


def test_mxfp8_through_numerics():
  x = jax.random.normal(jax.random.PRNGKey(0), (8, 64))
  w = jax.random.normal(jax.random.PRNGKey(1), (64, 16))
  out = recipe_flag.recipe_dot_general("mxfp8")(x, w, DN, jax.random.PRNGKey(2))
  assert out.shape == (8, 16) and out.dtype == jnp.float32
  ref = np.asarray(x) @ np.asarray(w)
  assert np.abs(np.asarray(out) - ref).max() < 0.2 * np.abs(ref).max()
