"""numerics.nf4: the levels against QLoRA's formula, tensors against a NumPy reference.

References: scipy's normal quantiles (QLoRA's create_normal_map), hand-worked blocks,
tests/numerics/codebook_reference.py (NumPy, written from the spec), hand byte counts.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import norm

from lowprec.numerics import memory
from lowprec.numerics import nf4
from tests.numerics import codebook_reference as ref

F32 = np.float32


def _torch_linspace_f32(start, end, steps):
  """torch.linspace in float32: the first half counts up from start, the rest down
  from end (QLoRA built its quantile points with it)."""
  a, b = F32(start), F32(end)
  step = F32((b - a) / F32(steps - 1))
  i = np.arange(steps)
  return np.where(i < steps // 2, a + i.astype(F32) * step,
                  b - (steps - 1 - i).astype(F32) * step).astype(F32)


def _normal_map(linspace, offset=0.9677083):
  """QLoRA's create_normal_map(offset, use_extra_value=True) without the 256 padding."""
  v1 = norm.ppf(np.asarray(linspace(offset, 0.5, 9), np.float64)[:-1])
  v3 = -norm.ppf(np.asarray(linspace(offset, 0.5, 8), np.float64)[:-1])
  v = np.sort(np.concatenate([v1, [0.0], v3]).astype(F32))
  return (v / v.max()).astype(F32)


def test_levels_are_the_published_constants_and_the_normal_quantile_formula():
  np.testing.assert_array_equal(nf4.LEVELS, ref.NF4_PUBLISHED)
  # Bit for bit with the quantile points in float32 as torch.linspace makes them.
  np.testing.assert_array_equal(_normal_map(_torch_linspace_f32), nf4.LEVELS)
  # And within a few ulp whatever linspace rounding is used.
  ulps = np.abs(_normal_map(np.linspace).view(np.int32).astype(np.int64)
                - nf4.LEVELS.view(np.int32).astype(np.int64))
  assert ulps.max() <= 8
  assert nf4.LEVELS[7] == 0.0 and np.sum(nf4.LEVELS < 0) == 7  # asymmetric: 8 positive


def test_hand_worked_block():
  # absmax 2; x / absmax = [0, 0.25, -0.5, 1]: 0.25 < 0.2920 (mid of 0.2461, 0.3379)
  # -> code 10; -0.5 < -0.4600 (mid of -0.5251, -0.3949) -> code 2; 1 -> 15.
  q = nf4.quantize_nf4(jnp.array([0.0, 0.5, -1.0, 2.0]), block_size=4,
                       double_quant=False)
  np.testing.assert_array_equal(np.asarray(q.codes), np.array([0x7A, 0x2F], np.uint8))
  np.testing.assert_array_equal(np.asarray(q.scales), F32([2.0]))
  np.testing.assert_array_equal(
      np.asarray(nf4.dequantize_nf4(q)),
      F32([0.0, 2 * 0.24611230194568634, -2 * 0.5250730514526367, 2.0]))


def test_hand_worked_double_quantization():
  # Block absmaxes 1 and 3: offset 2, centred [-1, 1], scale absmax 1; -1 codes to the
  # signed dynamic map's lowest level -0.99296875 (it has no -1), 1 to 1.0.
  x = jnp.array([[1.0, -0.5], [3.0, 0.0]])
  q = nf4.quantize_nf4(x, block_size=2, axis=1)
  assert float(q.scale_offset) == 2.0
  np.testing.assert_array_equal(np.asarray(q.scale_absmax), F32([1.0]))
  np.testing.assert_array_equal(np.asarray(q.scales), np.array([[0], [255]], np.uint8))
  np.testing.assert_array_equal(np.asarray(nf4.block_scales(q)),
                                F32([[2 - 0.99296875], [3.0]]))


@pytest.mark.parametrize("shape,block,axis,dq,scale_block,pad", [
    ((96, 40), 64, 0, True, 256, True),     # kernel [in, out], in padded to 128
    ((8, 64), 16, -1, True, 8, False),      # several double-quant blocks
    ((3, 5, 32), 32, 2, False, 256, False),
])
def test_quantize_dequantize_equal_reference(shape, block, axis, dq, scale_block, pad):
  rng = np.random.default_rng(0)
  x = (rng.standard_normal(shape) * np.exp2(rng.integers(-8, 8, shape))).astype(F32)
  q = nf4.quantize_nf4(jnp.asarray(x), block_size=block, axis=axis, double_quant=dq,
                       scale_block_size=scale_block, pad=pad)
  codes, scales, deq, absmax, dq_codes = ref.nf4(x, block, axis, dq, scale_block)
  lead = codes.shape[:-1]
  packed = (codes[..., 0::2] << 4) | codes[..., 1::2]  # first element in the high nibble
  np.testing.assert_array_equal(np.asarray(q.codes), packed.astype(np.uint8))
  np.testing.assert_array_equal(np.asarray(nf4.block_scales(q)), scales)
  np.testing.assert_array_equal(np.asarray(nf4.dequantize_nf4(q)), deq)
  if dq:
    np.testing.assert_array_equal(np.asarray(q.scales).reshape(-1), dq_codes)
    assert float(q.scale_offset) == ref.pairwise_mean(absmax.reshape(-1))
  else:
    np.testing.assert_array_equal(np.asarray(q.scales), absmax)
  assert q.codes.shape == (*lead, codes.shape[-1] // 2)


def test_pairwise_mean_is_close_to_the_mean():
  v = np.random.default_rng(3).uniform(0, 5, 1000).astype(F32)
  got = float(nf4.pairwise_mean(jnp.asarray(v)))
  assert got == ref.pairwise_mean(v)
  assert abs(got - np.mean(v.astype(np.float64))) < 1e-6 * np.mean(v)


def test_stored_bytes_match_qlora_figures():
  # 4096 x 256 kernel: codes n/2, one uint8 scale per 64, one float32 per 256 scales,
  # a float32 offset: 4 + 8/64 + 32/16384 bits = 4.127 bits per weight (QLoRA).
  x = jax.ShapeDtypeStruct((4096, 256), jnp.float32)
  q = jax.eval_shape(lambda a: nf4.quantize_nf4(a, axis=0), x)
  n = 4096 * 256
  assert memory.tree_bytes(q) == n // 2 + n // 64 + 4 * (n // 64 // 256) + 4
  assert 8 * memory.tree_bytes(q) / n == pytest.approx(4.127, abs=5e-4)
  q1 = jax.eval_shape(lambda a: nf4.quantize_nf4(a, axis=0, double_quant=False), x)
  assert memory.tree_bytes(q1) == n // 2 + 4 * (n // 64)  # 4.5 bits per weight


def test_error_is_within_half_a_gap_of_the_block_scale():
  x = np.random.default_rng(4).standard_normal((64, 64)).astype(F32)
  q = nf4.quantize_nf4(jnp.asarray(x), axis=0, double_quant=False)
  err = np.abs(np.asarray(nf4.dequantize_nf4(q)) - x)
  half_gap = np.max(np.diff(nf4.LEVELS)) / 2  # 0.1385, between 0.7230 and 1
  absmax = np.max(np.abs(x), axis=0)
  assert np.all(err <= half_gap * absmax[None, :] * (1 + 1e-6))


def test_poisoned_block_and_errors():
  x = np.ones((2, 64), F32)
  x[1, 3] = np.nan
  out = np.asarray(nf4.dequantize_nf4(nf4.quantize_nf4(jnp.asarray(x),
                                                        double_quant=False)))
  assert np.all(out[0] == 1.0) and np.all(np.isnan(out[1]))
  with pytest.raises(ValueError, match="even"):
    nf4.quantize_nf4(jnp.ones(6), block_size=3)
  with pytest.raises(ValueError, match="pad=True"):
    nf4.quantize_nf4(jnp.ones(65))
  with pytest.raises(TypeError):
    nf4.quantize_nf4(jnp.ones(64, jnp.int32))
  with pytest.raises(ValueError, match="axis"):
    nf4.quantize_nf4(jnp.ones(64), axis=1)
  with pytest.raises(TypeError):
    nf4.dequantize_nf4(jnp.ones(4))
