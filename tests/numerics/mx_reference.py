"""Independent NumPy references for OCP MX and NVFP4, written from the specs.

Element rounding goes through ml_dtypes (or NumPy's round-half-even for INT8), scale
exponents through math.frexp on float64, so nothing here shares code with numerics/
(only the format table's constants: max, emin, mantissa bits, emax). Codes are the
ml_dtypes / two's-complement storage bytes.

Stochastic rounding follows the definition the library documents (the README's
"Stochastic rounding" and numerics.rounding): with ``r`` random bits ``u`` (the top ``r`` bits of the element's
word) and ``frac`` the discarded fraction of a grid quantum, the magnitude rounds away
from zero iff ``u + floor(frac * 2^r) >= 2^r``, so P(away) is ``frac`` quantized to
``2^-r``. It is computed here in float64 on values, not on bit patterns; the words
come from :mod:`tests.numerics.hash_reference`.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from lowprec.numerics import formats

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


def round_to_grid(v: np.ndarray, name: str, rounding: str = "nearest",
                  words: np.ndarray | None = None, rand_bits: int | None = None
                  ) -> np.ndarray:
  """float64 ``v`` (finite) rounded onto format ``name``'s grid, saturated to +-max.

  ``nearest``: ml_dtypes / NumPy RNE. ``toward_zero`` and ``stochastic`` from the
  grid quantum ``2^(max(floor(log2|v|), emin) - man_bits)``; ``words`` are uint32 of
  ``v``'s shape, ``rand_bits`` the random bits used (None: 32).
  """
  v = np.asarray(v, np.float64)
  if rounding == "nearest":
    return _round_elements(v, name)
  f = formats.get(name)
  a = np.abs(v)
  _, ex = np.frexp(np.where(a > 0, a, 1.0))  # a = m 2^ex, m in [0.5, 1)
  q = np.exp2(np.maximum(ex - 1, f.emin) - f.man_bits)
  n = np.floor(a / q)
  if rounding == "toward_zero":
    away = np.zeros(a.shape, bool)
  elif rounding == "stochastic":
    r = 32 if rand_bits is None else int(rand_bits)
    frac = a / q - n
    u = (np.asarray(words, np.uint64) >> np.uint64(32 - r)).astype(np.float64)
    away = u + np.floor(frac * 2.0 ** r) >= 2.0 ** r
  else:
    raise ValueError(rounding)
  mag = np.minimum((n + away) * q, f.max)
  out = np.where(np.signbit(v), -mag, mag)  # -0.0 and negatives rounded to 0 keep "-"
  return out + 0.0 if f.kind == "int" else out  # INT8 has no negative zero


def element_codes(values: np.ndarray, name: str) -> np.ndarray:
  """uint8 storage bytes of element values exact in ``name`` (ml_dtypes / int8)."""
  f = formats.get(name)
  values = np.asarray(values, np.float64)
  if f.kind == "int":
    return np.round(values * 1).astype(np.int8).view(np.uint8)
  return values.astype(_MX[name]).view(np.uint8)


def decode_codes(codes: np.ndarray, name: str) -> np.ndarray:
  """float64 element values of uint8 storage bytes (ml_dtypes / two's complement)."""
  f = formats.get(name)
  codes = np.asarray(codes, np.uint8)
  if f.kind == "int":
    return codes.view(np.int8).astype(np.float64)
  return codes.view(_MX[name]).astype(np.float64)


def quantize_mx(x: np.ndarray, name: str, rule: str = "floor", *, axis: int = -1,
                rounding: str = "nearest", words: np.ndarray | None = None,
                rand_bits: int | None = None, block: int = 32
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """OCP MX in 1D blocks of ``block`` along ``axis``: (element codes, scale codes,
  dequantized float32).

  A block holding NaN/Inf gets scale code 0xFF, element codes 0 and NaN values (the
  library's documented choice: OCP makes the whole block NaN). ``words``: uint32 of
  x's shape, for ``stochastic``.
  """
  f = formats.get(name)
  x64 = np.moveaxis(np.asarray(x, np.float32).astype(np.float64), axis, -1)
  w = None if words is None else np.moveaxis(np.asarray(words, np.uint32), axis, -1)
  lead = x64.shape[:-1]
  nb = x64.shape[-1] // block
  xb = x64.reshape(*lead, nb, block)
  wb = None if w is None else w.reshape(*lead, nb, block)
  bad = ~np.all(np.isfinite(xb), axis=-1)
  amax = np.max(np.abs(np.where(np.isfinite(xb), xb, 0.0)), axis=-1)
  scale = np.empty(xb.shape[:-1], np.int64)
  for idx in np.ndindex(*scale.shape):
    scale[idx] = 255 if bad[idx] else scale_exponent(float(amax[idx]), name, rule)
  s = np.exp2((np.where(bad, 127, scale) - 127 - (f.emax - f.mx_emax)).astype(np.float64))
  elems = round_to_grid(np.where(bad[..., None], 0.0, xb) / s[..., None], name, rounding,
                        wb, rand_bits)
  codes = np.where(bad[..., None], np.uint8(0), element_codes(elems, name))
  deq = np.where(bad[..., None], np.nan, elems * s[..., None])
  back = lambda a, shape: np.moveaxis(a.reshape(shape), -1, axis)
  return (back(codes, x64.shape), np.moveaxis(scale.astype(np.uint8), -1, axis),
          back(deq, x64.shape).astype(np.float32))


def quantize_dequantize_mx(x: np.ndarray, name: str, rule: str = "floor",
                           block: int = 32) -> tuple[np.ndarray, np.ndarray]:
  """(dequantized float32, scale codes) for 1D blocks along the last axis (RNE).

  A second, scalar-loop transcription; :func:`quantize_mx` is the vectorized one
  with every rounding.
  """
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


def quantize_nvfp4(x: np.ndarray, *, axis: int = -1, rounding: str = "nearest",
                   words: np.ndarray | None = None, rand_bits: int | None = None,
                   block: int = 16
                   ) -> tuple[np.ndarray, np.ndarray, np.float32, np.ndarray]:
  """TE's NVFP4 chain in float32 NumPy, 1D blocks along ``axis``.

  Returns (E2M1 element codes, E4M3 scale codes, ``1/S_enc``, dequantized float32):
  ``S_enc = min(2688 / amax, FLT_MAX)`` over finite values (1 when amax is 0),
  ``S_dec = e4m3(min(block_amax * (S_enc * (1/6)), 448))`` rounded once,
  ``enc = min(1 / (S_dec * (1/S_enc)), FLT_MAX)``, elements ``e2m1(x * enc)``
  (RNE via ml_dtypes, or stochastic with ``words``), decode
  ``(element * S_dec) * (1/S_enc)``. A block holding NaN/Inf gets the E4M3 NaN scale
  0x7F, zero element codes and NaN values (the library's choice; TE is silent).
  """
  f32 = np.float32
  flt_max = f32(np.finfo(np.float32).max)
  x = np.moveaxis(np.asarray(x, np.float32), axis, -1)
  w = None if words is None else np.moveaxis(np.asarray(words, np.uint32), axis, -1)
  finite = np.isfinite(x)
  amax = f32(np.max(np.abs(x[finite]), initial=0.0))
  with np.errstate(divide="ignore", over="ignore"):
    s_enc = np.minimum(f32(2688.0) / amax, flt_max)
  if amax == 0 or s_enc == 0:
    s_enc = f32(1.0)
  inv = f32(1.0) / s_enc
  xb = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
  bad = ~np.all(np.isfinite(xb), axis=-1, keepdims=True)
  xb = np.where(bad, f32(0.0), xb)
  bamax = np.max(np.abs(xb), axis=-1, keepdims=True).astype(np.float32)
  s_dec = np.minimum(bamax * (s_enc * f32(1.0 / 6.0)), f32(448.0))
  s_dec = s_dec.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
  with np.errstate(divide="ignore"):
    enc = np.minimum(f32(1.0) / (s_dec * inv), flt_max)
  with np.errstate(over="ignore", invalid="ignore"):
    scaled = (xb * enc).astype(np.float32)
  wb = None if w is None else w.reshape(xb.shape)
  el = round_to_grid(np.where(np.isfinite(scaled), scaled, np.sign(scaled) * 6.0), "e2m1",
                     rounding, wb, rand_bits).astype(np.float32)
  codes = np.where(bad, np.uint8(0), element_codes(el, "e2m1"))
  scale_codes = np.where(bad[..., 0], np.uint8(0x7F),
                         s_dec[..., 0].astype(ml_dtypes.float8_e4m3fn).view(np.uint8))
  deq = np.where(bad, np.float32(np.nan), (el * s_dec) * inv)
  back = lambda a: np.moveaxis(a.reshape(x.shape), -1, axis)
  return back(codes), np.moveaxis(scale_codes, -1, axis), inv, back(deq)


def nvfp4_block_values(codes: np.ndarray, scale_codes: np.ndarray, *,
                       block_shape: tuple[int, ...] = (16,), axes: tuple[int, ...] = (-1,)
                       ) -> np.ndarray:
  """float32 ``element * S_dec`` of NVFP4 codes (the value before the tensor scale):
  E2M1 and E4M3 decoded by ml_dtypes, each scale repeated over its block (1D blocks
  along ``axes[0]`` or 2D tiles over ``axes``), the product in float64 (exact), NaN
  where the scale code is E4M3's NaN (0x7F)."""
  el = decode_codes(codes, "e2m1")
  sc = np.asarray(scale_codes, np.uint8)
  s = sc.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
  bad = (sc & 0x7F) == 0x7F
  for a, b in zip(axes, block_shape):
    s, bad = np.repeat(s, b, axis=a), np.repeat(bad, b, axis=a)
  return np.where(bad, np.nan, el * s).astype(np.float32)


def quantize_nvfp4_torchao(x: np.ndarray, *, axis: int = -1, rounding: str = "nearest",
                           words: np.ndarray | None = None,
                           rand_bits: int | None = None, block: int = 16
                           ) -> tuple[np.ndarray, np.ndarray, np.float32, np.ndarray]:
  """torchao's NVFP4 (``NVFP4Tensor.to_nvfp4`` with ``per_tensor_scale``) in NumPy.

  Transcribed from torchao's ``nvfp4_quantize`` (two-level branch) and
  ``NVFP4Tensor.dequantize``/``get_hp_scales`` (torchao/prototype/mx_formats/
  nvfp4_tensor.py), every step a float32 operation:
  ``per_tensor_scale = amax / (448 * 6)`` (``per_tensor_amax_to_scale``; we take 1 for
  an all-zero tensor, where torchao divides by zero), ``block_scale = block_amax / 6``,
  ``s = e4m3(clamp(block_scale / per_tensor_scale, E4M3_EPS = 2^-6, 448))``,
  ``reciprocal = (1 / per_tensor_scale) / s``, elements
  ``e2m1(clamp(x * reciprocal, -6, 6))`` (RNE, or stochastic with ``words``: an
  extension, torchao's path rounds to nearest), decode
  ``element * (per_tensor_scale * s)``. NaN/Inf: as :func:`quantize_nvfp4` (the
  library's policy). Returns (element codes, scale codes, per_tensor_scale,
  dequantized float32).
  """
  f32 = np.float32
  x = np.moveaxis(np.asarray(x, np.float32), axis, -1)
  w = None if words is None else np.moveaxis(np.asarray(words, np.uint32), axis, -1)
  amax = f32(np.max(np.abs(x[np.isfinite(x)]), initial=0.0))
  pts = f32(amax / f32(448.0 * 6.0))
  if amax == 0 or pts == 0:
    pts = f32(1.0)
  xb = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
  bad = ~np.all(np.isfinite(xb), axis=-1, keepdims=True)
  xb = np.where(bad, f32(0.0), xb)
  max_abs = np.max(np.abs(xb), axis=-1, keepdims=True).astype(np.float32)
  block_scale = (max_abs / f32(6.0)).astype(np.float32)
  scaled_block_scales = (block_scale / pts).astype(np.float32)
  s_fp8 = np.clip(scaled_block_scales, f32(2.0 ** -6), f32(448.0)).astype(
      ml_dtypes.float8_e4m3fn)
  s32 = s_fp8.astype(np.float32)
  reciprocal = ((f32(1.0) / pts) / s32).astype(np.float32)
  with np.errstate(over="ignore", invalid="ignore"):
    data_scaled = np.clip((xb * reciprocal).astype(np.float32), f32(-6.0), f32(6.0))
  wb = None if w is None else w.reshape(xb.shape)
  el = round_to_grid(data_scaled, "e2m1", rounding, wb, rand_bits).astype(np.float32)
  codes = np.where(bad, np.uint8(0), element_codes(el, "e2m1"))
  scale_codes = np.where(bad[..., 0], np.uint8(0x7F), s_fp8[..., 0].view(np.uint8))
  deq = np.where(bad, np.float32(np.nan), el * (pts * s32).astype(np.float32))
  back = lambda a: np.moveaxis(a.reshape(x.shape), -1, axis)
  return back(codes), np.moveaxis(scale_codes, -1, axis), pts, back(deq)


def quantize_dequantize_nvfp4(x: np.ndarray, block: int = 16
                              ) -> tuple[np.ndarray, np.ndarray, np.float32]:
  """TE's NVFP4 chain in float32 NumPy: (dequantized, block scales, 1/S_enc).

  Blocks are ``block`` consecutive elements of the last axis (16 for NVFP4; pass 256
  with 16x16 tiles flattened into rows to check 2D tiles).
  """
  _, scale_codes, inv, deq = quantize_nvfp4(x, block=block)
  s_dec = scale_codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
  return deq, s_dec, inv


def mx_values(codes: np.ndarray, scales: np.ndarray, name: str, axis: int,
              block: int = 32) -> np.ndarray:
  """float64 values of MX codes with 1D blocks along ``axis`` of a 2D array.

  ml_dtypes element values times ``2^(code - 127)`` (MXINT8: times 2^-6 as well);
  scale code 0xFF gives NaN.
  """
  f = formats.get(name)
  s = np.repeat(np.asarray(scales, np.int64), block, axis=axis)
  v = decode_codes(codes, name) * np.exp2((s - 127 - (f.emax - f.mx_emax)).astype(float))
  return np.where(s == 255, np.nan, v)


def mx_matmul(codes_a: np.ndarray, scales_a: np.ndarray, name_a: str,
              codes_b: np.ndarray, scales_b: np.ndarray, name_b: str,
              block: int = 32) -> np.ndarray:
  """float64 ``A @ B`` of MX operands (A blocked along K = axis 1, B along axis 0);
  the float64 sum is exact while the products' binades span fewer than 53 bits."""
  return (mx_values(codes_a, scales_a, name_a, 1, block)
          @ mx_values(codes_b, scales_b, name_b, 0, block))


def tiles_to_rows(x: np.ndarray, b0: int, b1: int) -> np.ndarray:
  """(M, N) -> (M//b0 * N//b1, b0*b1): each 2D tile flattened into one row."""
  m, n = x.shape
  return x.reshape(m // b0, b0, n // b1, b1).transpose(0, 2, 1, 3).reshape(-1, b0 * b1)


def rows_to_tiles(r: np.ndarray, m: int, n: int, b0: int, b1: int) -> np.ndarray:
  """Inverse of :func:`tiles_to_rows`."""
  return r.reshape(m // b0, n // b1, b0, b1).transpose(0, 2, 1, 3).reshape(m, n)
