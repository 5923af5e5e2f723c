"""numerics.optim.handoff: before == first, after == fresh second (+transfer), one compile."""

import chex
import jax
import jax.numpy as jnp
import optax
import pytest

from lowprec.numerics import optim

SWITCH = 4
TARGET = {"conv": {"kernel": jax.random.normal(jax.random.PRNGKey(0), (3, 3, 2, 4))},
          "dense": {"kernel": jax.random.normal(jax.random.PRNGKey(1), (4, 6)),
                    "bias": jnp.linspace(-1.0, 1.0, 6)}}
PARAMS = jax.tree.map(jnp.zeros_like, TARGET)


def loss(p):
  return sum(jnp.sum(jnp.cosh(a - b)) for a, b in zip(jax.tree.leaves(p),
                                                      jax.tree.leaves(TARGET)))


def sgd():
  return optax.chain(optax.add_decayed_weights(5e-4), optax.trace(0.9, nesterov=True),
                     optax.scale_by_learning_rate(optim.warm_restarts_schedule(0.1, SWITCH)))


def refiner():
  lr = optim.cosine_schedule(0.02, 10, warmup_steps=2)  # its count starts at 0 at the switch
  return optim.sam(optim.muon(lr, weight_decay=0.1, ns_dtype="fp32",
                              label_fn=optim.all_matrices_labels),
                   optax.linear_schedule(0.0, 0.05, 3))


def _trajectory(tx, params, state, steps):
  step = jax.jit(lambda p, s: tx.update(jax.grad(loss)(p), s, p, grad_fn=jax.grad(loss)))
  out = []
  for _ in range(steps):
    u, state = step(params, state)
    params = optax.apply_updates(params, u)
    out.append(params)
  return out, state


def test_before_switch_equals_first_and_after_equals_fresh_second():
  tx = optim.handoff(sgd(), refiner(), SWITCH, transfer="momentum")
  traj, _ = _trajectory(tx, PARAMS, tx.init(PARAMS), SWITCH + 5)
  first_traj, first_state = _trajectory(optax.with_extra_args_support(sgd()), PARAMS,
                                        sgd().init(PARAMS), SWITCH)
  for a, b in zip(traj[:SWITCH], first_traj):
    chex.assert_trees_all_close(a, b, atol=1e-7)
  # a fresh second started at the switch point, with SGD's buffer copied in
  second = refiner()
  fresh = optim.momentum_transfer(first_state, second.init(first_traj[-1]), first_traj[-1])
  second_traj, _ = _trajectory(second, first_traj[-1], fresh, 5)
  for a, b in zip(traj[SWITCH:], second_traj):
    chex.assert_trees_all_close(a, b, atol=1e-6)
  # the transfer matters: without it the refiner's trajectory differs
  cold, _ = _trajectory(second, first_traj[-1], second.init(first_traj[-1]), 5)
  assert float(optax.tree.norm(jax.tree.map(jnp.subtract, cold[0], second_traj[0]))) > 1e-4


def test_momentum_transfer_copies_sgd_buffer_into_muon_and_fallback():
  _, first_state = _trajectory(optax.with_extra_args_support(sgd()), PARAMS,
                               sgd().init(PARAMS), 2)
  trace = first_state[1].trace
  moved = optim.momentum_transfer(first_state, refiner().init(PARAMS), PARAMS)
  parts = moved.inner_state.inner_states
  muon_buf = parts["muon"].inner_state[0].momentum
  fb_buf = parts["fallback"].inner_state[0].trace
  chex.assert_trees_all_equal(muon_buf["conv"]["kernel"], trace["conv"]["kernel"])
  chex.assert_trees_all_equal(muon_buf["dense"]["kernel"], trace["dense"]["kernel"])
  chex.assert_trees_all_equal(fb_buf["dense"]["bias"], trace["dense"]["bias"])
  assert isinstance(fb_buf["dense"]["kernel"], optax.MaskedNode)
  assert float(jnp.abs(trace["dense"]["bias"]).sum()) > 0
  with pytest.raises(ValueError, match="TraceState"):
    optim.momentum_transfer(optax.adam(0.1).init(PARAMS), refiner().init(PARAMS), PARAMS)


def test_compiles_once_and_state_shapes_stable():
  tx = optim.handoff(sgd(), refiner(), SWITCH, transfer="momentum")
  traces = []

  def step(p, s):
    traces.append(1)  # runs only when jax traces
    u, s = tx.update(jax.grad(loss)(p), s, p, grad_fn=jax.grad(loss))
    return optax.apply_updates(p, u), s

  step = jax.jit(step)
  params, state = PARAMS, tx.init(PARAMS)
  shapes = jax.tree.map(lambda x: (x.shape, x.dtype), state)
  for i in range(SWITCH + 3):
    params, state = step(params, state)
    assert jax.tree.map(lambda x: (x.shape, x.dtype), state) == shapes
    assert bool(optim.in_second_phase(state, SWITCH)) == (i + 1 >= SWITCH)
  assert len(traces) == 1
  assert int(state.count) == SWITCH + 3
  assert int(state.second_state.count) == 3  # second's own count started at the switch


def test_inject_hyperparams_and_no_transfer():
  tx = optax.inject_hyperparams(optim.handoff, static_args=("transfer",))(
      first=optax.sgd(0.1), second=optax.adam(0.01), switch_step=2, transfer="none")
  traj, state = _trajectory(tx, PARAMS, tx.init(PARAMS), 4)
  ref_first, _ = _trajectory(optax.with_extra_args_support(optax.sgd(0.1)), PARAMS,
                             optax.sgd(0.1).init(PARAMS), 2)
  ref_second, _ = _trajectory(optax.with_extra_args_support(optax.adam(0.01)), ref_first[-1],
                              optax.adam(0.01).init(PARAMS), 2)
  chex.assert_trees_all_close(traj[1], ref_first[-1], atol=1e-7)
  chex.assert_trees_all_close(traj[3], ref_second[-1], atol=1e-6)
  assert int(state.hyperparams["switch_step"]) == 2


def test_errors():
  with pytest.raises(ValueError, match="transfer"):
    optim.handoff(optax.sgd(0.1), optax.sgd(0.1), 3, transfer="geometry")
  with pytest.raises(ValueError, match="switch_step"):
    optim.handoff(optax.sgd(0.1), optax.sgd(0.1), -1)
  bad = optim.handoff(optax.sgd(0.1), optax.sgd(0.1, momentum=0.9), 0,
                      transfer=lambda a, b, p: (b, b))
  with pytest.raises(ValueError, match="structure"):
    bad.update(PARAMS, bad.init(PARAMS), PARAMS)
