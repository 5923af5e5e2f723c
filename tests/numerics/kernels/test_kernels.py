"""Pallas kernels against their jnp references, bit for bit.

By default the kernels run in interpret mode (any backend). With
NUMERICS_KERNEL_COMPILED=1 (set by ``python -m numerics.kernels.check``) they run
compiled on the accelerator instead.
"""

import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numerics
from numerics import encoding
from numerics import formats
from numerics import kernels
from numerics import outlier_data

COMPILED = os.environ.get("NUMERICS_KERNEL_COMPILED") == "1"
MODE = dict(interpret=False, use_kernel=True) if COMPILED else dict(interpret=True)


def _x(shape, seed=0, rate=0.01):
  return outlier_data.outlier_data(jax.random.key(seed), shape, rate)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "int8"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_mx_quantize_kernel_matches_reference(fmt, rounding):
  x = _x((64, 128))
  x = x.at[3, 5].set(jnp.nan).at[10, :32].set(0.0)
  key = jax.random.key(1)
  got = kernels.mx_quantize(x, fmt, rounding=rounding, key=key, block_rows=16, **MODE)
  want = numerics.quantize_mx(x, fmt, rounding=rounding, key=key)
  chex.assert_trees_all_equal(got.codes, want.codes)
  chex.assert_trees_all_equal(got.scales, want.scales)


@pytest.mark.parametrize("rule", ["floor", "rceil", "alto"])
def test_mx_quantize_kernel_scale_rules_and_tiling_invariance(rule):
  x = _x((32, 64), seed=2)
  key = jax.random.key(4)
  outs = [kernels.mx_quantize(x, "e2m1", scale_rule=rule, rounding="stochastic", key=key,
                              block_rows=br, **MODE) for br in (1, 8, 32)]
  want = numerics.quantize_mx(x, "e2m1", scale_rule=rule, rounding="stochastic", key=key)
  for got in outs:
    chex.assert_trees_all_equal(got.codes, want.codes)
    chex.assert_trees_all_equal(got.scales, want.scales)


def test_mx_quantize_dispatch_and_errors():
  x = _x((8, 64))
  chex.assert_trees_all_equal(kernels.mx_quantize(x, "e4m3"), numerics.quantize_mx(x, "e4m3"))
  with pytest.raises(ValueError, match="K % 32"):
    kernels.mx_quantize(jnp.ones((4, 40)), "e4m3", **MODE)
  with pytest.raises(ValueError, match="PRNG key"):
    kernels.mx_quantize(x, "e4m3", rounding="stochastic", **MODE)


@pytest.mark.parametrize("fa,fb", [("e4m3", "e4m3"), ("e2m1", "e2m1"), ("e4m3", "e5m2"),
                                   ("int8", "e2m3")])
def test_mx_matmul_kernel_matches_reference(fa, fb):
  a = numerics.quantize_mx(_x((64, 256), 1), fa)
  b = numerics.quantize_mx(_x((256, 96), 2), fb, axis=0)
  blocks = dict(block_m=32, block_n=32, block_k=128)
  got = kernels.mx_matmul(a, b, **blocks, **MODE)
  want = kernels.mx_matmul_reference(a, b, **blocks)
  if COMPILED:  # device MMA units sum in their own order
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-3)
  else:
    chex.assert_trees_all_equal(got, want)
  deq = jnp.dot(numerics.dequantize(a), numerics.dequantize(b),
                precision=jax.lax.Precision.HIGHEST)
  np.testing.assert_allclose(np.asarray(got), np.asarray(deq), rtol=1e-5,
                             atol=1e-5 * float(jnp.max(jnp.abs(deq))))


def test_mx_matmul_exact_on_exactly_summable_operands():
  # Magnitudes in [1, 2): dequantized e4m3 values have 4 significant bits, so every
  # partial sum is exact and any accumulation order gives dequantize(A) @ dequantize(B).
  k1, k2 = jax.random.split(jax.random.key(0))
  a = jax.random.uniform(k1, (32, 128), minval=1, maxval=2) * jnp.sign(
      jax.random.normal(k2, (32, 128)))
  b = jax.random.uniform(k2, (128, 32), minval=1, maxval=2)
  qa, qb = numerics.quantize_mx(a, "e4m3"), numerics.quantize_mx(b, "e4m3", axis=0)
  got = kernels.mx_matmul(qa, qb, block_m=16, block_n=16, block_k=64, **MODE)
  chex.assert_trees_all_equal(got, jnp.dot(numerics.dequantize(qa), numerics.dequantize(qb),
                                           precision=jax.lax.Precision.HIGHEST))


def test_mx_matmul_layout_errors():
  a = numerics.quantize_mx(_x((32, 64)), "e4m3")
  with pytest.raises(ValueError, match="axis 0"):
    kernels.mx_matmul(a, numerics.quantize_mx(_x((64, 32)), "e4m3"), **MODE)
  with pytest.raises(ValueError, match="padded"):
    kernels.mx_matmul(numerics.quantize_mx(_x((32, 40)), "e4m3", pad=True),
                      numerics.quantize_mx(_x((40, 32)), "e4m3", axis=0, pad=True), **MODE)


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "int8"])
def test_arithmetic_decode_equals_table_decode(name):
  f = formats.get(name)
  codes = jnp.arange(2 ** f.bits, dtype=jnp.uint8)
  table = np.asarray(encoding.decode_table(name))
  ok = ~np.isnan(table) & ~np.isinf(table)
  if f.kind == "int":
    ok[128] = False
  for s in (-127, -5, 0, 7):
    got = np.asarray(encoding.decode_arith_scaled(codes, f, s))
    want = np.asarray(encoding.decode_scaled(codes, f, s))
    np.testing.assert_array_equal(got.view(np.uint32)[ok], want.view(np.uint32)[ok])
