"""experiments.common.harness.train_loop.make_train_step, with and without a quantization state
carried by its gradient (Flax's _overwrite_with_gradient convention)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.common.harness.train_loop import (TrainState, init_train_state, make_train_step,
                                                   without_quant_state)

OVERWRITE = "_overwrite_with_gradient"


def _loss(params, quant_state, batch, key):
  del key
  w, s = params["w"], quant_state[OVERWRITE]["s"]
  # The carried state's gradient is its next value (here max |batch|), as delayed
  # scaling's amax history comes back from numerics.qdot.
  return jnp.sum((batch @ w) ** 2) + s * jax.lax.stop_gradient(jnp.max(jnp.abs(batch))), {}


def test_quant_state_is_replaced_by_its_gradient_and_params_alone_are_updated():
  opt = optax.sgd(0.1)
  w = jnp.ones((3, 2))
  state = init_train_state({"w": w}, opt, {OVERWRITE: {"s": jnp.float32(7.0)}})
  batch = jnp.array([[1.0, -4.0, 2.0]])
  step = make_train_step(_loss, opt, quant_metrics=lambda s: {"s": s[OVERWRITE]["s"]})
  g = jax.grad(lambda w: jnp.sum((batch @ w) ** 2))(w)
  want_w = np.asarray(w - 0.1 * g)
  new, metrics = step(state, batch, jax.random.key(0))  # donates state (and w)
  np.testing.assert_allclose(new.params["w"], want_w, rtol=1e-6)
  assert float(new.quant_state[OVERWRITE]["s"]) == 4.0 == float(metrics["s"])
  np.testing.assert_allclose(metrics["grad_norm"], np.linalg.norm(np.asarray(g)), rtol=1e-6)


def test_a_model_without_quantization_state_carries_an_empty_one():
  opt = optax.sgd(0.1)
  w = jnp.ones((3, 2))
  batch = jnp.array([[1.0, -4.0, 2.0]])
  step = make_train_step(without_quant_state(
      lambda p, b, k: (jnp.sum((b @ p["w"]) ** 2), {})), opt)
  g = jax.grad(lambda w: jnp.sum((batch @ w) ** 2))(w)
  want_w = np.asarray(w - 0.1 * g)
  new, metrics = step(init_train_state({"w": w}, opt), batch, jax.random.key(0))
  np.testing.assert_allclose(new.params["w"], want_w, rtol=1e-6)
  assert new.quant_state == {} and isinstance(new, TrainState)
  assert sorted(metrics) == ["grad_norm", "loss", "param_norm", "update_norm"]
