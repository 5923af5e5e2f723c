"""numerics.memory: byte counts of pytrees against hand counts."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lowprec.numerics import memory


def test_tree_bytes_by_hand():
  tree = {"a": jnp.zeros((3, 5), jnp.float32), "b": (jnp.zeros(7, jnp.uint8), None),
          "c": jax.ShapeDtypeStruct((2, 4), jnp.bfloat16), "d": np.zeros(3, np.int32)}
  assert memory.tree_bytes(tree) == 15 * 4 + 7 + 8 * 2 + 3 * 4
  assert memory.num_params(tree) == 15 + 7 + 8 + 3


def test_bytes_per_param_of_optax_adamw():
  params = {"w": jnp.zeros((10, 10)), "b": jnp.zeros(10)}
  state = optax.adamw(1e-3).init(params)
  assert memory.bytes_per_param(state, params) == (8 * 110 + 4) / 110
  abstract = jax.eval_shape(optax.adamw(1e-3).init, params)
  assert memory.bytes_per_param(abstract, params) == (8 * 110 + 4) / 110


def test_errors():
  with pytest.raises(TypeError, match="float"):
    memory.tree_bytes({"x": 1.0})
  with pytest.raises(ValueError, match="no elements"):
    memory.bytes_per_param({}, {"w": jnp.zeros((0,))})
