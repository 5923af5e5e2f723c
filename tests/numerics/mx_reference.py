"""Independent NumPy references for OCP MX and NVFP4, written from the specs.

Element rounding goes through ml_dtypes (or NumPy's round-half-even for INT8), scale
exponents through math.frexp on float64, so nothing here shares code with numerics/.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from numerics import formats

_MX = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
       "e2m3": ml_dtypes.float6_e2m3fn, "e3m2": ml_dtypes.float6_e3m2fn,
       "e2m1": ml_dtypes.float4_e2m1fn}


def _floor_log2(v: float) -> int:
  m, e = math.frexp(v)  # v = m 2^e, m in [0.5, 1)
  return e - 1


def _round_mantissa_half_up(v: float, keep: int) -> float:
  e = _floor_log2(v)
  q = 2.0 ** (e - keep)
  return math.floor(v / q + 0.5) * q


def scale_exponent(amax: float, name: str, rule: str) -> int:
  """OCP E8M0 code for a finite block amax."""
  f = formats.get(name)
  if amax == 0:
    return 0
  if rule == "floor":
    e = _floor_log2(amax) - f.emax
  elif rule == "ceil":
    e = math.ceil(math.log2(amax)) - f.emax
    if 2.0 ** (e + f.emax) < amax:  # guard math.log2 rounding
      e += 1
    if 2.0 ** (e + f.emax - 1) >= amax:
      e -= 1
  elif rule == "rceil":
    e = _floor_log2(amax) - f.emax
    if amax > f.max * 2.0 ** e:
      e += 1
  elif rule == "even":
    m = f.man_bits if f.kind == "float" else 7
    e = _floor_log2(_round_mantissa_half_up(amax, m)) - f.emax
  elif rule == "alto":
    e = _floor_log2(_round_mantissa_half_up(amax, 1)) - f.emax
  else:
    raise ValueError(rule)
  return int(np.clip(e + (f.emax - f.mx_emax) + 127, 0, 254))


def _round_elements(v: np.ndarray, name: str) -> np.ndarray:
  f = formats.get(name)
  v = np.clip(v, -f.max, f.max)
  if f.kind == "int":
    return np.round(v) + 0.0  # INT8 has no negative zero
  return v.astype(_MX[name]).astype(np.float64)


def quantize_dequantize_mx(x: np.ndarray, name: str, rule: str = "floor",
                           block: int = 32) -> tuple[np.ndarray, np.ndarray]:
  """(dequantized float32, scale codes) for 1D blocks along the last axis."""
  f = formats.get(name)
  x64 = np.asarray(x, np.float64)
  lead = x64.shape[:-1]
  xb = x64.reshape(*lead, x64.shape[-1] // block, block)
  out = np.empty_like(xb)
  codes = np.empty(xb.shape[:-1], np.int64)
  for idx in np.ndindex(*xb.shape[:-1]):
    blk = xb[idx]
    if not np.all(np.isfinite(blk)):
      codes[idx] = 255
      out[idx] = np.nan
      continue
    c = scale_exponent(float(np.max(np.abs(blk))), name, rule)
    codes[idx] = c
    s = 2.0 ** (c - 127 - (f.emax - f.mx_emax))
    out[idx] = _round_elements(blk / s, name) * s
  return out.reshape(x64.shape).astype(np.float32), codes


def quantize_dequantize_nvfp4(x: np.ndarray, block: int = 16
                              ) -> tuple[np.ndarray, np.ndarray, np.float32]:
  """TE's NVFP4 chain in float32 NumPy: (dequantized, block scales, 1/S_enc).

  Blocks are ``block`` consecutive elements of the last axis (16 for NVFP4; pass 256
  with 16x16 tiles flattened into rows to check 2D tiles).
  """
  x = np.asarray(x, np.float32)
  f32 = np.float32
  amax = f32(np.max(np.abs(x[np.isfinite(x)]), initial=0.0))
  with np.errstate(divide="ignore", over="ignore"):
    s_enc = np.minimum(f32(2688.0) / amax, f32(np.finfo(np.float32).max))
  if amax == 0 or s_enc == 0:
    s_enc = f32(1.0)
  xb = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
  bamax = np.max(np.abs(xb), axis=-1, keepdims=True).astype(np.float32)
  s_dec = np.minimum(bamax * (s_enc * f32(1.0 / 6.0)), f32(448.0))
  s_dec = s_dec.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
  with np.errstate(divide="ignore"):
    enc = np.minimum(f32(1.0) / (s_dec * (f32(1.0) / s_enc)),
                     f32(np.finfo(np.float32).max))
  with np.errstate(over="ignore", invalid="ignore"):
    el = np.clip(xb * enc, -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
  deq = (el * s_dec) * (f32(1.0) / s_enc)
  return deq.reshape(x.shape), s_dec[..., 0], f32(1.0) / s_enc


def tiles_to_rows(x: np.ndarray, b0: int, b1: int) -> np.ndarray:
  """(M, N) -> (M//b0 * N//b1, b0*b1): each 2D tile flattened into one row."""
  m, n = x.shape
  return x.reshape(m // b0, b0, n // b1, b1).transpose(0, 2, 1, 3).reshape(-1, b0 * b1)


def rows_to_tiles(r: np.ndarray, m: int, n: int, b0: int, b1: int) -> np.ndarray:
  """Inverse of :func:`tiles_to_rows`."""
  return r.reshape(m // b0, n // b1, b0, b1).transpose(0, 2, 1, 3).reshape(m, n)
