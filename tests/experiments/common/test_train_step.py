"""experiments.common.train_loop.make_train_step, with and without state carried by
its gradient (Flax's _overwrite_with_gradient convention)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments.common.train_loop import TrainState, make_train_step

OVERWRITE = "_overwrite_with_gradient"


def _loss(params, batch, key):
  del key
  w, s = params["params"]["w"], params[OVERWRITE]["s"]
  # The carried state's gradient is its next value (here max |batch|), as delayed
  # scaling's amax history comes back from numerics.qdot.
  return jnp.sum((batch @ w) ** 2) + s * jax.lax.stop_gradient(jnp.max(jnp.abs(batch))), {}


def test_overwrite_with_gradient_replaces_state_and_updates_params_only():
  opt = optax.sgd(0.1)
  w = jnp.ones((3, 2))
  params = {"params": {"w": w}, OVERWRITE: {"s": jnp.float32(7.0)}}
  state = TrainState(jnp.zeros((), jnp.int32), params, opt.init({"w": w}))
  batch = jnp.array([[1.0, -4.0, 2.0]])
  step = make_train_step(_loss, opt, overwrite_with_gradient=OVERWRITE,
                         overwrite_metrics=lambda s: {"s": s["s"]})
  g = jax.grad(lambda w: jnp.sum((batch @ w) ** 2))(w)
  want_w = np.asarray(w - 0.1 * g)
  new, metrics = step(state, batch, jax.random.key(0))  # donates state (and w)
  np.testing.assert_allclose(new.params["params"]["w"], want_w, rtol=1e-6)
  assert float(new.params[OVERWRITE]["s"]) == 4.0 == float(metrics["s"])
  np.testing.assert_allclose(metrics["grad_norm"], np.linalg.norm(np.asarray(g)), rtol=1e-6)


def test_overwrite_metrics_without_a_collection_raises():
  with pytest.raises(ValueError, match="overwrite_with_gradient"):
    make_train_step(_loss, optax.sgd(0.1), overwrite_metrics=lambda s: {})
