"""Numerics telemetry on hand-built operands whose saturation, underflow, scale clamps
and SQNR are known, and through quantized_dot_general_with_state."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from lowprec import numerics
from lowprec.numerics import qdot, quantizer, recipes
from lowprec.numerics import delayed_scaling as ds
from lowprec.numerics import telemetry as tl

DN = (((1,), (0,)), ((), ()))


def _stats(x, spec, q=None):
  x = jnp.asarray(x, jnp.float32)
  if q is None:
    q = quantizer.quantize_dequantize(x, spec)
  return {k: float(v) for k, v in tl.spec_telemetry(x, q, spec)._asdict().items()}


def test_mx_block_saturation_underflow_and_clamped_scales():
  x = np.ones((4, 32), np.float32)
  x[0, 0] = 957.0  # floor rule: 2^(9 - 8) scale, 957/2 = 478.5 > 448 saturates (-> 896)
  x[1, 0] = 448.0  # scale 1; 2^-12 is below half of E4M3's smallest subnormal 2^-9
  x[1, 1] = 2.0 ** -12
  x[2] = np.float32(2.0 ** -140)  # floor(log2) - 8 = -148 < -127: the E8M0 scale clamps
  s = _stats(x, quantizer.QuantSpec("e4m3", scale_rule="floor"))
  assert s["saturated"] == 1 / 128 and s["scale_clamped"] == 1 / 4
  # Flushed: 2^-12 in row 1, and the clamped row's elements (2^-140 / 2^-127 = 2^-13).
  assert s["flushed"] == 33 / 128
  # rceil never saturates.
  assert _stats(x, quantizer.QuantSpec("e4m3", scale_rule="rceil"))["saturated"] == 0.0


def test_sqnr_is_exact_and_infinite_when_lossless():
  x = jnp.array([1.0, 2.0, 3.0, 4.0])
  q = jnp.array([1.0, 2.0, 3.0, 3.0])
  spec = quantizer.QuantSpec("bf16")
  np.testing.assert_allclose(_stats(x, spec, q)["sqnr_db"], 10 * np.log10(30.0), rtol=1e-6)
  assert _stats(x, spec)["sqnr_db"] == np.inf


def test_cast_tensor_and_delayed_scaling():
  x = jnp.array([500.0, 1.0, 2.0 ** -12, 0.0])
  s = _stats(x, quantizer.QuantSpec("e4m3", scaling="none"))
  assert s["saturated"] == 0.25 and s["flushed"] == 0.25 and s["scale_clamped"] == 0.0
  # Tensorwise current scaling maps amax to max: nothing beyond it.
  assert _stats(x * 0.5, quantizer.QuantSpec("e4m3", scaling="tensor"))["saturated"] == 0.0
  state = ds.DelayedScalingState(jnp.zeros(4), jnp.float32(224.0))
  y = jnp.array([3.0, 1.0])  # 3 * 224 = 672 > 448
  t = tl.scaled_telemetry(y, ds.quantize_dequantize(y, state, "e4m3"), state.scale, "e4m3")
  assert float(t.saturated) == 0.5


def test_nvfp4_block_scale_underflow():
  x = np.zeros((1, 32), np.float32)
  x[0, 0] = 2688.0  # S_enc = 1
  x[0, 16:] = 0.005  # S_dec = e4m3(0.005 / 6) = 0 (< 2^-10): TE flushes the block
  s = _stats(x, quantizer.QuantSpec("nvfp4"))
  assert s["scale_clamped"] == 0.5 and s["flushed"] == 0.5
  # torchao raises that block's scale to 2^-6: clamped, and 0.005 * 64 = 0.32 -> 0.5.
  s = _stats(x, quantizer.QuantSpec("nvfp4", convention="torchao"))
  assert s["scale_clamped"] == 0.5 and s["flushed"] == 0.0


def test_quantized_dot_general_reports_every_operand():
  x = jax.random.normal(jax.random.key(0), (64, 64)) * 10
  w = jax.random.normal(jax.random.key(1), (64, 32))
  g = jax.random.normal(jax.random.key(2), (64, 32))
  r = recipes.get("mxfp8")
  state = qdot.init_state(r, telemetry=True)
  assert [k for k, _ in state.telemetry.items()] == ["dgrad_lhs", "dgrad_rhs", "wgrad_lhs",
                                                   "wgrad_rhs"]
  assert state.delayed is None

  def loss(state):
    out, fwd = qdot.quantized_dot_general_with_state(x, w, DN, r, state)
    return jnp.sum(out * g), fwd

  bwd, fwd = jax.grad(loss, has_aux=True)(state)
  spec = lambda gemm, side, axes: getattr(getattr(r, gemm), side).spec(*axes)
  want = {"forward/lhs": (x, spec("forward", "lhs", (-1, -2))),
          "forward/rhs": (w, spec("forward", "rhs", (-2, -1))),
          "dgrad/lhs": (g, spec("dgrad", "lhs", (-1, -2))),
          "dgrad/rhs": (w, spec("dgrad", "rhs", (-1, -2))),
          "wgrad/lhs": (x, spec("wgrad", "lhs", (-2, -1))),
          "wgrad/rhs": (g, spec("wgrad", "rhs", (-2, -1)))}
  got = {**fwd, **{k.replace("_", "/"): t for k, t in bwd.telemetry.items()}}
  assert sorted(got) == sorted(want)
  for slot, (a, sp) in want.items():
    a = a[None]  # qdot's canonical (batch, rows, cols) operands
    chex.assert_trees_all_close(got[slot], tl.spec_telemetry(
        a, quantizer.quantize_dequantize(a, sp), sp), custom_message=slot)
  assert all(float(t.sqnr_db) > 25 for t in got.values())
  # Without telemetry in the state nothing is reported.
  assert qdot.quantized_dot_general_with_state(x, w, DN, r, qdot.init_state(r))[1] == {}
  out = numerics.qdot.quantized_dot_general(x, w, DN, r)
  chex.assert_trees_all_equal(
      qdot.quantized_dot_general_with_state(x, w, DN, r, state)[0], out)
