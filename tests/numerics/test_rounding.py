"""Deterministic rounding (nearest, toward_zero) of numerics.cast against NumPy references.

References are computed in NumPy (ml_dtypes casts, float64 arithmetic): NumPy keeps
float32 subnormals, whereas XLA:CPU float arithmetic flushes them to zero.
"""

import functools
import warnings

import chex
import hypothesis
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from lowprec import numerics
from tests.numerics.format_values import all_values
from lowprec.numerics import formats
from lowprec.numerics.rounding import Stochastic, parse

NAMES = formats.names()
F32_MAX = float(np.finfo(np.float32).max)


# ----------------------------------------------------------------------------- helpers


@functools.lru_cache(maxsize=None)
def _jcast(name, rounding, saturate):
  return jax.jit(lambda x: numerics.cast(x, name, rounding=parse(rounding),
                                         saturate=saturate))


def cast_np(x, name, rounding="nearest", saturate=False):
  """Jitted cast of a 1-D float32 array, padded to a power of two to reuse compilations."""
  x = np.asarray(x, np.float32)
  if x.ndim != 1:
    return np.asarray(_jcast(name, rounding, saturate)(jnp.asarray(x)))
  n = max(64, 1 << int(np.ceil(np.log2(max(x.size, 1)))))
  xp = np.zeros(n, np.float32)
  xp[:x.size] = x
  return np.asarray(_jcast(name, rounding, saturate)(jnp.asarray(xp)))[:x.size]


def assert_same_bits(got, ref, x=None, msg=""):
  """Equal NaN-ness; elsewhere equal float32 bit patterns (so the sign of zero counts)."""
  got = np.asarray(got).astype(np.float32)
  ref = np.asarray(ref).astype(np.float32)
  assert got.shape == ref.shape
  nan_g, nan_r = np.isnan(got), np.isnan(ref)
  bad = (nan_g != nan_r) | (~nan_r & (got.view(np.uint32) != ref.view(np.uint32)))
  if bad.any():
    i = np.flatnonzero(bad.reshape(-1))[:8]
    xs = None if x is None else np.asarray(x).astype(np.float32).reshape(-1)[i]
    raise AssertionError(
        f"{msg}: {bad.sum()} mismatches; x={xs!r} got={got.reshape(-1)[i]!r} "
        f"ref={ref.reshape(-1)[i]!r}")


def ref_nearest(x, name, saturate=False):
  """RNE reference: ml_dtypes' NumPy cast (int8: rint then clip), our NaN policy."""
  f = formats.get(name)
  x = np.asarray(x, np.float32)
  with warnings.catch_warnings(), np.errstate(all="ignore"):
    warnings.simplefilter("ignore")
    if f.kind == "int":
      r = np.clip(np.rint(x.astype(np.float64)), -127, 127).astype(np.float32)
    else:
      xin = x
      if saturate:
        clipped = np.clip(x, np.float32(-f.max), np.float32(f.max))
        xin = np.where(np.isinf(x), x, clipped) if f.has_inf else clipped
      r = xin.astype(f.np_dtype).astype(np.float32)
  if not f.has_nan:  # documented policy: NaN in -> NaN out (ml_dtypes gives -0/0)
    r = np.where(np.isnan(x), np.float32(np.nan), r)
  return r


def ref_toward_zero(x, name, saturate=False):
  """Truncate |x| to the format's grid, from the definition, in float64."""
  f = formats.get(name)
  x = np.asarray(x, np.float32)
  with np.errstate(invalid="ignore"):
    xd = x.astype(np.float64)
  neg = np.signbit(xd)
  a = np.where(np.isfinite(xd), np.abs(xd), 0.0)
  _, e = np.frexp(a)
  e = e - 1  # floor(log2 a) for a > 0 (exact: float64 holds float32 subnormals)
  if f.kind == "int":
    t = np.minimum(np.floor(a), f.max)
  elif f.kind == "scale":
    t = np.maximum(np.ldexp(1.0, e), 2.0 ** -127)
  else:
    q = np.ldexp(1.0, np.maximum(e, f.emin) - f.man_bits)
    t = np.minimum(np.floor(a / q) * q, f.max)  # RTZ never overflows past max
  if f.has_inf:
    inf_val = np.inf
  elif saturate or not f.has_nan:
    inf_val = f.max
  else:
    inf_val = np.nan
  t = np.where(np.isinf(xd), inf_val, t)
  t = np.where(np.isnan(xd), np.nan, t)
  out = np.where(neg, -t, t)
  if f.kind == "scale":
    out = np.where(neg | (xd == 0), np.nan, out)
  return out.astype(np.float32)




def boundary_inputs(name):
  """Grid points, all midpoints (RNE ties), and their float32 neighbours; specials."""
  f = formats.get(name)
  v = np.unique(all_values(name))
  q_top = (v[-1] - v[-2])
  extra = [f.max + q_top / 2, f.max + q_top, 2 * f.max, f.max + q_top * 1.5]
  mids = (v[:-1] + v[1:]) / 2
  pts = np.concatenate([v, mids, extra, -np.asarray(extra)])
  pts = pts[np.abs(pts) <= F32_MAX].astype(np.float32)
  up = np.nextafter(pts, np.float32(np.inf))
  down = np.nextafter(pts, np.float32(-np.inf))
  specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, F32_MAX, -F32_MAX,
                       1e-45, -1e-45, 1.1754942e-38, -1.1754942e-38], np.float32)
  return np.concatenate([pts, up, down, -pts, specials]).astype(np.float32)


def all_bf16_as_f32():
  return (np.arange(2 ** 16, dtype=np.uint32) << 16).view(np.float32)


def random_f32(seed, n=1 << 16):
  rng = np.random.default_rng(seed)
  bits = rng.integers(0, 2 ** 32, size=n, dtype=np.uint64).astype(np.uint32)
  sub = rng.integers(0, 2 ** 23, size=n // 4, dtype=np.uint32)  # float32 subnormals
  sub |= rng.integers(0, 2, size=n // 4, dtype=np.uint32) << 31
  # log-uniform magnitudes over the range of the 8-bit-and-narrower formats
  mag = np.exp2(rng.uniform(-30, 20, size=n)).astype(np.float32)
  mag *= rng.choice(np.array([-1, 1], np.float32), size=n)
  return np.concatenate([bits.view(np.float32), sub.view(np.float32), mag])


# ----------------------------------------------------------------------------- nearest


@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_nearest_all_bf16_patterns(name, saturate):
  x = all_bf16_as_f32()
  assert_same_bits(cast_np(x, name, "nearest", saturate), ref_nearest(x, name, saturate),
                   x, f"{name} sat={saturate}")


@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_nearest_random_and_boundaries(name, saturate):
  x = np.concatenate([random_f32(hash(name) % 1000), boundary_inputs(name)])
  assert_same_bits(cast_np(x, name, "nearest", saturate), ref_nearest(x, name, saturate),
                   x, f"{name} sat={saturate}")


@pytest.mark.parametrize("name,x,expected", [
    # e4m3: 464 is the midpoint between 448 (even) and 480 (not a value): RNE -> 448;
    # just above it overflows -> NaN (no Inf in float8_e4m3fn).
    ("e4m3", 464.0, 448.0), ("e4m3", 465.0, np.nan), ("e4m3", -464.0, -448.0),
    ("e4m3", 449.0, 448.0), ("e4m3", np.inf, np.nan), ("e4m3", 1.0625, 1.0),
    ("e4m3", 1.1875, 1.25), ("e4m3", 2.0 ** -10, 0.0), ("e4m3", -(2.0 ** -10), -0.0),
    ("e4m3", 1.5 * 2.0 ** -10, 2.0 ** -9),
    # e5m2: the midpoint 61440 ties to the odd max 57344 -> away -> Inf.
    ("e5m2", 59392.0, 57344.0), ("e5m2", 61440.0, np.inf), ("e5m2", -61440.0, -np.inf),
    ("e2m3", 7.75, 7.5), ("e2m3", 100.0, 7.5), ("e2m3", -np.inf, -7.5),
    ("e2m3", np.nan, np.nan), ("e3m2", 1e9, 28.0), ("e3m2", np.nan, np.nan),
    ("e2m1", 5.0, 4.0), ("e2m1", 5.0001, 6.0), ("e2m1", 0.25, 0.0), ("e2m1", 0.2500001, 0.5),
    ("e2m1", np.inf, 6.0), ("e2m1", np.nan, np.nan),
    ("int8", 2.5, 2.0), ("int8", 3.5, 4.0), ("int8", -2.5, -2.0), ("int8", 126.5, 126.0),
    ("int8", 127.5, 127.0), ("int8", -1000.0, -127.0), ("int8", np.inf, 127.0),
    ("int8", -0.4, -0.0), ("int8", np.nan, np.nan),
    ("e8m0", 1.5, 2.0), ("e8m0", 3.0, 4.0), ("e8m0", 6.0, 8.0), ("e8m0", 0.75, 1.0),
    ("e8m0", 1.4999999, 1.0), ("e8m0", 0.0, np.nan), ("e8m0", -1.0, np.nan),
    ("e8m0", 2.0 ** -130, 2.0 ** -127), ("e8m0", 1.5 * 2.0 ** -127, 2.0 ** -126),
    ("e8m0", np.inf, np.nan), ("e8m0", 1.5 * 2.0 ** 127, np.nan),
    ("fp16", 65520.0, np.inf), ("fp16", 65519.0, 65504.0), ("fp16", 2.0 ** -25, 0.0),
    ("fp16", 2.0 ** -25 * 1.5, 2.0 ** -24),
    ("bf16", 1.0 + 2.0 ** -8, 1.0), ("bf16", 1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -6),
])
def test_nearest_hand_examples(name, x, expected):
  got = cast_np(np.array([x], np.float32), name, "nearest", saturate=False)
  assert_same_bits(got, np.array([expected], np.float32), [x], name)


@pytest.mark.parametrize("name", NAMES)
def test_saturate_overflow_goes_to_max(name):
  f = formats.get(name)
  big = np.array([f.max * 1.01, f.max * 4, 1e38, F32_MAX, np.inf], np.float64)
  with np.errstate(over="ignore"):
    big = big.astype(np.float32)
  big = big[big > f.max]
  x = np.concatenate([big, -big]) if f.signed else big
  got = cast_np(x, name, "nearest", saturate=True)
  expect = np.where(np.isinf(x) & f.has_inf, x, np.sign(x) * np.float32(f.max))
  assert_same_bits(got, expect.astype(np.float32), x, name)
  # never beyond max for any finite input
  y = cast_np(random_f32(7), name, "nearest", saturate=True)
  assert np.all(np.abs(y[np.isfinite(y)]) <= f.max)


def test_saturate_false_overflow_policy():
  x = np.array([1e6, -1e6, np.inf, -np.inf], np.float32)
  expect = {
      "e4m3": [np.nan] * 4,
      "e5m2": [np.inf, -np.inf, np.inf, -np.inf],
      "bf16": [1e6, -1e6, np.inf, -np.inf],  # 1e6 fits in bf16 range
      "fp16": [np.inf, -np.inf, np.inf, -np.inf],
      "e2m3": [7.5, -7.5, 7.5, -7.5],
      "e3m2": [28, -28, 28, -28],
      "e2m1": [6, -6, 6, -6],
      "int8": [127, -127, 127, -127],
      "e8m0": [2.0 ** 20, np.nan, np.nan, np.nan],
  }
  for name, e in expect.items():
    got = cast_np(x, name, "nearest", saturate=False)
    ref = np.asarray(e, np.float32)
    if name == "bf16":
      ref = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert_same_bits(got, ref, x, name)


_FLOATS = hnp.arrays(
    np.float32, (64,),
    elements=st.floats(width=32, allow_nan=True, allow_infinity=True,
                       allow_subnormal=True))


@hypothesis.settings(max_examples=50, deadline=None, derandomize=True)
@hypothesis.given(x=_FLOATS, name=st.sampled_from(NAMES), saturate=st.booleans())
def test_nearest_property_random_floats(x, name, saturate):
  assert_same_bits(cast_np(x, name, "nearest", saturate), ref_nearest(x, name, saturate),
                   x, name)


@pytest.mark.parametrize("name", NAMES)
def test_grid_points_are_fixed_points(name):
  v = all_values(name).astype(np.float32)
  for rounding in ("nearest", "toward_zero"):
    for saturate in (False, True):
      assert_same_bits(cast_np(v, name, rounding, saturate), v, v, f"{name} {rounding}")


# ----------------------------------------------------------------------------- toward_zero


@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_toward_zero_against_definition(name, saturate):
  x = np.concatenate([all_bf16_as_f32(), random_f32(11, 1 << 14), boundary_inputs(name)])
  assert_same_bits(cast_np(x, name, "toward_zero", saturate),
                   ref_toward_zero(x, name, saturate), x, f"{name} sat={saturate}")


def test_toward_zero_examples():
  x = np.array([1.99, -1.99, 447.9, 479.0, 1e9, 2.0 ** -9 * 1.9], np.float32)
  got = cast_np(x, "e4m3", "toward_zero", saturate=False)
  assert_same_bits(got, np.array([1.875, -1.875, 416, 448, 448, 2.0 ** -9], np.float32))
  got = cast_np(np.array([2.9, -2.9, 5.9, 0.49], np.float32), "e2m1", "toward_zero")
  assert_same_bits(got, np.array([2, -2, 4, 0], np.float32))
  got = cast_np(np.array([3.99, 0.99, 126.9, -0.5], np.float32), "int8", "toward_zero")
  assert_same_bits(got, np.array([3, 0, 126, -0.0], np.float32))
  got = cast_np(np.array([3.99, 0.99, 2.0 ** -127 * 1.9], np.float32), "e8m0",
                "toward_zero")
  assert_same_bits(got, np.array([2, 0.5, 2.0 ** -127], np.float32))


# ----------------------------------------------------------------------------- dtypes


def _all_16bit(dtype):
  return np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16).view(dtype)


@pytest.mark.parametrize("in_dtype", [ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("name", NAMES)
def test_half_precision_inputs(name, in_dtype):
  f = formats.get(name)
  x = _all_16bit(in_dtype)
  if not formats.representable_in(f, in_dtype):
    with pytest.raises(TypeError):
      numerics.cast(jnp.asarray(x), name)
    return
  x32 = x.astype(np.float32)
  for rounding, ref_fn, saturate in (("nearest", ref_nearest, False),
                                     ("nearest", ref_nearest, True),
                                     ("toward_zero", ref_toward_zero, False)):
    y = _jcast(name, rounding, saturate)(jnp.asarray(x))
    assert y.dtype == jnp.dtype(in_dtype)
    assert_same_bits(np.asarray(y).astype(np.float32), ref_fn(x32, name, saturate), x32,
                     f"{name} {rounding} {in_dtype}")


def test_not_representable_type_errors():
  xb = jnp.ones((4,), jnp.bfloat16)
  xh = jnp.ones((4,), jnp.float16)
  with pytest.raises(TypeError):
    numerics.cast(xb, "fp16")
  with pytest.raises(TypeError):
    numerics.cast(xh, "bf16")
  with pytest.raises(TypeError):
    numerics.cast(xh, "e8m0")
  with pytest.raises(TypeError):
    numerics.cast_with_words(xh, "bf16", jnp.zeros((4,), jnp.uint32))
  # but fine from float32
  numerics.cast(xh.astype(jnp.float32), "bf16")


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.int8, jnp.uint32, jnp.bool_])
def test_integer_input_rejected(dtype):
  x = jnp.ones((4,), dtype)
  with pytest.raises(TypeError):
    numerics.cast(x, "e4m3")
  with pytest.raises(TypeError):
    numerics.cast_with_words(x, "e4m3", jnp.zeros((4,), jnp.uint32))


# ----------------------------------------------------------------------------- errors


def test_argument_errors():
  x = jnp.ones((4,), jnp.float32)
  with pytest.raises(ValueError, match="rounding"):
    numerics.cast(x, "e4m3", rounding=parse('up'))
  with pytest.raises(ValueError):
    numerics.cast(x, "e4m3", rounding=Stochastic())  # no key
  with pytest.raises(ValueError):
    numerics.cast(x, "nope")
  with pytest.raises(TypeError):
    numerics.cast(x, 3)
  key = jax.random.key(0)
  for bad in (0, 33, -1, 2.5, "4"):
    with pytest.raises(ValueError):
      numerics.cast(x, "e4m3", rounding=Stochastic(bits=bad), key=key)
    with pytest.raises(ValueError):
      numerics.cast_with_words(x, "e4m3", jnp.zeros((4,), jnp.uint32), rand_bits=bad)
  with pytest.raises(ValueError):
    numerics.cast(x, "e4m3", rounding=Stochastic(rng="mersenne"), key=key)
  with pytest.raises(TypeError):
    numerics.cast_with_words(x, "e4m3", jnp.zeros((4,), jnp.int32))
  with pytest.raises(TypeError):
    numerics.cast_with_words(x, "e4m3", jnp.zeros((5,), jnp.uint32))
  with pytest.raises(TypeError):
    numerics.cast_with_words(x, "e4m3", jnp.zeros((4, 1), jnp.uint32))
  # valid edges are accepted
  numerics.cast(x, "e4m3", rounding=Stochastic(bits=1), key=key)
  numerics.cast(x, "e4m3", rounding=Stochastic(bits=32), key=key)
  numerics.cast(x, "e4m3", rounding=Stochastic(bits=np.int32(8)), key=key)


# ----------------------------------------------------------------------------- transforms


@pytest.mark.parametrize("name", NAMES)
def test_jit_eager_vmap_identical(name):
  b = boundary_inputs(name)
  x = np.concatenate([random_f32(3, 1 << 8)[:256], np.resize(b, 256)]).reshape(8, 64)
  xj = jnp.asarray(x)
  key = jax.random.key(42)
  for rounding in ("nearest", "toward_zero", "stochastic"):
    kw = dict(rounding=parse(rounding), saturate=False)
    if rounding == "stochastic":
      kw["key"] = key
    with jax.disable_jit():  # op by op, whatever jit decorators the library uses
      eager = np.asarray(numerics.cast(xj, name, **kw))
    jitted = np.asarray(jax.jit(lambda v: numerics.cast(v, name, **kw))(xj))
    chex.assert_trees_all_equal(eager.view(np.uint32), jitted.view(np.uint32))
    if rounding != "stochastic":
      assert_same_bits(eager, (ref_nearest if rounding == "nearest" else ref_toward_zero)(
          x, name), x, f"{name} {rounding} eager")
      vm = jax.jit(jax.vmap(lambda v: numerics.cast(v, name, **kw)))(xj)
      chex.assert_trees_all_equal(np.asarray(vm).view(np.uint32), eager.view(np.uint32))
  # stochastic under vmap: each row is cast as its own array (same key -> same words)
  f = jax.jit(jax.vmap(lambda v: numerics.cast(v, name, rounding=Stochastic(), key=key)))
  vm = np.asarray(f(xj))
  g = jax.jit(lambda v: numerics.cast(v, name, rounding=Stochastic(), key=key))
  rows = np.stack([np.asarray(g(jnp.asarray(r))) for r in x])
  chex.assert_trees_all_equal(vm.view(np.uint32), rows.view(np.uint32))


def test_format_object_accepted():
  x = jnp.asarray(np.linspace(-3, 3, 64, dtype=np.float32))
  for name in ("e4m3", "e2m3", "int8"):
    a = np.asarray(numerics.cast(x, formats.get(name), saturate=False))
    b = np.asarray(numerics.cast(x, name, saturate=False))
    assert_same_bits(a, b, np.asarray(x), name)


def test_scalar_and_shapes():
  for shape in [(), (1,), (3, 5), (2, 3, 4)]:
    x = np.full(shape, 1.3, np.float32)
    y = _jcast("e4m3", "nearest", True)(jnp.asarray(x))
    chex.assert_shape(y, shape)
    chex.assert_type(y, jnp.float32)
    np.testing.assert_array_equal(np.asarray(y), np.full(shape, 1.25, np.float32))
  y = _jcast("e2m1", "nearest", True)(jnp.zeros((0, 3), jnp.float32))
  chex.assert_shape(y, (0, 3))
  y = jax.jit(lambda v: numerics.cast(v, "e2m1", rounding=Stochastic(),
                                      key=jax.random.key(0)))(jnp.zeros((0, 3)))
  chex.assert_shape(y, (0, 3))
