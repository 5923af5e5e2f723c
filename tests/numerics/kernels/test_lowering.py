"""Every kernel lowers for cuda (Triton) and tpu (Mosaic) at production shapes.

Lowering runs each Pallas backend's own lowering and checks on this CPU-only machine
(no compile, no device; see numerics.kernels.lowering). A kernel that stops lowering
for either platform fails here.
"""

import pytest

from lowprec.numerics.kernels import lowering


@pytest.mark.parametrize("platform", lowering.PLATFORMS)
@pytest.mark.parametrize("name", list(lowering.CASES))
def test_kernel_lowers(name, platform):
  err = lowering.lower(name, platform)
  assert err is None, f"{name} does not lower for {platform}: {err}"


def test_cases_cover_every_kernel_and_production_shapes():
  names = " ".join(lowering.CASES)
  for kernel in ("mx_quantize ", "nvfp4_quantize ", "mx_quantize_dequantize ",
                 "nvfp4_quantize_dequantize ", "nvfp4_quantize_dequantize_blocks ",
                 "mx_matmul "):
    assert kernel in names
  assert lowering.QUANTIZE_SHAPE == (8192, 4096) and lowering.MATMUL_SIZE == 4096


@pytest.mark.parametrize("platform", lowering.PLATFORMS)
def test_a_kernel_that_cannot_lower_is_reported(monkeypatch, platform):
  """The check can fail: a block of 24 x 64 is neither a power of two (Triton) nor a
  multiple of (8, 128) or the whole array (TPU)."""
  import jax
  import jax.numpy as jnp
  from jax.experimental import pallas as pl

  from jax.experimental.pallas import triton as pltriton

  def bad(x, params=None):
    def kernel(x_ref, o_ref):
      o_ref[...] = x_ref[...] + 1
    spec = pl.BlockSpec((24, 64), lambda i: (i, 0))
    return pl.pallas_call(kernel, grid=(4,), in_specs=[spec], out_specs=spec,
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          compiler_params=params)(x)

  def both(x):
    return jax.lax.platform_dependent(
        x, cuda=lambda x: bad(x, pltriton.CompilerParams()), tpu=bad)

  from lowprec.numerics.kernels import cases
  monkeypatch.setitem(lowering.CASES, "bad", cases.Case(
      "bad", "bad", both, (jax.ShapeDtypeStruct((96, 128), jnp.float32),), 0))
  assert lowering.lower("bad", platform) is not None
