"""numerics.float_bits, bit for bit against NumPy's float32 arithmetic (which keeps
subnormals, where XLA:CPU's float arithmetic flushes them) and exhaustive counts."""

import jax
import jax.numpy as jnp
import numpy as np

from lowprec.numerics import float_bits
from lowprec.numerics import rounding

MOVED = ("leading_zeros", "compose_bits", "round_bits_rn", "split_bits", "ldexp_bits",
         "nonzero_magnitude", "div_rn", "div_rn_idiv", "mul_narrow")


def test_the_moved_names_live_in_float_bits_only():
  """No compatibility names before a first release (docs/changelog.md): the bit
  arithmetic is float_bits', and numerics.rounding no longer re-exports it."""
  for name in MOVED:
    assert callable(getattr(float_bits, name)), name
    assert not hasattr(rounding, name), name


def test_div_rn_is_ieee_division_from_integer_ops():
  """Bit for bit NumPy's float32 division (no flushing) over random bit patterns
  (subnormal operands and results, overflow to Inf) and hand cases."""
  rng = np.random.default_rng(0)
  n = 1 << 16
  a = rng.integers(0, 0x7F800000, n, dtype=np.uint32).view(np.float32)
  b = rng.integers(0, 0x7F800000, n, dtype=np.uint32).view(np.float32)
  near = rng.uniform(0.5, 4.0, (2, n)).astype(np.float32)  # exponents close together
  hand = np.array([[1.0, 3.0], [2688.0, 1.4e-45], [1.0, 3.4028235e38], [6.0, 6.0],
                   [0.0, 5.0], [7.0, 0.0], [1.1754942e-38, 2.0], [3.0, 1.0000001]],
                  np.float32).T
  for x, y in ((a, b), (near[0], near[1]), (a, near[1]), (hand[0], hand[1])):
    got = np.asarray(jax.jit(float_bits.div_rn)(x, y))
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
      want = (x / y).astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_div_rn_idiv_equals_div_rn_and_numpy():
  """The five-division quotient (jnp programs) against the long division (kernels)
  and NumPy's float32 division, bit for bit: random bit patterns, subnormal dividends
  and divisors, exponents close together, NumPy-constant operands and hand cases."""
  rng = np.random.default_rng(2)
  n = 1 << 16
  a = rng.integers(0, 0x7F800000, n, dtype=np.uint32).view(np.float32)
  b = rng.integers(0, 0x7F800000, n, dtype=np.uint32).view(np.float32)
  sub = rng.integers(0, 0x800000, n, dtype=np.uint32).view(np.float32)
  near = rng.uniform(0.5, 4.0, (2, n)).astype(np.float32)
  hand = np.array([[1.0, 3.0], [2688.0, 1.4e-45], [1.0, 3.4028235e38], [6.0, 6.0],
                   [0.0, 5.0], [7.0, 0.0], [1.1754942e-38, 2.0], [3.0, 1.0000001],
                   [16777215.0, 1.0000001], [1.4e-45, 3.4028235e38]], np.float32).T
  pairs = ((a, b), (near[0], near[1]), (sub, b), (a, sub), (sub, near[0]),
           (hand[0], hand[1]))
  for x, y in pairs:
    got = np.asarray(jax.jit(float_bits.div_rn_idiv)(x, y)).view(np.uint32)
    np.testing.assert_array_equal(
        got, np.asarray(jax.jit(float_bits.div_rn)(x, y)).view(np.uint32))
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
      want = (x / y).astype(np.float32).view(np.uint32)
    ok = (x != 0) | (y != 0)  # 0 / 0 is Inf by contract, not NumPy's NaN
    np.testing.assert_array_equal(got[ok], want[ok])
  for c in (np.float32(1.0), np.float32(2688.0)):
    np.testing.assert_array_equal(
        np.asarray(jax.jit(lambda y, c=c: float_bits.div_rn_idiv(c, y))(b)).view(np.uint32),
        np.asarray(jax.jit(lambda y, c=c: float_bits.div_rn(c, y))(b)).view(np.uint32))


def test_leading_zeros_equals_a_numpy_count_on_every_24_bit_word():
  """The clz-free count the Pallas kernels use (Triton cannot lower uint32 clz), held
  exhaustively on n < 2^24 against NumPy's bit length (32 - bit_length(n))."""
  n = np.arange(1 << 24, dtype=np.uint32)
  got = np.asarray(jax.jit(float_bits.leading_zeros)(jnp.asarray(n)))
  want = 32 - np.where(n == 0, 0, np.floor(np.log2(np.maximum(n, 1).astype(np.float64))) + 1)
  np.testing.assert_array_equal(got, want.astype(np.int32))
  assert got.dtype == np.int32


def test_mul_narrow_is_ieee_multiplication_from_integer_ops():
  """Bit for bit NumPy's float32 product (no flushing): a left operand with at most 8
  significant bits (E2M1 x E4M3 values are at most 6) times any finite float32, over
  subnormal operands and results, overflow to Inf, signs and the specials (issue 35:
  NVFP4's subnormal tensor scale was read as zero)."""
  rng = np.random.default_rng(1)
  n = 1 << 18
  sig = rng.integers(0, 256, n).astype(np.float64)
  a = (sig * np.exp2(rng.integers(-157, 120, n)) * rng.choice([-1, 1], n)).astype(
      np.float32)
  b_bits = rng.integers(0, 0x7F800000, n, dtype=np.uint32)
  b_bits = np.where(rng.random(n) < 0.3, b_bits & np.uint32(0x7FFFFF), b_bits)  # subnormal
  b = b_bits.view(np.float32) * rng.choice([-1, 1], n).astype(np.float32)
  m, _ = np.frexp(a.astype(np.float64))
  assert np.all(m * 256 == np.round(m * 256))  # a really has <= 8 significant bits
  specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.5, 2.0 ** -149, 448.0],
                      np.float32)
  sa, sb = (v.ravel() for v in np.meshgrid(specials, specials))
  for x, y in ((a, b), (sa, sb)):
    got = np.asarray(jax.jit(float_bits.mul_narrow)(x, y))
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
      want = (x * y).astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])
  with np.errstate(over="ignore", under="ignore"):
    prod = a * b
  assert np.sum((np.abs(prod) < np.finfo(np.float32).tiny) & (prod != 0)) > 1000


def test_round_bits_rn_rounds_any_uint32_times_a_power_of_two():
  """n * 2^qe to float32, nearest-even, with gradual underflow and overflow to Inf,
  against float64 (exact for n < 2^32) converted by NumPy."""
  rng = np.random.default_rng(2)
  n = rng.integers(0, 2 ** 32, 1 << 18, dtype=np.uint64).astype(np.uint32)
  qe = rng.integers(-190, 110, n.size).astype(np.int32)
  got = np.asarray(jax.jit(float_bits.round_bits_rn)(n, qe))
  with np.errstate(over="ignore"):
    want = (n.astype(np.float64) * np.exp2(qe.astype(np.float64))).astype(np.float32)
  np.testing.assert_array_equal(got, want.view(np.uint32))
