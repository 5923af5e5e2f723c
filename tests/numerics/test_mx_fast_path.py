"""The MX fast path (``numerics.mx_fast``, float-arithmetic elements) bit for bit.

``quantize_mx`` and ``quantize_dequantize_mx`` run :func:`numerics.mx_fast.quantize`;
the Pallas kernels run the integer reference cores
(:func:`numerics.blockscale.mx_quantize_core`,
:func:`numerics.blockscale.mx_quantize_dequantize_core`). These tests hold the fast path
equal to both cores and to the independent NumPy reference
(``tests/numerics/mx_reference.py``, stochastic rounding on the NumPy transcription of
the hash words) for every MX element format, scale rule and rounding, on inputs built
to reach every branch: float32 subnormals (alone and beside normal values in one
block), zeros of both signs, NaN and +-Inf blocks, values at the saturation edge
(``max``, the rounding boundary above it, ``2^(emax+1)``'s neighbours), exact ties of
every grid, and block gains from 2^-150 to 2^120.
"""

import functools

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from lowprec import numerics
from lowprec.numerics import blockscale
from lowprec.numerics import formats
from lowprec.numerics import mx_fast
from lowprec.numerics import random_bits
from lowprec.numerics.rounding import parse
from tests.numerics import hash_reference
from tests.numerics import mx_reference as ref

MX = blockscale.MX_ELEMENT_FORMATS
RULES = blockscale.SCALE_RULES
# (rounding, rand_bits); stochastic with every word bit and with a few.
ROUNDINGS = (("nearest", None), ("toward_zero", None), ("stochastic", None),
             ("stochastic", 3))
_B = blockscale.MX_BLOCK
_ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
       "e2m3": ml_dtypes.float6_e2m3fn, "e3m2": ml_dtypes.float6_e3m2fn,
       "e2m1": ml_dtypes.float4_e2m1fn}


def _grid(name: str) -> np.ndarray:
  """The format's non-negative finite values, increasing (float64)."""
  if name == "int8":
    return np.arange(128, dtype=np.float64)
  nbits = formats.get(name).bits
  v = np.arange(2 ** nbits, dtype=np.uint8).view(_ML[name]).astype(np.float64)
  return np.unique(np.abs(v[np.isfinite(v)]))


def _tie_block(name: str, rng) -> np.ndarray:
  """32 values: ``max`` (so floor and rceil give the block scale 1) and 31 exact
  midpoints of consecutive grid values, with random signs."""
  g = _grid(name)
  mids = (g[:-1] + g[1:]) / 2
  pick = rng.choice(mids, _B - 1, replace=len(mids) < _B - 1)
  v = np.concatenate([[formats.get(name).max], pick])
  return v * rng.choice([-1.0, 1.0], _B)


def _edge_block(name: str) -> np.ndarray:
  """32 values around saturation at block scale 1 (floor): ``max`` and its float32
  neighbours, the rounding boundary between ``max`` and the next binade step and its
  neighbours, and the largest float32 below ``2^(emax+1)`` (the block amax)."""
  f = formats.get(name)
  top = np.float32(2.0 ** (f.emax + 1))
  g = _grid(name)
  step = g[-1] - g[-2]
  mx, bound = np.float32(f.max), np.float32(f.max + step / 2)
  vals = [mx, np.nextafter(mx, np.float32(0)), np.nextafter(mx, top), bound,
          np.nextafter(bound, np.float32(0)), np.nextafter(bound, top),
          np.nextafter(top, np.float32(0)), np.float32(f.max - step / 2)]
  v = np.array(vals * (_B // len(vals)), np.float64)
  v[1::2] *= -1
  return v


def _special_tensor(name: str, seed: int, rows: int, n: int, log2_gain: int
                    ) -> np.ndarray:
  """float32 ``(rows, n)``, blocks of 32 along the last axis: N(0,1) blocks with gains
  2^-60..2^60 times ``2^log2_gain`` and blocks replaced by zeros, negative zeros,
  float32 subnormals only, a mix of subnormals, zeros and normals, exact ties,
  saturation-edge values (each scaled by a power of two) or one NaN/Inf."""
  rng = np.random.default_rng(seed)
  xb = rng.standard_normal((rows, n // _B, _B)) * np.exp2(
      rng.integers(-60, 61, (rows, n // _B, 1)) + log2_gain)
  kind = rng.integers(0, 14, (rows, n // _B))
  xb[kind == 0] = 0.0
  xb[kind == 1] = -0.0
  for r, b in zip(*np.nonzero(kind == 2)):  # subnormals only, down to 2^-149
    xb[r, b] = (rng.integers(-2 ** 23, 2 ** 23, _B) >> rng.integers(0, 23, _B)
                ) * 2.0 ** -149
  for r, b in zip(*np.nonzero(kind == 3)):  # subnormals beside normals and zeros
    mix = rng.integers(0, 3, _B)
    xb[r, b] = np.where(mix == 0, rng.integers(-2 ** 23, 2 ** 23, _B) * 2.0 ** -149,
                        np.where(mix == 1, 0.0, xb[r, b]))
  gains = np.exp2(rng.integers(-40, 41, (rows, n // _B)) + log2_gain)
  for r, b in zip(*np.nonzero(kind == 4)):
    xb[r, b] = _tie_block(name, rng) * gains[r, b]
  for r, b in zip(*np.nonzero(kind == 5)):
    xb[r, b] = _edge_block(name) * gains[r, b]
  with np.errstate(over="ignore"):
    x = xb.astype(np.float32).reshape(rows, n)
  for code, v in ((6, np.nan), (7, np.inf), (8, -np.inf)):
    r, b = np.nonzero(kind == code)
    x[r, b * _B + rng.integers(0, _B, r.shape)] = v
  return x


def _bits(a) -> np.ndarray:
  a = np.asarray(a)
  return a.view(np.uint32) if a.dtype == np.float32 else a


def _assert_equal(got, want, what):
  got, want = np.asarray(got), np.asarray(want)
  assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype,
                                                               want.dtype)
  np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=what)


# ---------------------------------------------- fast path vs the integer reference cores


def _all_rules(x, key, *, name, axes, blocks, fast):
  """Every (scale rule, rounding) of format ``name`` on ``x``:
  ``{"rule/rounding/rand_bits": (codes, scale codes, dequantized)}``."""
  f = formats.get(name)
  words = random_bits.random_words(key, x.shape)
  out = {}
  for rule in RULES:
    for rounding, rand_bits in ROUNDINGS:
      w = words if rounding == "stochastic" else None
      r = parse(rounding, bits=rand_bits)
      if fast:
        codes, scales = mx_fast.quantize(x, f, axes, blocks, rule, r, w,
                                         dequantize=False)
        deq = mx_fast.quantize(x, f, axes, blocks, rule, r,
                               (lambda: words) if w is not None else None,
                               dequantize=True)
      else:
        codes, scales = blockscale.mx_quantize_core(x, f, axes, blocks, rule, r, w)
        deq = blockscale.mx_quantize_dequantize_core(x, f, axes, blocks, rule, r, w)
      out[f"{rule}/{rounding}/{rand_bits}"] = (codes, scales, deq)
  return out


# The fast path compiled, as users run it (one program per format and layout); the
# integer cores op by op, which compiles each primitive once for the whole file.
_fast_jit = jax.jit(functools.partial(_all_rules, fast=True),
                    static_argnames=("name", "axes", "blocks"))


def _assert_fast_equals_cores(x, name, axes=(1,), blocks=(_B,), seed=0):
  kw = dict(name=name, axes=axes, blocks=blocks)
  key = jax.random.key(seed)
  fast = _fast_jit(jnp.asarray(x), key, **kw)
  with jax.disable_jit():
    core = _all_rules(jnp.asarray(x), key, fast=False, **kw)
  for case, got in fast.items():
    for what, a, b in zip(("codes", "scales", "dequantized"), got, core[case]):
      _assert_equal(a, b, f"{name} {case} {what}")


_SHAPE = (16, 64)  # one shape for every comparison: one fast-path program per format


@pytest.mark.parametrize("name", MX)
def test_fast_path_equals_integer_cores_on_specials(name):
  _assert_fast_equals_cores(_special_tensor(name, 1, *_SHAPE, 0), name)


@pytest.mark.parametrize("axes,blocks", [((0,), (_B,)), ((0, 1), (8, 16))])
def test_fast_path_equals_integer_cores_other_layouts(axes, blocks):
  """Blocks down the columns and 2D tiles (the element pass is the same for every
  format: the layout is the block amax's business)."""
  x = _special_tensor("e4m3", 4, *_SHAPE, 0)
  if axes == (0,):
    x = np.ascontiguousarray(x.reshape(_SHAPE[::-1]))
  _assert_fast_equals_cores(x, "e4m3", axes, blocks)


@hypothesis.settings(max_examples=12, deadline=None)
@hypothesis.given(st.integers(0, 2 ** 31 - 1), st.integers(-150, 120),
                  st.sampled_from(MX))
def test_fast_path_equals_integer_cores_hypothesis(seed, log2_gain, name):
  _assert_fast_equals_cores(_special_tensor(name, seed, *_SHAPE, log2_gain), name,
                            seed=seed)


@hypothesis.settings(max_examples=12, deadline=None)
@hypothesis.given(st.sampled_from(MX), st.lists(
    st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True),
    min_size=64, max_size=64), st.integers(0, 2 ** 31 - 1))
def test_fast_path_equals_integer_cores_on_arbitrary_floats(name, values, seed):
  """Any float32 values at all (hypothesis' float strategy favours zeros, subnormals,
  powers of two and the extremes) in two blocks of the first row, the rest specials."""
  x = _special_tensor(name, seed, *_SHAPE, 0)
  x[0] = np.array(values, np.float32)
  _assert_fast_equals_cores(x, name)


# ------------------------------------------- the public functions vs the NumPy reference


def _public(x, name, rule, rounding, rand_bits, key, axis):
  kw = dict(scale_rule=rule, rounding=parse(rounding, bits=rand_bits), axis=axis)
  if rounding == "stochastic":
    kw.update(key=key)
  q = numerics.quantize_mx(jnp.asarray(x), name, **kw)
  return q, blockscale.quantize_dequantize_mx(jnp.asarray(x), name, **kw)


def _assert_matches_numpy(x, name, rule, rounding, rand_bits, seed, axis=-1):
  key = jax.random.key(seed)
  words = (hash_reference.hash_words_np(key, x.shape) if rounding == "stochastic"
           else None)
  codes, scales, deq = ref.quantize_mx(x, name, rule, axis=axis, rounding=rounding,
                                       words=words, rand_bits=rand_bits)
  q, fused = _public(x, name, rule, rounding, rand_bits, key, axis)
  case = f"{name} {rule} {rounding} {rand_bits}"
  _assert_equal(q.codes, codes, f"{case} codes")
  _assert_equal(q.scales, scales, f"{case} scales")
  _assert_equal(fused, deq, f"{case} quantize_dequantize_mx")
  _assert_equal(numerics.dequantize(q), deq, f"{case} dequantize")


@pytest.mark.parametrize("rounding,rand_bits", ROUNDINGS)
@pytest.mark.parametrize("name", MX)
def test_public_functions_match_numpy_reference(name, rounding, rand_bits):
  """Every format and rounding on the specials, each with one scale rule (the
  hypothesis test below and the core comparison above cover the other pairs)."""
  rule = RULES[(MX.index(name) + ROUNDINGS.index((rounding, rand_bits))) % len(RULES)]
  _assert_matches_numpy(_special_tensor(name, 2, 16, 64, 0), name, rule, rounding,
                        rand_bits, seed=3)


@hypothesis.settings(max_examples=10, deadline=None)
@hypothesis.given(st.integers(0, 2 ** 31 - 1), st.integers(-150, 120),
                  st.sampled_from(MX), st.sampled_from(RULES),
                  st.sampled_from(ROUNDINGS), st.sampled_from([-1, 0]))
def test_public_functions_match_numpy_reference_hypothesis(seed, log2_gain, name, rule,
                                                           rounding, axis):
  x = _special_tensor(name, seed, 4, 64, log2_gain)
  if axis == 0:
    x = np.ascontiguousarray(x.T)
  _assert_matches_numpy(x, name, rule, *rounding, seed=seed, axis=axis)


# --------------------------------------------------------------- the element pass alone


@pytest.mark.parametrize("name", MX)
def test_round_to_grid_on_dense_neighbourhoods(name):
  """:func:`mx_fast.round_to_grid` (nearest, toward zero) against the NumPy grid
  reference on every float32 within 32 ulps of each grid value and midpoint, from the
  smallest normal float32 to twice the format's max."""
  g = _grid(name)
  anchors = np.concatenate([g, (g[:-1] + g[1:]) / 2, [2.0 * g[-1],
                                                      np.finfo(np.float32).tiny]])
  bits = anchors.astype(np.float32).view(np.int32)[:, None] + np.arange(-32, 33)
  m = bits.ravel().view(np.float32)
  m = m[(m >= np.finfo(np.float32).tiny) | (m == 0)]
  f = formats.get(name)
  for rounding in ("nearest", "toward_zero"):
    got = np.asarray(jax.jit(mx_fast.round_to_grid, static_argnums=(1, 2))(
        jnp.asarray(m), f, parse(rounding)))
    want = ref.round_to_grid(m.astype(np.float64), name, rounding).astype(np.float32)
    _assert_equal(got, want, f"{name} {rounding}")
