"""Element formats as data: the table every other module reads.

A :class:`Format` describes a number grid (sign, exponent and mantissa bits, bias,
largest finite value, smallest normal exponent) and its special-value policy. Adding
a format is adding a row to ``_TABLE``; no other module branches on format names.

NaN/Inf policy per format (what :func:`numerics.cast` does with specials and overflow):

=========  =====  =====  ==========================================================
format     Inf    NaN    finite overflow with ``saturate=False``
=========  =====  =====  ==========================================================
e4m3       no     yes    NaN (OCP OFP8 E4M3 / ``float8_e4m3fn``: S.1111.111 is NaN)
e5m2       yes    yes    +-Inf (IEEE-like)
e2m3       no     no     +-max (saturates; FP6 has no specials)
e3m2       no     no     +-max (saturates)
e2m1       no     no     +-max (saturates; FP4 has no specials)
int8       no     no     +-127 (saturates; symmetric, the -128 code is unused)
bf16       yes    yes    +-Inf
fp16       yes    yes    +-Inf
e8m0       no     yes    NaN (unsigned power of two 2^-127..2^127; 0xFF is NaN;
                         zero and negative inputs give NaN)
=========  =====  =====  ==========================================================

With ``saturate=True`` finite overflow goes to +-max in every format; an infinite input
stays infinite where the format has Inf and goes to +-max where it does not (as PTX
``cvt.satfinite`` and clip-then-cast do). A NaN input always gives NaN in the container
dtype; formats without a NaN code (FP6, FP4, INT8) cannot encode it, so block
quantizers poison the whole block instead (see :mod:`numerics.blockscale`). ml_dtypes
maps NaN to -0 for FP4/FP6, which we deliberately do not copy: a silent zero hides bugs.

``int8`` is a symmetric integer grid [-127, 127] with quantum 1. Inside OCP MX blocks it
is MXINT8: the stored E8M0 scale follows the spec's convention (element value = k * 2^-6
times the scale), recorded here as ``mx_emax = 0`` against the grid's ``emax = 6``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import ml_dtypes
import numpy as np

Kind = Literal["float", "int", "scale"]


@dataclasses.dataclass(frozen=True)
class Format:
  """A number format.

  Attributes:
    name: standard short name (``e4m3``, ``e2m1``, ...).
    kind: ``float`` (sign-exponent-mantissa), ``int`` (symmetric integer grid) or
      ``scale`` (unsigned exponent-only E8M0).
    bits: storage width in bits.
    exp_bits: exponent field width (0 for int).
    man_bits: mantissa field width (for int: magnitude bits).
    bias: exponent bias.
    emin: exponent of the smallest normal value; below it the grid is uniform with
      quantum ``2**(emin - man_bits)`` (subnormals).
    emax: exponent of the largest binade, ``floor(log2(max))``.
    max: largest finite value.
    has_inf, has_nan, has_subnormals, signed, has_zero: special-value policy.
    mx_emax: the ``emax_elem`` OCP MX uses to place the shared scale (equals ``emax``
      except for MXINT8, whose elements carry an implicit 2^-6).
    np_dtype: the ml_dtypes/NumPy dtype holding this format, used as a reference.
    xla_castable: whether XLA on the CPU can ``astype`` to ``np_dtype`` (not FP6).
    nan_code, inf_code: bit codes used when encoding NaN / +Inf (None if absent).
  """

  name: str
  kind: Kind
  bits: int
  exp_bits: int
  man_bits: int
  bias: int
  emin: int
  emax: int
  max: float
  has_inf: bool
  has_nan: bool
  has_subnormals: bool
  signed: bool
  has_zero: bool
  mx_emax: int
  np_dtype: np.dtype
  xla_castable: bool
  nan_code: int | None
  inf_code: int | None

  @property
  def min_normal(self) -> float:
    """Smallest positive normal value (for int: the quantum, 1)."""
    if self.kind == "int":
      return 1.0
    return 2.0 ** self.emin

  @property
  def min_subnormal(self) -> float:
    """Smallest positive value (the subnormal quantum, or min normal without them)."""
    if self.kind == "int":
      return 1.0
    if not self.has_subnormals:
      return 2.0 ** self.emin
    return 2.0 ** (self.emin - self.man_bits)

  @property
  def is_narrow(self) -> bool:
    """True for formats of at most 8 bits (those a block quantizer can hold)."""
    return self.bits <= 8

  def __repr__(self) -> str:
    return f"Format({self.name})"


def _float(name, exp_bits, man_bits, *, max_value, has_inf, has_nan, np_dtype,
           xla_castable=True, nan_code=None, inf_code=None) -> Format:
  bias = 2 ** (exp_bits - 1) - 1
  emax = int(math.floor(math.log2(max_value)))
  return Format(
      name=name, kind="float", bits=1 + exp_bits + man_bits, exp_bits=exp_bits,
      man_bits=man_bits, bias=bias, emin=1 - bias, emax=emax, max=float(max_value),
      has_inf=has_inf, has_nan=has_nan, has_subnormals=True, signed=True,
      has_zero=True, mx_emax=emax, np_dtype=np.dtype(np_dtype),
      xla_castable=xla_castable, nan_code=nan_code, inf_code=inf_code)


_TABLE: dict[str, Format] = {
    f.name: f for f in (
        _float("e4m3", 4, 3, max_value=448.0, has_inf=False, has_nan=True,
               np_dtype=ml_dtypes.float8_e4m3fn, nan_code=0x7F),
        _float("e5m2", 5, 2, max_value=57344.0, has_inf=True, has_nan=True,
               np_dtype=ml_dtypes.float8_e5m2, nan_code=0x7E, inf_code=0x7C),
        _float("e2m3", 2, 3, max_value=7.5, has_inf=False, has_nan=False,
               np_dtype=ml_dtypes.float6_e2m3fn, xla_castable=False),
        _float("e3m2", 3, 2, max_value=28.0, has_inf=False, has_nan=False,
               np_dtype=ml_dtypes.float6_e3m2fn, xla_castable=False),
        _float("e2m1", 2, 1, max_value=6.0, has_inf=False, has_nan=False,
               np_dtype=ml_dtypes.float4_e2m1fn),
        _float("bf16", 8, 7, max_value=float(ml_dtypes.finfo(ml_dtypes.bfloat16).max),
               has_inf=True, has_nan=True, np_dtype=ml_dtypes.bfloat16,
               nan_code=0x7FC0, inf_code=0x7F80),
        _float("fp16", 5, 10, max_value=65504.0, has_inf=True, has_nan=True,
               np_dtype=np.float16, nan_code=0x7E00, inf_code=0x7C00),
        Format(
            name="int8", kind="int", bits=8, exp_bits=0, man_bits=7, bias=0, emin=7,
            emax=6, max=127.0, has_inf=False, has_nan=False, has_subnormals=True,
            signed=True, has_zero=True, mx_emax=0, np_dtype=np.dtype(np.int8),
            xla_castable=True, nan_code=None, inf_code=None),
        Format(
            name="e8m0", kind="scale", bits=8, exp_bits=8, man_bits=0, bias=127,
            emin=-127, emax=127, max=2.0 ** 127, has_inf=False, has_nan=True,
            has_subnormals=False, signed=False, has_zero=False, mx_emax=127,
            np_dtype=np.dtype(ml_dtypes.float8_e8m0fnu), xla_castable=True,
            nan_code=0xFF, inf_code=None),
    )
}


def names() -> tuple[str, ...]:
  """The names of all known formats, in table order."""
  return tuple(_TABLE)


def get(fmt: str | Format) -> Format:
  """Looks up a format by name (a :class:`Format` is returned unchanged).

  Raises:
    ValueError: for an unknown name; the message lists the known ones.
    TypeError: for anything that is neither a string nor a Format.
  """
  if isinstance(fmt, Format):
    return fmt
  if not isinstance(fmt, str):
    raise TypeError(f"format must be a name or a Format, got {type(fmt).__name__}")
  try:
    return _TABLE[fmt]
  except KeyError:
    raise ValueError(
        f"unknown format {fmt!r}; known formats: {', '.join(names())}") from None


def representable_in(fmt: Format, dtype) -> bool:
  """Whether every value of ``fmt`` is exactly representable in floating ``dtype``.

  ``cast`` returns results in the input's dtype, so it needs this to be true.
  """
  dtype = np.dtype(dtype)
  if dtype == np.float32 or dtype == np.float64:
    return True
  info = ml_dtypes.finfo(dtype)
  precision_ok = info.nmant >= fmt.man_bits if fmt.kind != "int" else (
      info.nmant + 1 >= 7)
  return bool(precision_ok and float(info.max) >= fmt.max
              and float(info.smallest_subnormal) <= fmt.min_subnormal)


def table_rows() -> list[dict]:
  """One dict per format (name, bits, layout, max, min normal/subnormal, specials)."""
  rows = []
  for f in _TABLE.values():
    layout = (f"E{f.exp_bits}M{f.man_bits}" if f.kind != "int" else "int")
    rows.append(dict(name=f.name, bits=f.bits, layout=layout, max=f.max,
                     min_normal=f.min_normal, min_subnormal=f.min_subnormal,
                     inf=f.has_inf, nan=f.has_nan))
  return rows
