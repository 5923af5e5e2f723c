"""Emulated limited-precision accumulation: hand-built sums whose result is known."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec.numerics import accumulation as acc_lib
from lowprec.numerics import operator_snr, qdot, recipes
from lowprec.numerics.rounding import Nearest, Stochastic

DN = (((1,), (0,)), ((), ()))


def _dot(a_k, b_k, acc):
  """Emulated sum of a_k * b_k over k (one output element)."""
  a = jnp.asarray(a_k, jnp.float32)[None, None, :]
  b = jnp.asarray(b_k, jnp.float32)[None, :, None]
  return float(acc_lib.emulated_matmul(a, b, acc)[0, 0, 0])


def test_round_fraction():
  x = jnp.array([1 + 2.0 ** -14, 1 + 2.0 ** -15, -(1 + 3 * 2.0 ** -15), 3.0, jnp.inf])
  np.testing.assert_array_equal(acc_lib.round_fraction(x, 14),
                                [1 + 2.0 ** -14, 1.0, -(1 + 2.0 ** -14), 3.0, jnp.inf])
  np.testing.assert_array_equal(acc_lib.round_fraction(x[:3], 14, Nearest()),
                                [1 + 2.0 ** -14, 1.0, -(1 + 2.0 ** -13)])


def test_small_terms_are_lost_without_promotion_and_kept_with_it():
  # 1 followed by 255 terms of 2^-16: the exact sum is 1 + 255 * 2^-16. A 14-bit
  # accumulator holding 1 truncates every 2^-16 away (its quantum there is 2^-14).
  k = 256
  a = np.full(k, 2.0 ** -16, np.float32)
  a[0] = 1.0
  ones = np.ones(k, np.float32)
  never = acc_lib.Accumulation(fraction_bits=14, promote_every=None)
  assert _dot(a, ones, never) == 1.0
  # Promoting every 128 products: chunk 0 (with the 1) still loses its 127 small
  # terms, chunk 1 sums 128 * 2^-16 = 2^-9 exactly (a small partial sum has a fine
  # quantum) and adds it in float32.
  every128 = acc_lib.Accumulation(fraction_bits=14, promote_every=128)
  assert _dot(a, ones, every128) == 1.0 + 2.0 ** -9
  # float32-wide accumulation keeps everything (255 * 2^-16 is exact in float32).
  assert _dot(a, ones, acc_lib.Accumulation(fraction_bits=23, promote_every=None)) == (
      1.0 + 255 * 2.0 ** -16)


def test_promotion_order_and_ragged_last_chunk():
  # 5 products, promote every 2: partial sums (3, 4), (2^-20 + 2^-20 under 10 bits
  # with 1 in the same chunk is lost), last chunk alone.
  a = np.array([1.0, 2.0, 1.0, 2.0 ** -12, 3.0], np.float32)
  acc = acc_lib.Accumulation(fraction_bits=10, promote_every=2)
  # chunk 0: 1 + 2 = 3; chunk 1: 1 + 2^-12 -> 1 (10 fraction bits); chunk 2: 3.
  assert _dot(a, np.ones(5, np.float32), acc) == 7.0


def test_validation():
  for bad in (dict(fraction_bits=0), dict(fraction_bits=24), dict(promote_every=0),
              dict(rounding=Stochastic())):
    with pytest.raises(ValueError):
      acc_lib.Accumulation(**bad)
  with pytest.raises(TypeError, match="Accumulation"):
    recipes.GemmRecipe(accumulation=14)


def _with_accumulation(base, a):
  base = recipes.get(base)
  gemm = lambda g: recipes.GemmRecipe(g.lhs, g.rhs, g.hadamard, a)
  return recipes.replace(base, name=f"{base.name}+acc", forward=gemm(base.forward),
                         dgrad=gemm(base.dgrad), wgrad=gemm(base.wgrad))


def test_recipe_option_in_quantized_dot_general_and_operator_snr():
  # A float32-wide emulated accumulator reproduces the fp8 recipe's GEMM (to the
  # summation order), in all three GEMMs.
  x = jax.random.normal(jax.random.key(0), (8, 64))
  w = jax.random.normal(jax.random.key(1), (64, 4))
  wide = _with_accumulation("fp8", acc_lib.Accumulation(fraction_bits=23,
                                                        promote_every=None))
  f = lambda r: jax.value_and_grad(
      lambda x, w: jnp.sum(qdot.quantized_dot_general(x, w, DN, r) ** 2), (0, 1))(x, w)
  for got, want in zip(jax.tree.leaves(f(wide)), jax.tree.leaves(f("fp8"))):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # Operator SNR (ALTO's table) of bf16 GEMMs whose accumulator keeps 6 fraction bits:
  # promotion to float32 every 16 products recovers most of what was lost.
  narrow = acc_lib.Accumulation(fraction_bits=6, promote_every=None)
  promoted = acc_lib.Accumulation(fraction_bits=6, promote_every=16)
  base = "bf16"
  s = {name: operator_snr.snr(r, tokens=64, k=256, n=32) for name, r in (
      ("fp32", base), ("6 bits", _with_accumulation(base, narrow)),
      ("6 bits, promote 16", _with_accumulation(base, promoted)))}
  for gemm in ("forward", "dgrad", "wgrad"):
    assert s["fp32"][gemm] > s["6 bits, promote 16"][gemm] + 10 > s["6 bits"][gemm] + 10


def test_with_accumulation_sets_every_gemm_and_validates():
  acc = acc_lib.Accumulation(fraction_bits=14, promote_every=128)
  r = recipes.with_accumulation("mxfp8", acc)
  assert r.name == "mxfp8+acc14"
  assert all(g.accumulation == acc for g in r.gemms)
  assert r.forward.lhs == recipes.get("mxfp8").forward.lhs  # quantizers untouched
  assert r == recipes.replace(_with_accumulation("mxfp8", acc), name="mxfp8+acc14")
  with pytest.raises(TypeError, match="Accumulation"):
    recipes.with_accumulation("mxfp8", 14)
