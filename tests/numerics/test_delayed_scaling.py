"""Delayed scaling against a hand-worked amax history (Transformer Engine's algorithm)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec.numerics import delayed_scaling as ds
from lowprec.numerics import operand_quant, qdot, recipes

DN = (((1,), (0,)), ((), ()))
E4M3_MAX = 448.0


def _run(amaxes, algo, margin=0, history_len=3):
  state = ds.init_state(history_len)
  out = []
  for a in amaxes:
    state = ds.next_state(state, jnp.float32(a), "e4m3", amax_compute_algo=algo,
                          margin=margin)
    out.append((np.asarray(state.amax_history).tolist(), float(state.scale)))
  return out


def test_hand_worked_history_max():
  # L = 3: the window holds this step's amax and the two before it. Worked by hand:
  # step 0 writes 2 -> [2,0,0], max 2, scale 448/2 = 224, rolled to [0,0,2]; step 1
  # writes 8 -> [8,0,2], max 8 -> 56, rolled [0,2,8]; step 2: [1,2,8] -> 56, [0,8,1];
  # step 3: [0.5,8,1] -> 56, [0,1,0.5]; step 4 (amax 0): [0,1,0.5] -> 448, [0,0.5,0].
  assert _run([2, 8, 1, 0.5, 0], "max") == [
      ([0, 0, 2], 224.0), ([0, 2, 8], 56.0), ([0, 8, 1], 56.0), ([0, 1, 0.5], 56.0),
      ([0, 0.5, 0], 448.0)]


def test_hand_worked_history_most_recent_and_margin():
  # most_recent: the scale follows this step's amax; an amax of 0 keeps the old scale.
  assert [s for _, s in _run([2, 8, 1, 0.5, 0], "most_recent")] == [
      224.0, 56.0, 448.0, 896.0, 896.0]
  # margin m divides the scale by 2^m.
  assert [s for _, s in _run([2, 8], "max", margin=1)] == [112.0, 28.0]
  # A non-finite amax keeps the previous scale (and stays in the window).
  assert [s for _, s in _run([2, np.inf, 1], "max")] == [224.0, 224.0, 224.0]


def test_quantize_uses_the_previous_scale_and_saturates():
  state = ds.DelayedScalingState(jnp.zeros(3), jnp.float32(224.0))
  x = jnp.array([1.0, 3.0, -0.0078125])
  # 1 * 224 = 224 (exact in E4M3); 3 * 224 = 672 saturates to 448 -> 2.0; -1/128 * 224
  # = -1.75 (exact).
  np.testing.assert_array_equal(ds.quantize_dequantize(x, state, "e4m3"),
                                [1.0, 2.0, -0.0078125])
  with pytest.raises(ValueError, match="history_len"):
    ds.init_state(0)


def _one_operand_recipe(side_gemm="forward", history_len=3):
  op = recipes.DelayedQuant("e4m3", amax_history_len=history_len)
  gemm = recipes.GemmRecipe(lhs=op)
  return recipes.Recipe(name="delayed_x", compute_dtype="fp32", **{side_gemm: gemm})


def test_qdot_carries_the_state_through_the_gradient():
  r = _one_operand_recipe()
  state = qdot.init_state(r)
  assert [k for k, _ in state.delayed.items()] == ["forward_lhs"] and state.telemetry is None
  w = jnp.eye(4)

  def loss(state, x):
    out, tel = qdot.quantized_dot_general_with_state(x, w, DN, r, state)
    assert tel == {}
    return jnp.sum(out), out

  history, outs = [], []
  for a in (2.0, 8.0, 4.0):
    x = jnp.full((2, 4), a)
    state, out = jax.grad(loss, has_aux=True)(state, x)
    outs.append(float(out[0, 0]))
    history.append(float(state.delayed.forward_lhs.scale))
  assert history == [224.0, 56.0, 56.0]
  # Step 0 used scale 1 (2 exact), step 1 scale 224 (8 * 224 saturates: 448/224 = 2),
  # step 2 scale 56 (4 * 56 = 224 exact).
  assert outs == [2.0, 2.0, 4.0]


def test_backward_operand_gets_its_amax_from_the_backward_pass():
  r = _one_operand_recipe("dgrad")
  state = qdot.init_state(r)
  x, w = jnp.ones((2, 4)), jnp.ones((4, 3))
  g = jnp.full((2, 3), 7.0)

  def loss(state):
    out, _ = qdot.quantized_dot_general_with_state(x, w, DN, r, state)
    return jnp.sum(out * g)

  new = jax.grad(loss)(state).delayed.dgrad_lhs
  np.testing.assert_array_equal(new.amax_history, [0.0, 0.0, 7.0])
  assert float(new.scale) == E4M3_MAX / 7.0


def test_delayed_recipe_needs_its_state():
  x = jnp.ones((4, 4))
  with pytest.raises(ValueError, match="quantized_dot_general_with_state"):
    qdot.quantized_dot_general(x, x, DN, "fp8_delayed")
  with pytest.raises(ValueError, match="init_state"):
    qdot.quantized_dot_general_with_state(x, x, DN, "fp8_delayed", qdot.State())
  s = qdot.init_state("fp8_delayed")
  assert [k for k, _ in s.delayed.items()] == list(qdot.OperandSlots._fields)
  assert s.delayed.forward_lhs.amax_history.shape == (1024,)
  with pytest.raises(ValueError, match="amax_history_len is a delayed-scaling option"):
    operand_quant.replace(recipes.MXQuant("e4m3"), amax_history_len=16)
  chex.assert_trees_all_equal_structs(
      jax.grad(lambda s: jnp.sum(qdot.quantized_dot_general_with_state(
          x, x, DN, "fp8_delayed", s)[0]))(s), s)


def test_the_dict_state_of_earlier_releases_is_refused_naming_what_it_got():
  """No compatibility form before a first release (docs/changelog.md): the dict state
  ``{"delayed": {"forward/lhs": ...}}`` is refused with the keys it had."""
  r = recipes.get("fp8_delayed")
  typed = qdot.init_state(r, telemetry=True)
  legacy = {part: {k.replace("_", "/"): v for k, v in getattr(typed, part).items()}
            for part in ("delayed", "telemetry")}
  x = jnp.ones((8, 16))
  with pytest.raises(ValueError, match=r"qdot.State from init_state, got a dict with keys "
                     r"\['delayed', 'telemetry'\]"):
    qdot.quantized_dot_general_with_state(x, jnp.ones((16, 4)), DN, r, legacy)


def test_a_state_that_is_not_one_raises_naming_what_it_got():
  x = jnp.ones((4, 4))
  with pytest.raises(ValueError, match=r"keys \['delayed', 'extra'\]"):
    qdot.quantized_dot_general_with_state(x, x, DN, "fp8_delayed",
                                          {"delayed": {}, "extra": {}})
  with pytest.raises(ValueError, match="got list"):
    qdot.quantized_dot_general_with_state(x, x, DN, "fp8_delayed", [])
