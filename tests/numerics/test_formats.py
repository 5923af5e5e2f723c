"""Tests for numerics.formats: the format table against ml_dtypes, lookup, representability."""

import math
import warnings

import ml_dtypes
import numpy as np
import pytest

from lowprec.numerics import formats

EXPECTED_NAMES = ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "bf16", "fp16", "int8", "e8m0")

# The ml_dtypes type each format must match (int8 has none: it is a symmetric integer grid).
ML_DTYPE = {
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e2m1": ml_dtypes.float4_e2m1fn,
    "bf16": ml_dtypes.bfloat16,
    "fp16": np.float16,
    "e8m0": ml_dtypes.float8_e8m0fnu,
}
FLOAT_NAMES = tuple(ML_DTYPE)


def _all_values(name):
  """Every value of a format (float64), enumerated from its ml_dtypes encodings."""
  f = formats.get(name)
  if f.kind == "int":
    return np.arange(-127, 128, dtype=np.float64)
  codes = np.arange(2 ** f.bits, dtype=np.uint32)
  itemsize = np.dtype(f.np_dtype).itemsize
  codes = codes.astype(np.uint8 if itemsize == 1 else np.uint16)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # NaN codes
    return codes.view(f.np_dtype).astype(np.float64)


def test_names_are_the_documented_table():
  assert formats.names() == EXPECTED_NAMES
  assert isinstance(formats.names(), tuple)


@pytest.mark.parametrize("name", FLOAT_NAMES)
def test_table_matches_ml_dtypes_finfo(name):
  f = formats.get(name)
  dt = ML_DTYPE[name]
  info = ml_dtypes.finfo(dt)
  assert f.name == name
  assert np.dtype(f.np_dtype) == np.dtype(dt)
  assert f.max == float(info.max)
  assert f.min_normal == float(info.smallest_normal)
  assert f.min_subnormal == float(info.smallest_subnormal)
  assert f.man_bits == info.nmant
  assert f.exp_bits == info.nexp
  assert f.bits == info.bits
  assert f.emin == info.minexp
  assert f.emax == info.maxexp - 1
  assert f.emax == math.floor(math.log2(f.max))


@pytest.mark.parametrize("name", FLOAT_NAMES)
def test_special_value_policy_matches_ml_dtypes(name):
  f = formats.get(name)
  dt = ML_DTYPE[name]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    inf_back = np.array([np.inf], np.float32).astype(dt).astype(np.float32)[0]
    nan_back = np.array([np.nan], np.float32).astype(dt).astype(np.float32)[0]
  assert f.has_inf == bool(np.isinf(inf_back))
  assert f.has_nan == bool(np.isnan(nan_back))
  vals = _all_values(name)
  assert f.has_zero == bool(np.any(vals == 0))
  assert f.signed == bool(np.any(vals < 0))
  finite = vals[np.isfinite(vals)]
  assert finite.max() == f.max
  assert finite[finite > 0].min() == f.min_subnormal
  assert f.has_subnormals == (f.min_subnormal < f.min_normal)
  # the stored codes decode to what the table says they are
  itemsize = np.dtype(dt).itemsize
  code_dtype = np.uint8 if itemsize == 1 else np.uint16
  if f.nan_code is not None:
    assert f.has_nan
    assert np.isnan(np.array([f.nan_code], code_dtype).view(dt).astype(np.float32)[0])
  else:
    assert not f.has_nan
  if f.inf_code is not None:
    assert f.has_inf
    assert np.array([f.inf_code], code_dtype).view(dt).astype(np.float32)[0] == np.inf
  else:
    assert not f.has_inf


def test_int8_is_symmetric_integer_grid():
  f = formats.get("int8")
  assert f.kind == "int"
  assert f.max == 127.0 == float(np.iinfo(np.int8).max)
  assert f.min_normal == 1.0 and f.min_subnormal == 1.0
  assert not f.has_inf and not f.has_nan
  assert f.bits == 8 and f.signed and f.has_zero
  assert f.emax == 6 and f.mx_emax == 0  # MXINT8's implicit 2^-6


def test_e8m0_is_unsigned_power_of_two():
  f = formats.get("e8m0")
  assert f.kind == "scale"
  assert not f.signed and not f.has_zero and not f.has_subnormals
  assert f.max == 2.0 ** 127 and f.min_normal == 2.0 ** -127
  vals = _all_values("e8m0")
  finite = vals[np.isfinite(vals)]
  np.testing.assert_array_equal(finite, 2.0 ** np.arange(-127, 128))


@pytest.mark.parametrize("name", EXPECTED_NAMES)
def test_mx_emax_and_narrowness(name):
  f = formats.get(name)
  assert f.is_narrow == (f.bits <= 8)
  if name != "int8":
    assert f.mx_emax == f.emax


def test_table_rows_consistent():
  rows = formats.table_rows()
  assert [r["name"] for r in rows] == list(EXPECTED_NAMES)
  for r in rows:
    f = formats.get(r["name"])
    assert r["max"] == f.max and r["bits"] == f.bits
    assert r["min_normal"] == f.min_normal and r["min_subnormal"] == f.min_subnormal
    assert r["inf"] == f.has_inf and r["nan"] == f.has_nan


def test_get_unknown_name_lists_known_names():
  with pytest.raises(ValueError) as info:
    formats.get("nope")
  msg = str(info.value)
  assert "nope" in msg
  for name in EXPECTED_NAMES:
    assert name in msg


def test_get_passthrough_and_type_errors():
  for name in EXPECTED_NAMES:
    f = formats.get(name)
    assert isinstance(f, formats.Format)
    assert formats.get(f) is f
  for bad in (3, None, 4.5, b"e4m3", ["e4m3"], np.float32(1)):
    with pytest.raises(TypeError):
      formats.get(bad)


def test_format_is_frozen():
  f = formats.get("e4m3")
  with pytest.raises(Exception):
    f.max = 1.0  # type: ignore[misc]


# Expected answers written out by hand for the dtypes cast accepts.
@pytest.mark.parametrize("name,dtype,expected", [
    ("e4m3", ml_dtypes.bfloat16, True),
    ("e4m3", np.float16, True),
    ("e5m2", np.float16, True),
    ("e5m2", ml_dtypes.bfloat16, True),
    ("bf16", np.float16, False),    # bf16 max 3.4e38 > 65504
    ("fp16", ml_dtypes.bfloat16, False),  # 10 mantissa bits > 7
    ("e8m0", np.float16, False),   # 2^127 > 65504
    ("e8m0", ml_dtypes.bfloat16, True),
    ("int8", ml_dtypes.bfloat16, True),
    ("int8", np.float16, True),
    ("bf16", ml_dtypes.bfloat16, True),
    ("fp16", np.float16, True),
    ("e4m3", ml_dtypes.float8_e5m2, False),
    ("e5m2", ml_dtypes.float8_e4m3fn, False),
    ("e2m1", ml_dtypes.float8_e4m3fn, True),
    ("int8", ml_dtypes.float8_e4m3fn, False),
])
def test_representable_in_examples(name, dtype, expected):
  assert formats.representable_in(formats.get(name), dtype) is expected


@pytest.mark.parametrize("name", EXPECTED_NAMES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, ml_dtypes.bfloat16, np.float16,
                                   ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2])
def test_representable_in_agrees_with_brute_force(name, dtype):
  vals = _all_values(name)
  vals = vals[np.isfinite(vals)]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    back = vals.astype(dtype).astype(np.float64)
  brute = bool(np.all(back == vals))
  assert formats.representable_in(formats.get(name), dtype) == brute
