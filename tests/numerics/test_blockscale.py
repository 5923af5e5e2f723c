"""OCP MX and NVFP4 block quantization against the spec, a NumPy reference and hand-worked cases."""

import math

import chex
import hypothesis
from hypothesis import strategies as st
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec import numerics
from lowprec.numerics import blockscale
from lowprec.numerics import encoding
from lowprec.numerics import formats
from lowprec.numerics.rounding import Stochastic, parse

from tests.numerics import mx_reference as ref

MX = blockscale.MX_ELEMENT_FORMATS
RULES = blockscale.SCALE_RULES


def _bits_equal(a, b):
  a = np.asarray(a, np.float32)
  b = np.asarray(b, np.float32)
  nan = np.isnan(a)
  np.testing.assert_array_equal(nan, np.isnan(b))
  np.testing.assert_array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32))


def _special_matrix(seed=0):
  """8 rows x 4 blocks of 32: random magnitudes plus zero/NaN/Inf/subnormal/saturating blocks."""
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal((8, 128)) * np.exp2(rng.integers(-30, 30, (8, 4)).repeat(32, 1))
       ).astype(np.float32)
  x[0, :32] = 0.0
  x[1, 5] = np.nan
  x[2, 40] = np.inf
  x[2, 70] = -np.inf
  x[3, :32] = (np.float32(1e-41) * rng.standard_normal(32)).astype(np.float32)
  x[4, :32] = 448.0
  x[4, 1] = 512.0
  x[5, 0] = 957.0
  x[6, 32:64] = np.float32(2.0 ** 127) * rng.uniform(-1.9, 1.9, 32).astype(np.float32)
  x[7, :32] = np.float32(2.0 ** -140)
  return x


@pytest.fixture(scope="module")
def quantize_jit():
  return jax.jit(blockscale.quantize_mx, static_argnames=(
      "fmt", "axis", "block_shape", "scale_rule", "rounding", "pad"))


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("name", MX)
def test_mx_matches_numpy_reference(name, rule, quantize_jit):
  x = _special_matrix()
  q = quantize_jit(jnp.asarray(x), name, scale_rule=rule)
  deq = blockscale.dequantize(q)
  want, want_codes = ref.quantize_dequantize_mx(x, name, rule)
  _bits_equal(deq, want)
  np.testing.assert_array_equal(np.asarray(q.scales), want_codes)
  assert q.codes.dtype == jnp.uint8 and q.scales.dtype == jnp.uint8
  assert q.scales.shape == (8, 4)


@pytest.mark.parametrize("name", MX)
def test_fused_quantize_dequantize_equals_two_step(name):
  x = jnp.asarray(_special_matrix(9))
  key = jax.random.key(2)
  for rule in RULES:
    for kw in (dict(), dict(rounding=Stochastic(), key=key), dict(block_shape=8, axis=0)):
      _bits_equal(blockscale.quantize_dequantize_mx(x, name, scale_rule=rule, **kw),
                  numerics.dequantize(numerics.quantize_mx(x, name, scale_rule=rule, **kw)))
  _bits_equal(blockscale.quantize_dequantize_mx(x[:, :40], name, pad=True,
                                                block_shape=(8, 32)),
              numerics.dequantize(numerics.quantize_mx(x[:, :40], name, pad=True,
                                                       block_shape=(8, 32))))


def test_hand_worked_power_of_two_amax():
  # amax = 256 = 2^8 with E4M3 (emax 8): shared exponent 8 - 8 = 0, code 127, exact.
  x = jnp.array([256.0, 1.0, -3.5, 0.125] + [0.0] * 28)
  q = numerics.quantize_mx(x, "e4m3")
  assert int(q.scales[0]) == 127
  chex.assert_trees_all_equal(numerics.dequantize(q), x)
  # E2M1 (emax 2), amax 1: exponent -2, elements 4x: 0.3 -> 1.2 -> 1.0 -> 0.25.
  y = jnp.array([1.0, 0.3, -0.5, 0.125] + [0.0] * 28)
  q = numerics.quantize_mx(y, "e2m1")
  assert int(q.scales[0]) == 127 - 2
  np.testing.assert_array_equal(np.asarray(numerics.dequantize(q))[:4], [1.0, 0.25, -0.5, 0.125])


def test_hand_worked_saturating_block():
  # microxcaling issue #4: MXFP8 floor rule puts 957 at 957/2 = 478.5 > 448: saturates.
  x = jnp.array([957.0] + [1.0] * 31)
  assert float(numerics.dequantize(numerics.quantize_mx(x, "e4m3"))[0]) == 896.0
  # rceil picks 2^2 instead: 957/4 = 239.25 -> 240 -> 960, no saturation.
  q = numerics.quantize_mx(x, "e4m3", scale_rule="rceil")
  assert int(q.scales[0]) == 127 + 2
  assert float(numerics.dequantize(q)[0]) == 960.0
  # E2M1, amax 7: floor gives scale 1 and 7 saturates to 6; ALTO rounds amax to one
  # mantissa bit (7 -> 8), scale 2, 3.5 -> RNE tie to the even code 4 -> 8.
  z = jnp.array([7.0] + [0.0] * 31)
  assert float(numerics.dequantize(numerics.quantize_mx(z, "e2m1"))[0]) == 6.0
  q = numerics.quantize_mx(z, "e2m1", scale_rule="alto")
  assert int(q.scales[0]) == 128
  assert float(numerics.dequantize(q)[0]) == 8.0


def test_hand_worked_mxint8():
  # OCP MXINT8: amax 1 -> shared exponent 0 (code 127); element k = round(x * 64).
  x = jnp.array([1.0, 1.99, -0.5, 1.0 / 128, 3.0 / 256] + [0.0] * 27)
  q = numerics.quantize_mx(x, "int8")
  assert int(q.scales[0]) == 127
  codes = np.asarray(q.codes).view(np.int8)[:5]
  np.testing.assert_array_equal(codes, [64, 127, -32, 0, 1])  # 0.5 ties to even 0; 0.75 -> 1
  np.testing.assert_array_equal(np.asarray(numerics.dequantize(q))[:5],
                                [1.0, 127 / 64, -0.5, 0.0, 1 / 64])


def test_special_blocks():
  x = jnp.zeros((4, 32)).at[1, 3].set(jnp.nan).at[2, 7].set(-jnp.inf)
  x = x.at[3].set(jnp.linspace(-1, 1, 32))
  for name in MX:
    q = numerics.quantize_mx(x, name)
    s = np.asarray(q.scales)[:, 0]
    assert s[0] == 0 and s[1] == 255 and s[2] == 255, (name, s)
    d = np.asarray(numerics.dequantize(q))
    assert np.all(d[0] == 0) and np.all(np.isnan(d[1])) and np.all(np.isnan(d[2]))
    assert np.all(np.isfinite(d[3]))
    np.testing.assert_array_equal(np.asarray(q.codes)[1:3], 0)


def test_subnormal_only_block():
  x = np.float32(2.0 ** -140) * np.arange(1, 33, dtype=np.float32)
  q = numerics.quantize_mx(jnp.asarray(x), "e4m3")
  assert int(q.scales[0]) == 0  # floor(log2) - 8 = -141 clamps to -127
  d = np.asarray(numerics.dequantize(q))
  # Elements are x * 2^127 = k * 2^-13 < 2^-9 * 16: E4M3 subnormals keep k*2^-13 rounded
  # to multiples of 2^-9, i.e. multiples of 16 * 2^-140.
  want = np.round(np.arange(1, 33) / 16) * 16 * 2.0 ** -140
  np.testing.assert_array_equal(d, want.astype(np.float32))


def test_axis_and_transpose_agree():
  x = jnp.asarray(_special_matrix(3)[:, :64])  # (8, 64)
  xt = jnp.asarray(np.ascontiguousarray(np.asarray(x).T))
  qa = numerics.quantize_mx(xt, "e2m1", block_shape=8, axis=0)
  qb = numerics.quantize_mx(x, "e2m1", block_shape=8, axis=-1)
  _bits_equal(numerics.dequantize(qa), np.asarray(numerics.dequantize(qb)).T)
  np.testing.assert_array_equal(np.asarray(qa.scales), np.asarray(qb.scales).T)


@pytest.mark.parametrize("name,block", [("e2m1", (32, 32)), ("e4m3", (16, 8))])
def test_2d_tiles_match_reference(name, block):
  rng = np.random.default_rng(4)
  x = (rng.standard_normal((64, 64)) * np.exp2(rng.integers(-8, 8, (64, 1)))).astype(np.float32)
  q = numerics.quantize_mx(jnp.asarray(x), name, block_shape=block)
  assert q.scales.shape == (64 // block[0], 64 // block[1])
  rows = ref.tiles_to_rows(x, *block)
  want, want_codes = ref.quantize_dequantize_mx(rows, name, "floor", block=block[0] * block[1])
  _bits_equal(numerics.dequantize(q), ref.rows_to_tiles(want, 64, 64, *block))
  np.testing.assert_array_equal(np.asarray(q.scales).reshape(-1), want_codes.reshape(-1))


def test_2d_tiles_same_quantized_weight_for_transpose():
  # ALTO 1d2d: a 2D-tiled W and its transpose quantize to the same values.
  w = jax.random.normal(jax.random.key(0), (64, 96))
  a = numerics.dequantize(numerics.quantize_mx(w, "e2m1", block_shape=(32, 32)))
  b = numerics.dequantize(numerics.quantize_mx(w.T, "e2m1", block_shape=(32, 32)))
  chex.assert_trees_all_equal(a, b.T)


def test_padding_and_divisibility_error():
  x = jax.random.normal(jax.random.key(1), (3, 40))
  with pytest.raises(ValueError, match="pad=True"):
    numerics.quantize_mx(x, "e4m3")
  q = numerics.quantize_mx(x, "e4m3", pad=True)
  assert q.codes.shape == (3, 64) and q.scales.shape == (3, 2)
  d = numerics.dequantize(q)
  assert d.shape == (3, 40)
  want, _ = ref.quantize_dequantize_mx(np.pad(np.asarray(x), ((0, 0), (0, 24))), "e4m3")
  _bits_equal(d, want[:, :40])
  with pytest.raises(ValueError, match="not divisible"):
    numerics.quantize_mx(jnp.ones((40, 64)), "e2m1", block_shape=(32, 32))


def test_input_validation():
  x = jnp.ones((4, 32))
  with pytest.raises(ValueError, match="unknown format"):
    numerics.quantize_mx(x, "e9m9")
  with pytest.raises(ValueError, match="MX element format"):
    numerics.quantize_mx(x, "bf16")
  with pytest.raises(ValueError, match="scale_rule"):
    numerics.quantize_mx(x, "e4m3", scale_rule="round")
  with pytest.raises(ValueError, match="needs a PRNG key"):
    numerics.quantize_mx(x, "e4m3", rounding=Stochastic())
  with pytest.raises(TypeError, match="float32"):
    numerics.quantize_mx(jnp.ones((4, 32), jnp.int32), "e4m3")
  with pytest.raises(ValueError, match="out of range"):
    numerics.quantize_mx(x, "e4m3", axis=2)
  with pytest.raises(ValueError, match="block_shape extents"):
    numerics.quantize_mx(x, "e4m3", block_shape=0)
  with pytest.raises(TypeError, match="QuantizedArray"):
    numerics.dequantize(x)


def test_bf16_input_and_pytree():
  x = jax.random.normal(jax.random.key(2), (4, 64))
  qa = numerics.quantize_mx(x.astype(jnp.bfloat16), "e4m3")
  qb = numerics.quantize_mx(x.astype(jnp.bfloat16).astype(jnp.float32), "e4m3")
  chex.assert_trees_all_equal(qa, qb)
  leaves, tree = jax.tree_util.tree_flatten(qa)
  assert len(leaves) == 3
  chex.assert_trees_all_equal(jax.tree_util.tree_unflatten(tree, leaves), qa)
  chex.assert_trees_all_equal(jax.jit(numerics.dequantize)(qa), numerics.dequantize(qa))


def _element_ulp(v: np.ndarray, f: formats.Format) -> np.ndarray:
  if f.kind == "int":
    return np.ones_like(v)
  e = np.floor(np.log2(np.maximum(np.abs(v), f.min_normal)))
  return np.exp2(e - f.man_bits)


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
    data=hnp.arrays(np.float32, (2, 64), elements=st.floats(
        -1e6, 1e6, width=32, allow_subnormal=True)),
    name=st.sampled_from(MX), rule=st.sampled_from(RULES))
def test_property_error_bound_and_idempotence(data, name, rule):
  f = formats.get(name)
  q = numerics.quantize_mx(jnp.asarray(data), name, scale_rule=rule)
  d = np.asarray(numerics.dequantize(q), np.float64)
  scale = np.repeat(np.exp2(np.asarray(q.scales, np.float64) - 127 - (f.emax - f.mx_emax)),
                    32, axis=1)
  v = data / scale
  unsat = np.abs(v) <= f.max
  err = np.abs(d - data)
  bound = 0.5 * _element_ulp(v, f) * scale
  assert np.all(err[unsat] <= bound[unsat])
  assert np.all(np.abs(d[~unsat]) == f.max * scale[~unsat])  # saturated to +-max
  # Quantizing the dequantized array changes no value (a rule may pick half the scale,
  # which keeps every grid value; not ALTO's, see the next test); under floor (OCP) no
  # bit either.
  q2 = numerics.quantize_mx(jnp.asarray(d, jnp.float32), name, scale_rule=rule)
  if rule != "alto":
    _bits_equal(numerics.dequantize(q2), d.astype(np.float32))
  if rule == "floor":
    chex.assert_trees_all_equal(q2.codes, q.codes)
    chex.assert_trees_all_equal(q2.scales, q.scales)


def test_alto_rule_is_not_idempotent():
  # Hand-worked (found by the property above): a block of 216s and one 3 in MXFP6
  # E2M3 (emax 2, max 7.5). ALTO rounds amax's mantissa half up to one bit: 216 =
  # 1.6875 * 2^7 stays in 2^7, so the scale is 2^(7-2) = 32; 216/32 = 6.75 is a tie
  # that rounds to even, 7.0, so 216 -> 224, and 3/32 = 0.09375 -> 0.125 (4). Now
  # amax 224 = 1.75 * 2^7 rounds up to 2^8: the scale doubles to 64 and 4/64 = 0.0625
  # is E2M3's half-ulp tie at zero, rounding to 0. (The OCP floor rule keeps the
  # scale: amax stays in [4, 7.5] * scale.)
  x = np.full((1, 32), 216.0, np.float32)
  x[0, 0] = 3.0
  once = numerics.dequantize(numerics.quantize_mx(jnp.asarray(x), "e2m3", scale_rule="alto"))
  twice = numerics.dequantize(numerics.quantize_mx(once, "e2m3", scale_rule="alto"))
  np.testing.assert_array_equal(np.asarray(once)[0, :2], [4.0, 224.0])
  np.testing.assert_array_equal(np.asarray(twice)[0, :2], [0.0, 224.0])
  floor = numerics.dequantize(numerics.quantize_mx(once, "e2m3", scale_rule="floor"))
  np.testing.assert_array_equal(np.asarray(floor), np.asarray(once))


@hypothesis.settings(max_examples=10, deadline=None)
@hypothesis.given(shape=st.sampled_from([(8, 16), (4, 8, 16), (16,)]),
                  block=st.sampled_from([4, 8, 16]), seed=st.integers(0, 2**16),
                  name=st.sampled_from(MX))
def test_property_any_axis_equals_moveaxis(shape, block, seed, name):
  x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
  for axis in range(len(shape)):
    if shape[axis] % block:
      continue
    qa = numerics.quantize_mx(jnp.asarray(x), name, block_shape=block, axis=axis)
    xm = np.ascontiguousarray(np.moveaxis(x, axis, -1))
    qb = numerics.quantize_mx(jnp.asarray(xm), name, block_shape=block, axis=-1)
    _bits_equal(np.moveaxis(np.asarray(numerics.dequantize(qa)), axis, -1),
                numerics.dequantize(qb))


def test_mx_stochastic_rounding_neighbours_and_unbiased():
  # Elements of one block (scale fixed by amax = 6 -> scale 1 for E2M1) rounded
  # stochastically: always a grid neighbour; the mean over N keys is within
  # 6 standard errors of x (false-failure probability < 1e-8 per element, 31 elements).
  x = jnp.concatenate([jnp.array([6.0]), jnp.linspace(-5.9, 5.9, 31)])
  n = 4000
  keys = jax.random.split(jax.random.key(7), n)
  f = jax.jit(jax.vmap(lambda k: numerics.dequantize(
      numerics.quantize_mx(x, "e2m1", rounding=Stochastic(), key=k))))
  d = np.asarray(f(keys))
  grid = np.unique(np.abs(encoding.decode_table("e2m1")))
  grid = np.concatenate([-grid[::-1], grid])
  xs = np.asarray(x)
  lo = np.array([grid[grid <= v].max() for v in xs])
  hi = np.array([grid[grid >= v].min() for v in xs])
  assert np.all((d == lo) | (d == hi))
  p = np.where(hi > lo, (xs - lo) / np.where(hi > lo, hi - lo, 1), 0)
  se = (hi - lo) * np.sqrt(p * (1 - p) / n)
  assert np.all(np.abs(d.mean(0) - xs) <= 6 * se + 1e-7)
  scales = jax.vmap(lambda k: numerics.quantize_mx(
      x, "e2m1", rounding=Stochastic(), key=k).scales)(keys[:4])
  assert np.all(np.asarray(scales) == np.asarray(scales)[0])  # scale is deterministic


@pytest.mark.parametrize("block_shape", [None, (16, 16)])
def test_nvfp4_matches_te_reference(block_shape):
  x = _special_matrix(5)
  x = x[[0, 4, 5, 6, 7]] if block_shape is None else x[[0, 3, 4, 5, 6, 7, 1, 2] * 2][:16, :64]
  x = np.where(np.isfinite(x), x, 1.0).astype(np.float32)
  x[np.abs(x) > 1e30] = 3.0  # keep the tensor amax moderate so block scales are used
  q = numerics.quantize_nvfp4(jnp.asarray(x), block_shape=block_shape)
  if block_shape is None:
    want, want_s, want_t = ref.quantize_dequantize_nvfp4(x)
  else:
    rows = ref.tiles_to_rows(x, 16, 16)
    want_r, want_s, want_t = ref.quantize_dequantize_nvfp4(rows, block=256)
    want = ref.rows_to_tiles(want_r, *x.shape, 16, 16)
    want_s = want_s.reshape(x.shape[0] // 16, x.shape[1] // 16)
  assert float(q.tensor_scale) == float(want_t)
  np.testing.assert_array_equal(np.asarray(q.scale_values()), want_s)
  _bits_equal(numerics.dequantize(q), want)


@pytest.mark.parametrize("block_shape,axis,rounding", [
    (None, -1, "nearest"), (None, 0, "stochastic"), ((16, 16), None, "nearest")])
def test_nvfp4_block_values_decode_the_codes_and_complete_with_the_tensor_scale(
    block_shape, axis, rounding):
  x = np.asarray(jax.random.normal(jax.random.key(3), (48, 64))) * 5.0
  x[3, :16] = 1e-30  # a block whose E4M3 scale is tiny
  x[5, 7] = np.nan
  kw = dict(block_shape=block_shape, axis=axis, rounding=parse(rounding))
  if rounding == "stochastic":
    kw["key"] = jax.random.key(4)
  values, inv = blockscale.quantize_dequantize_nvfp4_blocks(jnp.asarray(x), **kw)
  q = numerics.quantize_nvfp4(jnp.asarray(x), **kw)
  want = ref.nvfp4_block_values(np.asarray(q.codes), np.asarray(q.scales),
                                block_shape=q.block_shape, axes=q.axes)
  _bits_equal(values, want)
  assert float(inv) == float(q.tensor_scale)
  # exact in bfloat16, and completed by one float32 rounding by the tensor scale
  _bits_equal(values.astype(jnp.bfloat16).astype(jnp.float32), want)
  _bits_equal(values * inv, blockscale.quantize_dequantize_nvfp4(jnp.asarray(x), **kw))
  with pytest.raises(TypeError, match="quantize_dequantize_nvfp4_blocks has no gradient"):
    jax.grad(lambda x: jnp.sum(blockscale.quantize_dequantize_nvfp4_blocks(x)[0]))(
        jnp.ones((4, 16)))


def test_nvfp4_float32_subnormal_inputs_follow_the_spec():
  """Regression: XLA:CPU treated subnormal inputs of ``x * enc`` and
  ``block_amax * S_enc/6`` as zero, zeroing NVFP4 codes and scales the spec's float32
  arithmetic (NumPy, GPU) keeps."""
  x = np.zeros((2, 32), np.float32)
  x[0, :16] = 5e-39 * np.arange(1, 17)  # subnormal elements in a normal-amax block
  x[0, 16:] = 6e-40 * np.arange(16)  # a block of subnormals only
  x[1] = np.linspace(-1e-33, 1e-33, 32)  # S_enc ~ 2.7e36, 1/S_enc still normal
  q = numerics.quantize_nvfp4(jnp.asarray(x))
  codes, scales, inv, _ = ref.quantize_nvfp4(x)  # (dequantized values this small
  np.testing.assert_array_equal(np.asarray(q.codes), codes)  # are subnormal: CPU flushes)
  np.testing.assert_array_equal(np.asarray(q.scales), scales)
  assert float(q.tensor_scale) == float(inv)
  assert np.all(codes[0, :2] != 0) and scales[0, 1] != 0


@pytest.mark.parametrize("convention", ["te", "torchao"])
@pytest.mark.parametrize("amax", [3e-34, 1e-35, 1e-36, 5e-38, 3.9e-39, 1e-41])
def test_nvfp4_tensor_of_tiny_values_matches_the_reference(amax, convention):
  """Issue 35: a tensor of float32 subnormals (or with amax below 2688 * 2^-126 =
  3.2e-35) has a subnormal 1/S_enc (torchao: per_tensor_scale); XLA:CPU read it as
  zero, so dequantize returned all zeros (and S_dec * (1/S_enc), torchao's zero test
  and Inf / s changed codes) where the spec's float32 formula keeps the values. Every
  output is now the NumPy reference's, bit for bit, with no mask for subnormals."""
  rng = np.random.default_rng(int(amax * 1e45) % 2 ** 32)
  x = rng.standard_normal((16, 64)).astype(np.float32)
  x[3, 16:32] = 0.0
  x = (x / np.abs(x).max() * np.float32(amax)).astype(np.float32)
  reference = ref.quantize_nvfp4 if convention == "te" else ref.quantize_nvfp4_torchao
  for axis in (-1, 0):
    with np.errstate(all="ignore"):
      codes, scales, tensor_scale, deq = reference(x, axis=axis)
    q = numerics.quantize_nvfp4(jnp.asarray(x), axis=axis, convention=convention)
    np.testing.assert_array_equal(np.asarray(q.codes), codes)
    np.testing.assert_array_equal(np.asarray(q.scales), scales)
    assert np.float32(q.tensor_scale).view(np.uint32) == np.float32(tensor_scale).view(
        np.uint32)
    _bits_equal(numerics.dequantize(q), deq)
    _bits_equal(blockscale.quantize_dequantize_nvfp4(jnp.asarray(x), axis=axis,
                                                     convention=convention), deq)
    if convention == "te":
      values, _ = blockscale.quantize_dequantize_nvfp4_blocks(jnp.asarray(x), axis=axis)
      _bits_equal(values, ref.nvfp4_block_values(codes, scales, axes=(axis,)))
      batched = jax.vmap(lambda v: numerics.quantize_nvfp4(v, axis=axis))(
          jnp.asarray(x)[None])
      _bits_equal(numerics.dequantize(batched), deq[None])
  if amax == 3.9e-39:  # float32 subnormals only: main returned all zeros here
    assert np.count_nonzero(deq) > 0


def test_nvfp4_of_512_float32_subnormals_keeps_what_numpy_keeps():
  """The issue's example: 512 float32 subnormals (1/S_enc = 2.9e-39); main dequantized
  them all to zero, the spec's float32 formula keeps a good part of them."""
  rng = np.random.default_rng(35)
  x = (rng.standard_normal(512) * 1e-39).astype(np.float32)
  with np.errstate(all="ignore"):
    _, _, inv, deq = ref.quantize_nvfp4(x)
  got = np.asarray(numerics.dequantize(numerics.quantize_nvfp4(jnp.asarray(x))))
  assert inv < np.finfo(np.float32).tiny and np.count_nonzero(deq) > 200
  _bits_equal(got, deq)


def test_nvfp4_hand_worked_and_specials():
  # amax 2688 = 448 * 6 gives S_enc = 1; a block with amax 6 gets scale 1.
  x = jnp.array([2688.0] + [0.0] * 15 + [6.0, 1.0, -2.5, 0.2] + [0.0] * 12)
  q = numerics.quantize_nvfp4(x)
  assert float(q.tensor_scale) == 1.0
  np.testing.assert_array_equal(np.asarray(q.scale_values()), [448.0, 1.0])
  np.testing.assert_array_equal(np.asarray(numerics.dequantize(q))[16:20],
                                [6.0, 1.0, -2.0, 0.0])  # 2.5 ties to even 2; 0.2 -> 0
  z = numerics.quantize_nvfp4(jnp.zeros(32))
  assert float(z.tensor_scale) == 1.0 and np.all(np.asarray(numerics.dequantize(z)) == 0)
  y = numerics.quantize_nvfp4(jnp.ones(32).at[3].set(jnp.nan))
  d = np.asarray(numerics.dequantize(y))
  assert np.all(np.isnan(d[:16])) and np.all(d[16:] == 1.0)
  with pytest.raises(ValueError, match="not divisible"):
    numerics.quantize_nvfp4(jnp.ones(20))


def test_decode_tables_match_ml_dtypes():
  for name in formats.names():
    f = formats.get(name)
    if not f.is_narrow:
      continue
    codes = np.arange(2 ** f.bits, dtype=np.uint8)
    ours = encoding.decode_table(name)
    if f.kind == "int":
      want = codes.view(np.int8).astype(np.float32)
      want[128] = np.nan  # -128 is unused (symmetric MXINT8)
    else:
      want = codes.view(f.np_dtype).astype(np.float32)
    _bits_equal(ours, want)
    dec = np.asarray(encoding.decode(jnp.asarray(codes), name))
    _bits_equal(dec, ours)
    ok = ~np.isnan(ours)
    if f.kind == "int":
      ok[128] = False
    back = np.asarray(encoding.encode(jnp.asarray(ours), name))
    np.testing.assert_array_equal(back[ok], codes[ok])


def test_encode_rejects_wide_formats():
  with pytest.raises(ValueError, match="at most 8 bits"):
    encoding.encode(jnp.ones(3), "bf16")
