"""numerics.kv_quant against NumPy / ml_dtypes references written from the rules."""

import functools

import chex
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from lowprec.numerics import kv_quant
from lowprec.numerics.kv_quant import KVQuantSpec
from lowprec.numerics.rounding import Stochastic, TowardZero
from tests.numerics import format_values
from tests.numerics import mx_reference

B, H, S, K = 2, 2, 6, 32
_ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
_MAX = {"e4m3": 448.0, "e5m2": 57344.0, "int8": 127.0}


def _data(seed=0, outliers=True):
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal((B, H, S, K)) * 3).astype(np.float32)
  if outliers:  # a few large values: saturation under the naive scale, big blocks
    x[0, 1, 2, 5] = 1000.0
    x[1, 0, 4, 17] = -3.0e4
  return x


def _recip(v):
  return (np.float32(1) / np.asarray(v, np.float32)).astype(np.float32)


def _ref_cast_scaled(x, fmt, s):
  """decode(cast(x * (1/s))) * s in float32, saturating, round half to even."""
  v = np.clip((x * _recip(s)).astype(np.float32), -_MAX[fmt], _MAX[fmt])
  q = np.round(v) if fmt == "int8" else v.astype(_ML[fmt]).astype(np.float32)
  return (q.astype(np.float32) * s).astype(np.float32)


def _reference(spec, x, scale=None):
  """What every position reads back after writing x, from the module's rules."""
  if spec.fmt == "fp32":
    return x
  if spec.fmt == "bf16":
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)
  if spec.fmt == "nvfp4":
    out = np.empty_like(x)
    for b in range(B):
      for t in range(S):
        out[b, :, t, :] = mx_reference.quantize_dequantize_nvfp4(x[b, :, t, :])[0]
    return out
  if spec.granularity == "block":
    return mx_reference.quantize_dequantize_mx(x, spec.fmt, "floor", spec.mx_block)[0]
  if spec.granularity == "token":
    amax = np.max(np.abs(x), axis=-1, keepdims=True)
    s = (amax * _recip(_MAX[spec.fmt])).astype(np.float32)
    s = np.where(amax == 0, np.float32(1), s)
    return _ref_cast_scaled(x, spec.fmt, s)
  s = np.float32(1) if scale is None else np.asarray(scale, np.float32)
  if spec.granularity == "head":
    s = s.reshape(1, H, 1, 1)
  return _ref_cast_scaled(x, spec.fmt, s)


def _write_in_chunks(spec, x, scale=None, offset=0):
  """A prefill of 5 positions, then 1 (as a decoder writes), from ``offset`` on, into
  a cache of ``S + 2 * offset`` positions; compiled once."""
  cache = kv_quant.init(spec, (B, H, S + 2 * offset, K), scale)
  return _write_chunks(cache, jnp.asarray(x), offset)


@functools.partial(jax.jit, static_argnums=2)
def _write_chunks(cache, x, offset):
  for start, stop in ((0, 5), (5, 6)):
    cache = kv_quant.write(cache, x[:, :, start:stop], start + offset)
  return cache


def _head_scale(x, fmt):
  amax = np.max(np.abs(x), axis=(0, 2, 3))
  return (amax * _recip(_MAX[fmt])).astype(np.float32)


CASES = [KVQuantSpec("fp32"), KVQuantSpec("bf16"), KVQuantSpec("nvfp4", "block"),
         KVQuantSpec("e4m3", "block", block_size=16)]
CASES += [KVQuantSpec(f, g) for f in ("e4m3", "e5m2", "int8")
          for g in ("tensor", "head", "token", "block")]


@pytest.mark.parametrize("spec", CASES, ids=lambda s: f"{s.fmt}-{s.granularity}")
def test_written_cache_reads_back_the_reference(spec):
  x = _data()
  scale = None
  if spec.granularity == "head":
    scale = _head_scale(x, spec.fmt)  # calibrated per head
  elif spec.granularity == "tensor" and spec.fmt == "int8":
    scale = np.float32(0.37)  # int8 with scale 1 would round most values to 0
  got = np.asarray(kv_quant.read(_write_in_chunks(spec, x, scale, offset=1)))
  np.testing.assert_array_equal(got[:, :, 1:-1], _reference(spec, x, scale))
  np.testing.assert_array_equal(got[:, :, [0, -1]], 0.0)  # never written
  if spec.fmt not in ("fp32", "bf16") and spec.granularity != "block":
    assert not np.array_equal(got, x)


def test_naive_e4m3_saturates_and_calibration_does_not():
  x = _data()
  naive = np.asarray(kv_quant.read(_write_in_chunks(KVQuantSpec("e4m3", "tensor"), x)))
  assert naive[0, 1, 2, 5] == 448.0 and naive[1, 0, 4, 17] == -448.0
  spec = KVQuantSpec("e4m3", "tensor")
  scale = kv_quant.calibrated_scale(spec, x)
  np.testing.assert_array_equal(scale, np.float32(3.0e4) * _recip(448.0))
  calibrated = np.asarray(kv_quant.read(_write_in_chunks(spec, x, scale)))
  assert calibrated[1, 0, 4, 17] == -3.0e4


def test_calibrated_scales_by_hand():
  x = _data(1, outliers=False)
  x[1, 1, 3, 2] = np.inf  # ignored
  finite = np.where(np.isfinite(x), np.abs(x), 0)
  head = kv_quant.calibrated_scale(KVQuantSpec("int8", "head"), x)
  np.testing.assert_array_equal(head, (finite.max(axis=(0, 2, 3)) * _recip(127))
                                .astype(np.float32))
  zeros = kv_quant.calibrated_scale(KVQuantSpec("e5m2", "tensor"), np.zeros((1, 1, 2, 4)))
  assert zeros == 1.0
  with pytest.raises(ValueError, match="static"):
    kv_quant.calibrated_scale(KVQuantSpec("e4m3", "token"), x)


def test_fp32_cache_is_the_identity_bit_for_bit():
  x = _data()
  x[0, 0, 0, :4] = [np.nan, np.inf, -0.0, 1e-30]
  got = np.asarray(kv_quant.read(_write_in_chunks(KVQuantSpec(), x)))
  np.testing.assert_array_equal(got.view(np.uint32), x.view(np.uint32))


def test_special_values():
  x = _data(2, outliers=False)
  x[0, 0, 1, 3] = np.nan
  # int8 has no NaN code; the unused -128 code carries it.
  got = np.asarray(kv_quant.read(_write_in_chunks(KVQuantSpec("int8", "tensor"), x, 0.1)))
  assert np.isnan(got[0, 0, 1, 3]) and np.isfinite(np.delete(got.ravel(), 0 * S * K + 1 * K + 3)).all()
  # A NaN in a token vector poisons that vector only.
  got = np.asarray(kv_quant.read(_write_in_chunks(KVQuantSpec("e4m3", "token"), x)))
  assert np.isnan(got[0, 0, 1]).all()
  mask = np.ones(got.shape, bool)
  mask[0, 0, 1] = False
  assert np.isfinite(got[mask]).all()


def test_hand_counted_bytes_per_position():
  # H=2 heads of K=32: 64 elements a position.
  expected = {
      KVQuantSpec("fp32"): 64 * 4,
      KVQuantSpec("bf16"): 64 * 2,
      KVQuantSpec("e4m3", "tensor"): 64,
      KVQuantSpec("int8", "head"): 64,
      KVQuantSpec("e5m2", "token"): 64 + 2 * 4,
      KVQuantSpec("e4m3", "block"): 64 + 64 // 32,
      KVQuantSpec("int8", "block", block_size=16): 64 + 64 // 16,
      KVQuantSpec("nvfp4", "block"): 64 // 2 + 64 // 16 + 4,
  }
  for spec, want in expected.items():
    assert kv_quant.bytes_per_position(spec, 2, 32) == want, spec
  cache = kv_quant.init_cache(3, (2, 2, 5, 32), KVQuantSpec("nvfp4", "block"),
                              KVQuantSpec("e4m3", "tensor"))
  # keys: 5 positions x 2 rows x 40 bytes; values: 5 x 2 x 64 + a 4-byte scale; length.
  assert kv_quant.tree_nbytes(cache) == 3 * (5 * 2 * 40 + 5 * 2 * 64 + 4) + 4


def test_nvfp4_codes_are_packed_two_a_byte():
  spec = KVQuantSpec("nvfp4", "block")
  x = np.zeros((1, 1, 1, 16), np.float32)
  x[0, 0, 0, :2] = [6.0, -0.5]  # amax 6: S_enc = 448, block scale 448 -> E2M1 6, -0.5
  cache = kv_quant.write(kv_quant.init(spec, (1, 1, 1, 16)), jnp.asarray(x), 0)
  chex.assert_shape(cache.codes, (1, 1, 1, 8))
  assert int(cache.codes[0, 0, 0, 0]) == 0x7 | (0x9 << 4)  # 6 = 0b0111, -0.5 = 0b1001
  np.testing.assert_array_equal(cache.codes[0, 0, 0, 1:], 0)
  want = mx_reference.quantize_dequantize_nvfp4(x[0, :, 0])[0]  # 6 * 448 * fl(1/448)
  np.testing.assert_array_equal(kv_quant.read(cache)[0, :, 0], want)


@pytest.mark.parametrize("spec,scale", [
    (KVQuantSpec("int8", "tensor", rounding=Stochastic()), 0.25),
    (KVQuantSpec("e4m3", "head", rounding=Stochastic()), None),
])
def test_stochastic_rounding_is_unbiased_between_neighbours(spec, scale):
  rng = np.random.default_rng(3)
  x = (rng.standard_normal((1, 2, 1, 32)) * 4).astype(np.float32)
  cache = kv_quant.init(spec, (1, 2, 1, 32), scale)
  keys = jax.random.split(jax.random.key(0), 2000)
  reads = np.asarray(jax.jit(jax.vmap(
      lambda k: kv_quant.read(kv_quant.write(cache, jnp.asarray(x), 0, k))))(keys))
  s = 1.0 if scale is None else scale  # powers of two: x / s and q * s are exact
  v = x.astype(np.float64) / s
  grid = np.unique(format_values.all_values(spec.fmt))  # from ml_dtypes
  lo = grid[np.searchsorted(grid, v, side="right") - 1]
  hi = grid[np.searchsorted(grid, v, side="left")]
  r = reads / s
  assert np.all((r == lo) | (r == hi))
  # Each element's mean of n=2000 picks of lo or hi: |mean - v| < 5 sd, sd <=
  # (hi - lo) / 2 / sqrt(n); false-failure probability < 64 * 6e-7.
  assert np.all(np.abs(r.mean(axis=0) - v) <= 5 * (hi - lo) / 2 / np.sqrt(2000))
  assert np.any(r != r[0])  # it did round both ways


@pytest.mark.parametrize("kwargs", [
    dict(fmt="fp8"), dict(fmt="e4m3"), dict(fmt="e4m3", granularity="channel"),
    dict(fmt="fp32", granularity="token"), dict(fmt="nvfp4", granularity="token"),
    dict(fmt="e4m3", granularity="token", block_size=16),
    dict(fmt="e4m3", granularity="head", scale_rule="floor"),
    dict(fmt="nvfp4", granularity="block", block_size=32),
    dict(fmt="fp32", rounding=Stochastic()),
    dict(fmt="fp32", rounding=Stochastic(bits=8)),
    dict(fmt="e4m3", granularity="token", rounding=TowardZero()),
    dict(fmt="int8", granularity="block", block_size=0),
])
def test_conflicting_or_unknown_options_raise(kwargs):
  with pytest.raises(ValueError):
    KVQuantSpec(**kwargs)


def test_init_and_write_validation():
  with pytest.raises(ValueError, match="scale is only used"):
    kv_quant.init(KVQuantSpec("e4m3", "token"), (1, 2, 3, 32), scale=1.0)
  with pytest.raises(ValueError, match="shape"):
    kv_quant.init(KVQuantSpec("e4m3", "head"), (1, 2, 3, 32), scale=np.ones(3))
  with pytest.raises(ValueError, match="> 0"):
    kv_quant.init(KVQuantSpec("e4m3", "tensor"), (1, 2, 3, 32), scale=0.0)
  with pytest.raises(ValueError, match="divisible"):
    kv_quant.init(KVQuantSpec("e4m3", "block"), (1, 2, 3, 16))
  with pytest.raises(ValueError, match="divisible"):
    kv_quant.init(KVQuantSpec("nvfp4", "block"), (1, 2, 3, 8))
  cache = kv_quant.init(KVQuantSpec("e4m3", "token", rounding=Stochastic()),
                        (1, 2, 3, 32))
  with pytest.raises(ValueError, match="key"):
    kv_quant.write(cache, jnp.zeros((1, 2, 1, 32)), 0)
  with pytest.raises(ValueError, match=r"\[B=1"):
    kv_quant.write(cache, jnp.zeros((1, 3, 1, 32)), 0, jax.random.key(0))
  with pytest.raises(ValueError, match="per layer"):
    kv_quant.init_cache(2, (1, 2, 3, 32), KVQuantSpec("e4m3", "tensor"), key_scales=[1.0])


@pytest.mark.parametrize("spec", [KVQuantSpec(), KVQuantSpec("bf16"),
                                  KVQuantSpec("e4m3", "token"), KVQuantSpec("int8", "head"),
                                  KVQuantSpec("e5m2", "block")],
                         ids=lambda s: f"{s.fmt}-{s.granularity}")
def test_gradient_is_the_identity_for_fp32_and_zero_otherwise(spec):
  x = jnp.asarray(_data(4, outliers=False)[:1, :, :2])
  loss = lambda x: jnp.sum(kv_quant.read(kv_quant.write(
      kv_quant.init(spec, (1, H, 3, K)), x, 1)) * 3.0)
  grad = np.asarray(jax.grad(loss)(x))
  np.testing.assert_array_equal(grad, 3.0 if spec.fmt == "fp32" else 0.0)
