"""numerics.export: master -> served export (nearest, stochastic, error feedback).

Also the metrics and the lag tracker. References are independent: ml_dtypes / NumPy
casts, NumPy float32 re-implementations of error feedback, float64 grid spacings and
hand-worked values.
"""

import chex
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from lowprec.numerics import export as ex
from lowprec.numerics import formats
from lowprec.numerics.quantizer import QuantSpec, quantize_dequantize
from lowprec.numerics.rl import sampler_copy
from lowprec.numerics.rounding import Nearest, Stochastic, TowardZero

BF16 = ex.ExportSpec("bf16")
MXFP8 = QuantSpec("e4m3", block_shape=32, axis=0)


def bits32(x):
  return np.asarray(x).astype(np.float32).view(np.uint32)


def nearest(master, spec=BF16):
  return ex.export(master, spec, ex.init_export_state(master, spec))[0]


def random_master(seed, shape, lo=-20, hi=10):
  """Log-uniform magnitudes 2^lo..2^hi with random signs, plus a few f32 subnormals."""
  rng = np.random.default_rng(seed)
  x = np.exp2(rng.uniform(lo, hi, size=shape)) * rng.choice([-1.0, 1.0], size=shape)
  x = x.astype(np.float32).reshape(-1)
  x[:4] = np.array([1e-39, -3e-40, 0.0, -0.0], np.float32)
  return x.reshape(shape)


# --------------------------------------------------------------------------- spec


def test_spec_is_hashable_and_a_static_jit_argument():
  a = ex.ExportSpec("bf16", ex.ErrorFeedback())
  assert a == ex.ExportSpec("bf16", ex.ErrorFeedback()) and hash(a) == hash(
      ex.ExportSpec("bf16", ex.ErrorFeedback()))
  assert hash(ex.ExportSpec(MXFP8)) == hash(ex.ExportSpec(MXFP8))
  assert ex.ExportSpec(formats.get("fp16")).target == "fp16"
  f = jax.jit(lambda x, spec: nearest(x, spec), static_argnames="spec")
  np.testing.assert_array_equal(f(jnp.ones(3), ex.ExportSpec("fp16")), np.ones(3))


@pytest.mark.parametrize("target,dtype", [
    ("bf16", jnp.bfloat16), ("fp16", jnp.float16), ("e4m3", jnp.float8_e4m3fn),
    ("e5m2", jnp.float8_e5m2), ("e2m3", jnp.float32), ("e2m1", jnp.float32),
    ("int8", jnp.float32), (MXFP8, jnp.float32)])
def test_served_dtype(target, dtype):
  spec = ex.ExportSpec(target)
  assert spec.served_dtype == jnp.dtype(dtype)
  assert nearest({"w": jnp.ones((32, 2))}, spec)["w"].dtype == jnp.dtype(dtype)


def test_bad_specs_raise():
  with pytest.raises(ValueError, match="nearest, stochastic, error_feedback"):
    ex.parse_rounding("toward_zero")
  with pytest.raises(ValueError, match="ErrorFeedback"):
    ex.ExportSpec("bf16", TowardZero())
  with pytest.raises(TypeError, match="parse_rounding"):
    ex.ExportSpec("bf16", "error_feedback")
  with pytest.raises(ValueError, match="known formats: .*bf16"):
    ex.ExportSpec("bfloat17")
  with pytest.raises(ValueError, match="QuantSpec"):
    ex.ExportSpec("nvfp4")
  with pytest.raises(ValueError, match="scale format"):
    ex.ExportSpec("e8m0")
  with pytest.raises(ValueError, match="rng"):
    ex.ExportSpec("bf16", Stochastic(rng="mersenne"))
  with pytest.raises(TypeError, match="target"):
    ex.ExportSpec(16)
  with pytest.raises(ValueError, match="conflicts"):
    ex.ExportSpec(QuantSpec("e4m3", block_shape=32, rounding=Stochastic()), Nearest())


# ------------------------------------------------------------------------ nearest


@pytest.mark.parametrize("target,ref_dtype,lo,hi", [
    ("bf16", ml_dtypes.bfloat16, -30, 30), ("fp16", np.float16, -26, 15),
    ("e4m3", ml_dtypes.float8_e4m3fn, -12, 8)])
def test_nearest_matches_numpy_cast_bit_for_bit(target, ref_dtype, lo, hi):
  x = random_master(0, (64, 48), lo, hi)
  master = {"w": jnp.asarray(x), "b": jnp.asarray(x[0, :7]), "n": jnp.arange(3)}
  served = nearest(master, ex.ExportSpec(target))
  for name, ref in (("w", x), ("b", x[0, :7])):
    got = np.asarray(served[name])
    assert got.dtype == np.dtype(ref_dtype)
    chex.assert_trees_all_equal(got.view(np.uint8),
                                ref.astype(ref_dtype).view(np.uint8))
  np.testing.assert_array_equal(served["n"], np.arange(3))


def test_nearest_mxfp8_equals_quantize_dequantize():
  x = jnp.asarray(random_master(1, (64, 16), -8, 4))
  served = nearest({"k": x}, ex.ExportSpec(MXFP8))["k"]
  np.testing.assert_array_equal(bits32(served), bits32(quantize_dequantize(x, MXFP8)))


def test_non_float_leaves_pass_through_and_structure_is_kept():
  master = {"layers": [jnp.float32(0.1), (jnp.ones(2), jnp.int32(7))],
            "mask": jnp.array([True, False]), "count": jnp.arange(3, dtype=jnp.int8)}
  for spec in (BF16, ex.ExportSpec("bf16", ex.ErrorFeedback()),
               ex.ExportSpec("bf16", Stochastic())):
    served, _ = ex.export(master, spec, ex.init_export_state(master, spec),
                          key=jax.random.key(0))
    chex.assert_trees_all_equal_structs(served, master)
    np.testing.assert_array_equal(served["mask"], [True, False])
    assert served["count"].dtype == jnp.int8 and served["layers"][1][1] == 7
    assert served["layers"][0].dtype == jnp.bfloat16


def test_bad_inputs_raise():
  with pytest.raises(TypeError, match="float32"):
    ex.export({"w": jnp.ones(2, jnp.float16)}, BF16, ex.ExportState(None, jnp.int32(0)))
  with pytest.raises(TypeError, match="float32"):
    ex.init_export_state({"w": jnp.ones(2, jnp.bfloat16)},
                         ex.ExportSpec("bf16", ex.ErrorFeedback()))
  sr = ex.ExportSpec("bf16", Stochastic())
  with pytest.raises(ValueError, match="PRNG key"):
    ex.export(jnp.ones(2), sr, ex.init_export_state(jnp.ones(2), sr))
  ef = ex.ExportSpec("bf16", ex.ErrorFeedback())
  with pytest.raises(ValueError, match="init_export_state"):
    ex.export(jnp.ones(2), ef, ex.init_export_state(jnp.ones(2), BF16))
  with pytest.raises(ValueError, match="structure"):
    ex.export({"a": jnp.ones(2)}, ef, ex.init_export_state({"b": jnp.ones(2)}, ef))
  with pytest.raises(ValueError, match="residual"):
    ex.export(jnp.ones(2), ef, ex.init_export_state(jnp.ones(3), ef))
  with pytest.raises(ValueError, match="stateful"):
    ex.make_export(sr)
  with pytest.raises(ValueError, match="leaf 'w'"):  # 5 rows: not a multiple of 32
    nearest({"w": jnp.ones((5, 4))}, ex.ExportSpec(MXFP8))


def test_make_export_drives_the_sampler_copy():
  export_fn = ex.make_export(BF16)
  params = {"w": jnp.asarray(random_master(2, (8, 8), -4, 2)), "n": jnp.int32(1)}
  copy = sampler_copy.initial_copy(params, export_fn)
  step = jax.jit(lambda c, p, s: sampler_copy.maybe_refresh(c, p, s, 2, export_fn))
  params = {"w": params["w"] * 1.5, "n": params["n"]}
  copy = step(copy, params, 2)
  ref = sampler_copy.cast_export(jnp.bfloat16)(params)
  chex.assert_trees_all_equal(copy.params, ref)
  assert int(copy.syncs) == 2


# --------------------------------------------------------------------- stochastic


@pytest.mark.parametrize("target,man_bits", [("bf16", 7), ("e4m3", 3)])
def test_stochastic_is_unbiased(target, man_bits):
  # x lies 19661/65536 (about 0.3) of an ulp above 1.0; every discarded bit is
  # randomized, so E[SR(x)] = x exactly. Each served element is a Bernoulli draw of
  # {1, 1 + ulp}: over N draws the mean has std ulp * sqrt(p (1 - p) / N). A 6-sigma
  # bound fails falsely with probability about 2e-9.
  ulp = 2.0 ** -man_bits
  p = 19661 / 65536
  x = np.float32(1.0 + p * ulp)
  assert float(x) == 1.0 + p * ulp  # exact in float32
  spec = ex.ExportSpec(target, Stochastic())
  master = {"w": jnp.full((128, 128), x)}
  state = ex.init_export_state(master, spec)
  draws = []
  for _ in range(2):  # two export steps: independent bits
    served, state = ex.export(master, spec, state, key=jax.random.key(3))
    draws.append(np.asarray(served["w"]).astype(np.float64))
  draws = np.concatenate(draws).reshape(-1)
  assert set(np.unique(draws)) == {1.0, 1.0 + ulp}
  sigma = ulp * np.sqrt(p * (1 - p) / draws.size)
  assert abs(draws.mean() - float(x)) < 6 * sigma


def test_stochastic_differs_between_steps_and_reproduces():
  spec = ex.ExportSpec("bf16", Stochastic())
  master = {"a": jnp.asarray(random_master(4, (32, 32), -6, 2)),
            "b": jnp.asarray(random_master(4, (32, 32), -6, 2))}
  s0 = ex.init_export_state(master, spec)
  key = jax.random.key(5)
  out1, s1 = ex.export(master, spec, s0, key=key)
  out2, s2 = ex.export(master, spec, s1, key=key)
  again, _ = ex.export(master, spec, s0, key=key)
  other, _ = ex.export(master, spec, s0, key=jax.random.key(6))
  assert int(s1.step) == 1 and int(s2.step) == 2
  chex.assert_trees_all_equal(out1, again)  # same key and step: same bits
  for o in (out2, other):
    assert not np.array_equal(bits32(o["a"]), bits32(out1["a"]))
  # equal leaves draw different bits (the key is folded with the leaf index)
  assert not np.array_equal(bits32(out1["a"]), bits32(out1["b"]))
  # each result is one of the two bf16 neighbours: within one spacing of the master
  m = np.asarray(master["a"]).astype(np.float64)
  with np.errstate(divide="ignore"):
    spacing = np.exp2(np.maximum(np.floor(np.log2(np.abs(m))), -126) - 7)
  assert np.all(np.abs(np.asarray(out1["a"]).astype(np.float64) - m) < spacing)


# ----------------------------------------------------------------- error feedback


def ef_reference(masters):
  """NumPy float32 error feedback to bf16: (served [T, n], residuals [T, n])."""
  r = np.zeros_like(masters[0])
  served, res = [], []
  for w in masters:
    t = (w + r).astype(np.float32)
    q = t.astype(ml_dtypes.bfloat16).astype(np.float32)
    r = (t - q).astype(np.float32)
    served.append(q)
    res.append(r)
  return np.stack(served), np.stack(res)


def run_exports(masters, spec):
  state = ex.init_export_state({"w": jnp.asarray(masters[0])}, spec)
  served, residuals = [], []
  for w in masters:
    out, state = ex.export({"w": jnp.asarray(w)}, spec, state)
    served.append(np.asarray(out["w"]).astype(np.float32))
    if state.residual is not None:
      residuals.append(np.asarray(state.residual["w"]))
  return np.stack(served), (np.stack(residuals) if residuals else None), state


def bf16_ulp(x):
  """float64 bf16 spacing above |x| (normal range)."""
  return np.exp2(np.floor(np.log2(np.abs(x))) - 7)


def test_error_feedback_tracks_tiny_updates_nearest_does_not():
  # Four weights, each with a constant tiny update per step, 200 steps. The total
  # drift of each (<= 0.2% of |w|) stays below half a bf16 ulp, so RNE never moves.
  steps = 200
  w0 = np.array([1.0, -0.75, 0.02, 3.0], np.float32)
  dw = np.array([1e-5, -5e-6, 1e-7, 2e-5], np.float32)
  masters = [w0]
  for _ in range(steps - 1):
    masters.append((masters[-1] + dw).astype(np.float32))
  masters = np.stack(masters)
  near, _, _ = run_exports(masters, BF16)
  ef, res, state = run_exports(masters, ex.ExportSpec("bf16", ex.ErrorFeedback()))
  np.testing.assert_array_equal(near, np.broadcast_to(
      w0.astype(ml_dtypes.bfloat16).astype(np.float32), near.shape))
  ref_served, ref_res = ef_reference(masters)
  np.testing.assert_array_equal(bits32(ef), bits32(ref_served))
  np.testing.assert_array_equal(bits32(res), bits32(ref_res))
  assert int(state.step) == steps
  ulp = bf16_ulp(masters[-1])
  assert np.all(np.abs(res) <= ulp / 2)  # residual within half an ulp
  gap = np.abs(np.cumsum(ef.astype(np.float64), 0) - np.cumsum(masters, 0, np.float64))
  assert np.all(gap <= ulp)  # running sums agree within one ulp at every step
  assert len(np.unique(ef[:, 0])) > 1  # the served copy does move
  mean_err_ef = np.abs(ef.mean(0, dtype=np.float64) - masters.mean(0, dtype=np.float64))
  mean_err_near = np.abs(near.mean(0, dtype=np.float64) - masters.mean(0, np.float64))
  bound = ulp / 2 / steps  # |mean(served) - mean(master)| = |r_T| / T for EF
  assert np.all(mean_err_ef <= bound)
  assert np.all(mean_err_near > 10 * bound)  # nearest lags by far more


def test_nearest_moves_only_at_the_hand_computed_midpoint_crossings():
  # w_t = 1 + t * 1e-4 accumulated in float32. In [1, 2) float32's spacing is 2^-23 and
  # 1e-4 = 838.86 * 2^-23, so every step adds exactly 839 * 2^-23. bf16 at 1 has
  # ulp 2^-7 = 65536 * 2^-23; RNE moves up one ulp when w passes the midpoints
  # 1 + (2k + 1) * 2^-8, i.e. 839 t > (2k + 1) * 32768: t = 40, 118, 196.
  w = [np.float32(1.0)]
  for _ in range(200):
    w.append(np.float32(w[-1] + np.float32(1e-4)))
  w = np.array(w, np.float32)
  assert np.all(np.diff(w.astype(np.float64)) == 839 * 2.0 ** -23)
  near, _, _ = run_exports(w[:, None], BF16)
  changes = np.flatnonzero(np.diff(near[:, 0])) + 1
  np.testing.assert_array_equal(changes, [40, 118, 196])
  np.testing.assert_array_equal(near[[39, 40, 118, 196], 0],
                                [1.0, 1 + 2 ** -7, 1 + 2 ** -6, 1 + 3 * 2 ** -7])


def test_error_feedback_state_is_a_checkpointable_pytree():
  spec = ex.ExportSpec("bf16", ex.ErrorFeedback())
  master = {"w": jnp.full((3,), 1.001, jnp.float32), "n": jnp.int32(2)}
  state = ex.init_export_state(master, spec)
  assert isinstance(state, ex.ExportState)
  leaves = jax.tree.leaves(state)
  assert all(isinstance(x, jax.Array) for x in leaves) and len(leaves) == 2
  assert state.residual["n"] is None and state.residual["w"].dtype == jnp.float32
  assert state.step.dtype == jnp.int32 and state.step.shape == ()
  assert len(jax.tree.leaves(ex.init_export_state(master, BF16))) == 1  # step only
  _, state = ex.export(master, spec, state)
  flat, treedef = jax.tree.flatten(state)  # round trip through flatten / unflatten
  state2 = jax.tree.unflatten(treedef, [np.asarray(x) for x in flat])
  chex.assert_trees_all_equal(ex.export(master, spec, state)[1],
                              ex.export(master, spec, state2)[1])


def test_error_feedback_state_round_trips_through_orbax(tmp_path):
  ocp = pytest.importorskip("orbax.checkpoint")
  spec = ex.ExportSpec("bf16", ex.ErrorFeedback())
  master = {"w": jnp.linspace(0.5, 2.0, 8, dtype=jnp.float32), "n": jnp.int32(2)}
  _, state = ex.export(master, spec, ex.init_export_state(master, spec))
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(tmp_path / "export_state", state)
  ckpt.wait_until_finished()
  restored = ckpt.restore(tmp_path / "export_state", state)
  chex.assert_trees_all_equal(ex.ExportState(*restored), state)
  chex.assert_trees_all_equal(ex.export(master, spec, ex.ExportState(*restored)),
                              ex.export(master, spec, state))


def test_error_feedback_with_mxfp8_runs_and_conserves_the_sum():
  spec = ex.ExportSpec(MXFP8, ex.ErrorFeedback())
  w = jnp.asarray(random_master(7, (64, 16), -6, 0))
  master = {"k": w}
  state = ex.init_export_state(master, spec)
  total_served = np.zeros((64, 16))
  total_master = np.zeros((64, 16))
  first = None
  for t in range(6):
    master = {"k": w + t * 1e-4}
    served, state = ex.export(master, spec, state)
    if first is None:  # zero residual: the first export is the nearest one
      first = served["k"]
      np.testing.assert_array_equal(bits32(first),
                                    bits32(quantize_dequantize(master["k"], MXFP8)))
    assert served["k"].dtype == jnp.float32 and np.all(np.isfinite(served["k"]))
    total_served += np.asarray(served["k"])
    total_master += np.asarray(master["k"])
  # sum_t served_t + r_T = sum_t master_t (up to float32 rounding of w + r)
  np.testing.assert_allclose(total_served + np.asarray(state.residual["k"]),
                             total_master, rtol=0, atol=1e-5)
  assert int(state.step) == 6


def test_error_feedback_resets_non_finite_residuals():
  spec = ex.ExportSpec("bf16", ex.ErrorFeedback())
  master = jnp.array([np.nan, np.inf, 1.0], jnp.float32)
  served, state = ex.export(master, spec, ex.init_export_state(master, spec))
  assert np.isnan(served[0]) and served[1] == np.inf
  np.testing.assert_array_equal(state.residual, [0.0, 0.0, 0.0])
  served, _ = ex.export(jnp.ones(3), spec, state)
  np.testing.assert_array_equal(served, [1.0, 1.0, 1.0])


# ----------------------------------------------------------------- straight-through


def test_straight_through_forward_is_served_bit_for_bit_and_gradient_passes():
  spec = ex.ExportSpec("e4m3")
  # 3e10 saturates to 448; master + (served - master) in float32 would give 0 there.
  x = np.concatenate([random_master(8, (60,), -8, 8),
                      np.array([3e10, -3e10, 1000.0, 1e-6], np.float32)])
  master = {"w": jnp.asarray(x), "n": jnp.int32(4)}
  served = nearest(master, spec)
  s32 = np.asarray(served["w"]).astype(np.float32)
  naive = x + (s32 - x)
  assert not np.array_equal(bits32(naive), bits32(s32))  # the naive form is inexact
  out = ex.straight_through(master, served)
  assert out["w"].dtype == jnp.float32 and out["n"] == 4
  np.testing.assert_array_equal(bits32(out["w"]), bits32(s32))
  c = jnp.linspace(-1.0, 2.0, x.size)

  def loss(w):
    return jnp.sum(c * jnp.sin(w))

  g_master, g_served = jax.grad(
      lambda m, s: loss(ex.straight_through({"w": m}, {"w": s})["w"]), argnums=(0, 1))(
          master["w"], served["w"])
  np.testing.assert_array_equal(g_master, jax.grad(loss)(jnp.asarray(s32)))
  np.testing.assert_array_equal(np.asarray(g_served, np.float32), 0.0)


# ------------------------------------------------------------------------ metrics


def test_unchanged_fraction_hand_cases():
  prev = {"a": jnp.array([1.0, 2.0, 3.0, 0.0], jnp.bfloat16),
          "b": jnp.array([np.nan, 1.0], jnp.bfloat16), "n": jnp.int32(0)}
  cur = {"a": jnp.array([1.0, 2.0, 3.0 + 2 ** -6, 0.0], jnp.bfloat16),
         "b": jnp.array([np.nan, -1.0], jnp.bfloat16), "n": jnp.int32(5)}
  out = ex.unchanged_fraction(prev, cur)
  assert set(out) == {"a", "b", "global"}
  assert float(out["a"]) == 0.75 and float(out["b"]) == 0.5
  assert float(out["global"]) == pytest.approx(4 / 6)
  zero = ex.unchanged_fraction(jnp.zeros(4), -jnp.zeros(4))  # -0 is a change
  assert float(zero["root"]) == 0.0
  with pytest.raises(ValueError, match="served is"):
    ex.unchanged_fraction({"a": jnp.ones(2)}, {"a": jnp.ones(2, jnp.bfloat16)})


@pytest.mark.parametrize("target,m,s,expected", [
    ("bf16", 1 + 2 ** -9, 1.0, 0.25),          # 2^-9 / 2^-7
    ("bf16", 1 - 2 ** -10, 1.0, 0.25),         # below 1 the spacing is 2^-8
    ("bf16", -(1 - 2 ** -10), -1.0, 0.25),
    ("bf16", 1 + 2 ** -7, 1 + 2 ** -7, 0.0),
    ("bf16", 1.0, 1 + 2 ** -7, 1.0),           # above a power of two: no halving
    ("bf16", 3.0 + 2 ** -7, 3.0, 0.5),         # 2^-7 / 2^(1-7)
    ("fp16", 2 ** -14 - 2 ** -26, 2 ** -14, 0.25),  # min normal: subnormal spacing
    ("fp16", 2 ** -13 - 2 ** -26, 2 ** -13, 0.25),  # 2^-26 / 2^-24
    ("fp16", 2 ** -26, 0.0, 0.25),             # at zero: the subnormal quantum
    ("e4m3", 1 + 2 ** -4, 1.0, 0.5),
    ("e4m3", 500.0, 448.0, 52 / 32),           # past max: spacing of the top binade
])
def test_ulp_distance_hand_cases(target, m, s, expected):
  out = ex.ulp_distance({"w": jnp.float32(m)}, {"w": jnp.float32(s)},
                        ex.ExportSpec(target))
  assert float(out["w"]["mean"]) == expected and float(out["w"]["max"]) == expected


def test_ulp_distance_matches_float64_reference_and_nearest_is_within_half():
  x = random_master(9, (4096,), -20, 20)[4:]  # normal range
  rng = np.random.default_rng(10)
  s = x.astype(ml_dtypes.bfloat16).astype(np.float32)
  # a stale copy: move some served values by -2..2 bf16 ulps
  off = rng.integers(-2, 3, size=x.shape)
  s_stale = (s.astype(np.float64) + off * bf16_ulp(s)).astype(np.float32)
  s_stale = s_stale.astype(ml_dtypes.bfloat16).astype(np.float32)
  for served in (s, s_stale):
    xd, sd = x.astype(np.float64), served.astype(np.float64)
    e = np.floor(np.log2(np.abs(sd)))
    spacing = np.exp2(e - 7)
    finer = (np.abs(sd) == np.exp2(e)) & (np.abs(xd) < np.abs(sd)) & (
        np.sign(xd) == np.sign(sd))
    ref = np.abs(xd - sd) / np.where(finer, spacing / 2, spacing)
    out = ex.ulp_distance({"w": jnp.asarray(x)}, {"w": jnp.asarray(served)}, BF16)
    np.testing.assert_allclose(float(out["w"]["mean"]), ref.mean(), rtol=1e-5)
    assert float(out["w"]["max"]) == np.float32(ref.max())
  near = ex.ulp_distance(x, nearest(jnp.asarray(x)), BF16)
  assert float(near["global"]["max"]) <= 0.5
  with pytest.raises(NotImplementedError, match="cast"):
    ex.ulp_distance(x, x, ex.ExportSpec(MXFP8))


def test_relative_drift_hand_cases():
  master = {"a": jnp.array([3.0, 4.0]), "z": jnp.zeros(2), "n": jnp.int32(1)}
  served = {"a": jnp.array([3.0, 4.5]), "z": jnp.zeros(2), "n": jnp.int32(1)}
  out = ex.relative_drift(master, served)
  np.testing.assert_allclose(float(out["a"]), 0.1, rtol=1e-6)
  assert float(out["z"]) == 0.0
  np.testing.assert_allclose(float(out["global"]), 0.1, rtol=1e-6)  # z adds nothing
  assert float(ex.relative_drift(jnp.zeros(1), jnp.ones(1))["root"]) == np.inf


def test_lag_tracker_hand_worked_sequence():
  u = 2.0 ** -7  # bf16 ulp at 1
  # element a0 moves 0.75 ulp from its served value at step 3, reflected at step 5;
  # a1 is a full ulp off from step 1 until step 6; b0 never lags (0.25 ulp below 1).
  masters = {
      0: ([1.0, 1.0], [1.0]),
      1: ([1 + u / 4, 1 + u], [1.0]),
      2: ([1 + u / 4, 1 + u], [1.0]),
      3: ([1 + 0.75 * u, 1 + u], [1 - u / 8]),
      4: ([1 + 0.75 * u, 1 + u], [1 - u / 8]),
      5: ([1 + 0.75 * u, 1 + u], [1 - u / 8]),
      6: ([1 + 0.75 * u, 1 + u], [1 - u / 8]),
  }
  served = {t: ([1.0, 1.0], [1.0]) for t in range(5)}
  served[5] = ([1 + u, 1.0], [1.0])
  served[6] = ([1 + u, 1 + u], [1.0])

  def tree(ab, dtype):
    return {"a": jnp.array(ab[0], dtype), "b": jnp.array(ab[1], dtype),
            "n": jnp.int32(0)}

  lag = ex.init_lag_state(tree(masters[0], jnp.float32))
  got = {}
  for t in range(7):
    lag, m = ex.update_lag(lag, tree(masters[t], jnp.float32),
                           tree(served[t], jnp.bfloat16), BF16, t)
    got[t] = (np.asarray(lag.pending_since["a"]).tolist(), m)
  assert got[2][0] == [-1, 1] and got[4][0] == [3, 1] and got[5][0] == [-1, 1]
  assert got[6][0] == [-1, -1] and lag.pending_since["n"] is None
  g4, g5, g6 = got[4][1]["global"], got[5][1]["global"], got[6][1]["global"]
  assert float(g4["lagging_fraction"]) == pytest.approx(2 / 3)
  assert float(got[4][1]["a"]["lagging_fraction"]) == 1.0
  assert float(got[4][1]["b"]["lagging_fraction"]) == 0.0
  assert (float(g4["mean_age"]), float(g4["max_age"])) == (2.0, 3.0)  # ages 1 and 3
  assert float(g4["completed"]) == 0 and float(g4["mean_completed_lag"]) == 0
  assert float(g5["completed"]) == 1 and float(g5["mean_completed_lag"]) == 2.0
  assert (float(g5["mean_age"]), float(g5["max_age"])) == (4.0, 4.0)
  assert float(g6["mean_completed_lag"]) == 3.5  # lags 2 and 5
  assert float(g6["completed_total"]) == 2 and float(g6["lagging_fraction"]) == 0
  assert float(lag.lag_sum["a"]) == 7.0 and float(lag.lag_count["b"]) == 0.0
  with pytest.raises(NotImplementedError):
    ex.update_lag(lag, tree(masters[0], jnp.float32), tree(served[0], jnp.float32),
                  ex.ExportSpec(MXFP8), 7)
