"""NVFP4's two scale conventions, each bit-exact against a NumPy transcription of its
library's formula (tests/numerics/mx_reference.py), and where they differ.

NVFP4 takes seconds to compile on the CPU, so the tests share one shape (32, 128).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec import numerics
from lowprec.numerics import kernels, outlier_data, quantizer
from lowprec.numerics.rounding import Stochastic

from tests.numerics import mx_reference as ref
from tests.numerics.hash_reference import hash_words_np

SHAPE = (32, 128)


def _bits(a):
  return np.asarray(a, np.float32).view(np.uint32)


def _wide_rows(seed=0):
  """Rows whose magnitudes span e^+-9 (so many blocks sit far below the tensor amax),
  plus an all-zero block, a NaN block and float32-tiny values."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(SHAPE) * np.exp(3 * rng.standard_normal((SHAPE[0], 1)))
  x = x.astype(np.float32)
  x[0, :16] = 0.0
  x[1, 20] = np.nan
  x[2, 32:48] = np.float32(1e-30) * np.arange(16)
  return x


@pytest.fixture(scope="module")
def wide():
  x = _wide_rows()
  return x, (numerics.quantize_nvfp4(jnp.asarray(x)),
             numerics.quantize_nvfp4(jnp.asarray(x), convention="torchao"))


def test_torchao_convention_matches_its_reference(wide):
  x, (_, q) = wide
  codes, scales, pts, deq = ref.quantize_nvfp4_torchao(x)
  np.testing.assert_array_equal(np.asarray(q.codes), codes)
  np.testing.assert_array_equal(np.asarray(q.scales), scales)
  assert float(q.tensor_scale) == float(pts) and q.scale_rule == "nvfp4_torchao"
  np.testing.assert_array_equal(_bits(numerics.dequantize(q)), _bits(deq))


def test_torchao_convention_stochastic_rounding_matches_its_reference():
  x = _wide_rows(1)
  key = jax.random.key(3)
  q = numerics.quantize_nvfp4(jnp.asarray(x), convention="torchao", rounding=Stochastic(),
                              key=key)
  _, scales, _, deq = ref.quantize_nvfp4_torchao(x, rounding="stochastic",
                                                 words=hash_words_np(key, x.shape))
  np.testing.assert_array_equal(np.asarray(q.scales), scales)
  np.testing.assert_array_equal(_bits(numerics.dequantize(q)), _bits(deq))


def test_torchao_convention_2d_tiles():
  x = _wide_rows(2)
  q = numerics.quantize_nvfp4(jnp.asarray(x), block_shape=(16, 16), convention="torchao")
  _, scales, _, deq = ref.quantize_nvfp4_torchao(ref.tiles_to_rows(x, 16, 16), block=256)
  np.testing.assert_array_equal(np.asarray(q.scales).reshape(-1), scales.reshape(-1))
  np.testing.assert_array_equal(_bits(numerics.dequantize(q)),
                                _bits(ref.rows_to_tiles(deq, *SHAPE, 16, 16)))


def test_te_and_torchao_differ_only_in_blocks_with_tiny_te_scales(wide):
  _, (te, ta) = wide
  # TE's block scale has no lower clamp: below E4M3's smallest normal 2^-6 it is
  # subnormal or zero; torchao raises it to 2^-6 (its E4M3_EPS).
  tiny = np.repeat(np.asarray(te.scale_values()) < 2.0 ** -6, 16, axis=-1)
  differ = np.asarray(te.codes) != np.asarray(ta.codes)
  assert tiny.mean() > 0.05 and differ.any()
  assert not (differ & ~tiny).any()
  # Data without such blocks: the same codes and scales under both conventions.
  y = outlier_data.outlier_data(jax.random.key(0), SHAPE, 0.005)
  a = numerics.quantize_nvfp4(y)
  b = numerics.quantize_nvfp4(y, convention="torchao")
  np.testing.assert_array_equal(np.asarray(a.codes), np.asarray(b.codes))
  np.testing.assert_array_equal(np.asarray(a.scales), np.asarray(b.scales))


def test_torchao_convention_routes_to_jnp_and_validates(wide):
  x, (_, q) = wide
  spec = quantizer.QuantSpec("nvfp4", convention="torchao")
  assert not kernels.kernel_eligible(spec, 2)
  got = kernels.quantize_dequantize(jnp.asarray(x), spec, use_kernel=True)
  np.testing.assert_array_equal(_bits(got), _bits(numerics.dequantize(q)))
  with pytest.raises(ValueError, match="convention"):
    numerics.quantize_nvfp4(jnp.asarray(x), convention="mslk")
  with pytest.raises(ValueError, match="NVFP4 option"):
    quantizer.QuantSpec("e4m3", convention="torchao")
