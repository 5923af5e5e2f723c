"""numerics.optim.sam: the two-pass step, rho=0 == inner, zero gradients, schedules."""

import chex
import jax
import jax.numpy as jnp
import optax
import pytest

from lowprec.numerics import optim

TARGET = {"w": jnp.array([[1.0, -2.0], [0.5, 3.0]]), "b": jnp.array([0.3, -0.7])}


def loss(p):
  # non-quadratic, so the perturbed gradient differs from the plain one
  return sum(jnp.sum(jnp.cosh(p[k] - TARGET[k])) for k in p)


PARAMS = {"w": jnp.zeros((2, 2)), "b": jnp.zeros((2,))}


def _run(tx, steps=5, params=PARAMS):
  state = tx.init(params)
  step = jax.jit(lambda p, s: tx.update(jax.grad(loss)(p), s, p, grad_fn=jax.grad(loss)))
  for _ in range(steps):
    u, state = step(params, state)
    params = optax.apply_updates(params, u)
  return params, state


def test_rho_zero_equals_inner():
  inner = optax.sgd(0.1, momentum=0.9)
  ours, _ = _run(optim.sam(inner, rho=0.0))
  ref = PARAMS
  s = inner.init(ref)
  for _ in range(5):
    u, s = inner.update(jax.grad(loss)(ref), s, ref)
    ref = optax.apply_updates(ref, u)
  chex.assert_trees_all_close(ours, ref, atol=1e-7)


def test_one_step_uses_gradient_at_perturbed_point():
  rho = 0.3
  g = jax.grad(loss)(PARAMS)
  norm = optax.tree.norm(g)
  perturbed = jax.tree.map(lambda p, x: p + rho * x / norm, PARAMS, g)
  expected = jax.tree.map(lambda x: -0.1 * x, jax.grad(loss)(perturbed))
  tx = optim.sam(optax.sgd(0.1), rho)
  u, state = tx.update(g, tx.init(PARAMS), PARAMS, grad_fn=jax.grad(loss))
  chex.assert_trees_all_close(u, expected, atol=1e-6)
  assert int(state.count) == 1
  # and it is not the plain step
  assert float(optax.tree.norm(jax.tree.map(lambda a, b: a + 0.1 * b, u, g))) > 1e-3


def test_matches_optax_contrib_sam_opaque():
  rho = 0.2
  ref_tx = optax.contrib.sam(optax.sgd(0.05), optax.chain(optax.contrib.normalize(),
                                                          optax.sgd(rho)), opaque_mode=True)
  ours_tx = optim.sam(optax.sgd(0.05), rho)
  p_ref = p_ours = PARAMS
  s_ref, s_ours = ref_tx.init(PARAMS), ours_tx.init(PARAMS)
  for _ in range(3):
    u, s_ref = ref_tx.update(jax.grad(loss)(p_ref), s_ref, p_ref,
                             grad_fn=lambda p, _: jax.grad(loss)(p))
    p_ref = optax.apply_updates(p_ref, u)
    u, s_ours = ours_tx.update(jax.grad(loss)(p_ours), s_ours, p_ours,
                               grad_fn=jax.grad(loss))
    p_ours = optax.apply_updates(p_ours, u)
  chex.assert_trees_all_close(p_ours, p_ref, atol=1e-6)


def test_all_zero_gradient_is_safe():
  zeros = jax.tree.map(jnp.zeros_like, PARAMS)
  tx = optim.sam(optax.sgd(0.1, momentum=0.9), 0.05)
  u, _ = tx.update(zeros, tx.init(PARAMS), PARAMS, grad_fn=lambda p: zeros)
  chex.assert_tree_all_finite(u)
  chex.assert_trees_all_equal(u, zeros)
  chex.assert_tree_all_finite(optim.perturbation(zeros, jnp.float32(0.05)))


def test_rho_schedule_ramps_from_zero():
  seen = []
  ramp = optax.linear_schedule(0.0, 0.5, 4)
  tx = optim.sam(optax.sgd(0.0), ramp)
  state = tx.init(PARAMS)
  g = jax.grad(loss)(PARAMS)

  def grad_fn(p):  # records how far SAM moved the point: ||e|| == rho_t
    seen.append(float(optax.tree.norm(jax.tree.map(jnp.subtract, p, PARAMS))))
    return g

  for _ in range(6):
    _, state = tx.update(g, state, PARAMS, grad_fn=grad_fn)
  assert seen == pytest.approx([0.0, 0.125, 0.25, 0.375, 0.5, 0.5], abs=1e-6)


def test_state_stable_jit_and_inject_hyperparams():
  tx = optax.inject_hyperparams(optim.sam)(inner=optax.adam(0.05), rho=0.1)
  params, state = _run(tx, steps=1)
  shapes = jax.tree.map(lambda x: (x.shape, x.dtype), state)
  params, state = _run(tx, steps=20)
  assert jax.tree.map(lambda x: (x.shape, x.dtype), state) == shapes
  assert float(loss(params)) < float(loss(PARAMS))
  assert float(state.hyperparams["rho"]) == pytest.approx(0.1)


def test_active_chooses_the_steps_that_take_the_second_pass():
  """Inactive steps are the inner step on the plain gradient; active ones are SAM's."""
  sam_tx, plain = optim.sam(optax.sgd(0.1), 0.3), optax.sgd(0.1)
  late = optim.sam(optax.sgd(0.1), 0.3, active=lambda c: c >= 2)
  params, late_params = PARAMS, PARAMS
  late_state, plain_state, sam_state = late.init(PARAMS), plain.init(PARAMS), \
      sam_tx.init(PARAMS)
  for i in range(4):
    g = jax.grad(loss)(params)
    if i < 2:
      u, plain_state = plain.update(g, plain_state, params)
    else:
      u, sam_state = sam_tx.update(g, sam_state, params, grad_fn=jax.grad(loss))
    params = optax.apply_updates(params, u)
  late_params, late_state = _run(late, steps=4)
  chex.assert_trees_all_close(late_params, params, rtol=1e-6)
  assert int(late_state.count) == 4
  never, _ = _run(optim.sam(optax.sgd(0.1), 0.3, active=lambda c: False), steps=3)
  chex.assert_trees_all_close(never, _run(optim.sam(optax.sgd(0.1), 0.0), steps=3)[0],
                              rtol=1e-6)
  with pytest.raises(TypeError, match="active"):
    optim.sam(optax.sgd(0.1), 0.1, active=True)


def test_errors():
  tx = optim.sam(optax.sgd(0.1), 0.05)
  g = jax.grad(loss)(PARAMS)
  with pytest.raises(ValueError, match="grad_fn"):
    tx.update(g, tx.init(PARAMS), PARAMS)
  with pytest.raises(ValueError, match="params"):
    tx.update(g, tx.init(PARAMS), None, grad_fn=jax.grad(loss))
  with pytest.raises(ValueError, match="rho"):
    optim.sam(optax.sgd(0.1), -1.0)
  with pytest.raises(TypeError):
    optim.sam(lambda x: x, 0.1)
