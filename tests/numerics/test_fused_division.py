"""numerics.fused_division and the NVFP4 scale chain built on it, against NumPy's
IEEE float32 (subnormals included), with the backend's division estimate exact and
perturbed by up to 16 ulps, 2^-20 (XLA:GPU's ``div.full.f32`` is within 2)."""

import jax
import jax.numpy as jnp
from jax import lax
import ml_dtypes
import numpy as np
import pytest

from lowprec.numerics import fused_division
from lowprec.numerics import nvfp4
from lowprec.numerics import nvfp4_fast
from lowprec.numerics import nvfp4_te

_FLT_MAX = np.float32(np.finfo(np.float32).max)
_E4M3 = np.arange(127, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


@pytest.fixture(params=[0, 3, 8, -8, 16, -16], ids=lambda u: f"estimate{u:+d}ulp")
def perturbed(request, monkeypatch):
  """The reciprocal estimate moved by a fixed number of ulps."""
  ulps = request.param
  exact = fused_division._reciprocal_estimate  # pylint: disable=protected-access

  def estimate(x):
    bits = lax.bitcast_convert_type(exact(x), jnp.int32)
    return lax.bitcast_convert_type(bits + np.int32(ulps), jnp.float32)

  monkeypatch.setattr(fused_division, "_reciprocal_estimate", estimate)
  return ulps


def _bits(rng, n, lo, hi):
  return rng.integers(lo, hi, n, dtype=np.uint32)


def _edges():
  return np.array([1, 2, 3, 0x7FFFFF, 0x800000, 0x800001, 0xFFFFFF, 0x3F800000,
                   0x3F800001, 0x3FFFFFFF, 0x7E800000, 0x7E800001, 0x7F000000,
                   0x7F7FFFFF, 0x00400000, 0x00000001], np.uint32)


def test_reciprocal_equals_numpy_on_normals_subnormals_and_overflow(perturbed):
  rng = np.random.default_rng(0)
  bits = np.concatenate([_bits(rng, 200_000, 1, 0x7F800000),
                         _bits(rng, 50_000, 1, 0x00800000), _edges()])
  f = jax.jit(lambda b: fused_division.reciprocal_bits(
      b, subnormal_in=True, subnormal_out=True, overflow=True))
  with np.errstate(over="ignore"):
    want = (np.float32(1.0) / bits.view(np.float32)).view(np.uint32)
  np.testing.assert_array_equal(np.asarray(f(bits)), want)
  assert (want < 0x800000).sum() > 1000 and (want == 0x7F800000).sum() > 1000


def test_reciprocal_of_zero_is_inf():
  out = fused_division.reciprocal_bits(jnp.zeros(2, jnp.uint32), subnormal_in=True,
                                       subnormal_out=False, overflow=True)
  np.testing.assert_array_equal(np.asarray(out), [0x7F800000] * 2)


@pytest.mark.parametrize("c", [2688.0, 1.0, 3.0, 0.1, 6.0e37])
def test_constant_over_normal_equals_numpy(perturbed, c):
  rng = np.random.default_rng(1)
  bits = np.concatenate([_bits(rng, 100_000, 0x00800000, 0x7F800000),
                         _edges()[_edges() >= 0x800000]])
  f = jax.jit(lambda b: fused_division.constant_over_bits(
      c, b, subnormal_out=True, overflow=True))
  with np.errstate(over="ignore"):
    want = (np.float32(c) / bits.view(np.float32)).view(np.uint32)
  np.testing.assert_array_equal(np.asarray(f(bits)), want)


@pytest.mark.parametrize("lead", [24, 26, 29])
@pytest.mark.parametrize("inexact", [False, True])
def test_round_bits_equals_numpy_cast(lead, inexact):
  """``(n + f) 2^e`` rounded once: NumPy's float64 -> float32 cast of the exact value
  (``f = 2^-20`` when inexact, exact in float64 for n < 2^30)."""
  rng = np.random.default_rng(2)
  n = rng.integers(1 << lead, 1 << (lead + 2), 40_000, dtype=np.uint32)
  n[:4] = [1 << lead, (1 << (lead + 2)) - 1, (1 << (lead + 1)) | 1, 3 << (lead - 1)]
  e = rng.integers(-200, 110, n.size).astype(np.int32)
  f = jax.jit(lambda n, e: fused_division.round_bits(
      n, lead, e, jnp.full(n.shape, inexact), subnormal=True, overflow=True))
  exact = (n.astype(np.float64) + (2.0 ** -20 if inexact else 0.0)) * np.exp2(
      e.astype(np.float64))
  with np.errstate(over="ignore"):
    want = exact.astype(np.float32).view(np.uint32)
  np.testing.assert_array_equal(np.asarray(f(n, e)), want)


def _numpy_tensor_scales(amax_bits):
  a = amax_bits.view(np.float32)
  with np.errstate(over="ignore", divide="ignore"):
    s = np.minimum(np.float32(2688.0) / a, _FLT_MAX)
  s = np.where(a == 0, np.float32(1.0), s).astype(np.float32)
  return s, (np.float32(1.0) / s).astype(np.float32)


def test_tensor_scale_equals_numpy_also_for_tiny_tensors(perturbed):
  rng = np.random.default_rng(3)
  bits = np.concatenate([_bits(rng, 100_000, 0, 0x7F800000),
                         _bits(rng, 100_000, 0, 0x06000000), _edges(),
                         np.zeros(1, np.uint32)])
  s, inv = jax.jit(jax.vmap(nvfp4_te.tensor_scale_of_amax))(bits.astype(np.int32))
  want_s, want_inv = _numpy_tensor_scales(bits)
  np.testing.assert_array_equal(np.asarray(s).view(np.uint32), want_s.view(np.uint32))
  np.testing.assert_array_equal(np.asarray(inv).view(np.uint32),
                                want_inv.view(np.uint32))
  assert (want_inv.view(np.uint32) < 0x800000).sum() > 1000  # subnormal 1/S_enc


def test_enc_table_equals_numpy(perturbed):
  """Every 1/S_enc the chain can give (S_enc in [2^-117, FLT_MAX])."""
  rng = np.random.default_rng(4)
  amax = np.concatenate([_bits(rng, 3000, 1, 0x7F800000),
                         _bits(rng, 3000, 1, 0x06000000)])
  _, inv = _numpy_tensor_scales(amax)
  table = np.asarray(jax.jit(jax.vmap(nvfp4_fast.enc_table))(inv))
  with np.errstate(over="ignore", divide="ignore"):
    want = np.minimum(np.float32(1.0) / (_E4M3[None, :] * inv[:, None]), _FLT_MAX)
  np.testing.assert_array_equal(table.view(np.uint32), want.view(np.uint32))


def test_nvfp4_scale_chain_compiles_without_integer_division():
  """XLA:CPU kept each integer division of the old chain out of fusions, each one a
  fusion that recomputed the steps before it (22 fusions, 1,321 instructions for one
  operand); the fused chain has none."""
  x = jax.ShapeDtypeStruct((512, 64), jnp.float32)
  text = jax.jit(lambda x: nvfp4.quantize_dequantize_nvfp4_blocks(x)).lower(
      x).compile().as_text()
  divisions = [line for line in text.splitlines()
               if " divide(" in line and ("u32[" in line.split("=")[1][:8]
                                          or "s32[" in line.split("=")[1][:8])]
  assert not divisions, divisions[:3]
