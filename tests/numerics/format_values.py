"""Shared test helper: every finite value of a format, from ml_dtypes."""

import warnings

import numpy as np

from lowprec.numerics import formats


def all_values(name):
  f = formats.get(name)
  if f.kind == "int":
    return np.arange(-127, 128, dtype=np.float64)
  codes = np.arange(2 ** f.bits, dtype=np.uint32)
  codes = codes.astype(np.uint8 if np.dtype(f.np_dtype).itemsize == 1 else np.uint16)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    v = codes.view(f.np_dtype).astype(np.float64)
  return v[np.isfinite(v)]
