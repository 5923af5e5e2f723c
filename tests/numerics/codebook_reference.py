"""Independent NumPy references for codebook formats, NF4 tensors and scaled blocks.

Written from the specs in the module docstrings of numerics.codebooks, numerics.nf4
and numerics.optim.moment_codecs: table levels from exact rational closed forms,
codes by counting thresholds (not a binary search), float32 arithmetic in NumPy,
element rounding through ml_dtypes. Nothing here imports those modules.
"""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np

F32 = np.float32
MIN_NORMAL = F32(2.0 ** -126)

NF4_PUBLISHED = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
    0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0], dtype=np.float32)

ML_DTYPES = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
             "e2m3": ml_dtypes.float6_e2m3fn, "e3m2": ml_dtypes.float6_e3m2fn,
             "e2m1": ml_dtypes.float4_e2m1fn}
ELEMENT_MAX = {"e4m3": 448.0, "e5m2": 57344.0, "e2m3": 7.5, "e3m2": 28.0, "e2m1": 6.0,
               "int8": 127.0}


def exact_f32(fr: Fraction) -> np.float32:
  """The float32 nearest to the rational ``fr`` (ties to even), by exact comparison."""
  c = F32(float(fr))
  cands = [np.nextafter(c, F32(-np.inf)), c, np.nextafter(c, F32(np.inf))]
  dist = [abs(Fraction(float(v)) - fr) for v in cands]
  best = min(dist)
  ties = [v for v, d in zip(cands, dist) if d == best]
  return min(ties, key=lambda v: int(np.asarray(v).view(np.uint32)) & 1)


def dynamic_levels(signed: bool, max_exponent_bits: int, total_bits: int) -> np.ndarray:
  """bitsandbytes' dynamic map from its closed form, each level exactly rounded:
  ``+-10^(i-E+1) (1/10 + 9/10 (2j+1)/(2N_i))`` for ``j < N_i``, plus 0 and 1."""
  e, nsb = max_exponent_bits, total_bits - 1
  levels = [Fraction(0), Fraction(1)]

  def add(i, n):
    for j in range(n):
      v = Fraction(10) ** (i - e + 1) * (Fraction(1, 10)
                                          + Fraction(9, 10) * Fraction(2 * j + 1, 2 * n))
      levels.append(v)
      if signed:
        levels.append(-v)

  for i in range(e):
    add(i, 2 ** (i + nsb - e + (0 if signed else 1)))
  if 2 ** (nsb - e) - 1 > 0:
    add(e - 1, 2 ** (nsb - e) - 1)
  return np.array([exact_f32(v) for v in sorted(levels)], np.float32)


def thresholds(levels: np.ndarray) -> np.ndarray:
  lv = levels.astype(np.float64)
  return ((lv[:-1] + lv[1:]) / 2.0).astype(np.float32)


def nearest_codes(n: np.ndarray, levels: np.ndarray) -> np.ndarray:
  """Codes: the number of thresholds strictly below each value (ties go down)."""
  t = thresholds(levels)
  n = np.asarray(n, np.float32).reshape(-1)
  return np.array([int(np.count_nonzero(v > t)) for v in n], np.int64).reshape(
      np.shape(n))


def block_absmax(x_nb: np.ndarray, min_absmax=MIN_NORMAL) -> np.ndarray:
  a = np.max(np.abs(x_nb.astype(np.float32)), axis=-1)
  a = np.where(np.isfinite(a), a, F32(np.nan)).astype(np.float32)
  return np.where(a < F32(min_absmax), F32(0.0), a).astype(np.float32)


def normalize(x_nb: np.ndarray, absmax: np.ndarray) -> np.ndarray:
  """x * fl32(1 / absmax) (the spec's reciprocal multiply)."""
  inv = (F32(1) / np.where(absmax > 0, absmax, F32(1))).astype(np.float32)
  with np.errstate(invalid="ignore"):
    n = x_nb.astype(np.float32) * inv[:, None]
  return np.where((absmax > 0)[:, None], n, F32(0)).astype(np.float32)


def codebook_blocks(x_nb: np.ndarray, levels: np.ndarray):
  """(codes [N, B], absmax [N], dequantized [N, B]) of blockwise absmax coding."""
  absmax = block_absmax(x_nb)
  n = normalize(x_nb, absmax)
  codes = nearest_codes(n, levels).reshape(n.shape)
  deq = (levels[codes] * absmax[:, None]).astype(np.float32)
  return codes, absmax, deq


def pairwise_mean(v: np.ndarray) -> np.float32:
  v = list(np.asarray(v, np.float32))
  count = len(v)
  size = 1
  while size < count:
    size *= 2
  v = np.array(v + [0.0] * (size - count), np.float32)
  while len(v) > 1:
    h = len(v) // 2
    v = (v[:h] + v[h:]).astype(np.float32)
  return F32(v[0] * (F32(1) / F32(count)))


def nf4(x: np.ndarray, block: int = 64, axis: int = -1, double_quant: bool = True,
        scale_block: int = 256):
  """NF4 per numerics.nf4's spec: (codes [*lead, L], decoded absmax [*lead, nb],
  dequantized x, raw absmax, double-quant codes or None)."""
  x = np.moveaxis(np.asarray(x, np.float32), axis, -1)
  lead, length = x.shape[:-1], x.shape[-1]
  pad = (-length) % block
  xp = np.concatenate([x, np.zeros((*lead, pad), np.float32)], axis=-1)
  nb = xp.shape[-1] // block
  codes, absmax, _ = codebook_blocks(xp.reshape(-1, block), NF4_PUBLISHED)
  dq_codes = None
  used = absmax
  if double_quant:
    offset = pairwise_mean(absmax)
    c = (absmax - offset).astype(np.float32)
    n = c.shape[0]
    cpad = np.concatenate([c, np.zeros((-n) % scale_block, np.float32)])
    q2, a2, _ = codebook_blocks(cpad.reshape(-1, scale_block),
                                dynamic_levels(True, 7, 8))
    level = dynamic_levels(True, 7, 8)[q2]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
      ratio = (offset / np.where(a2 > 0, a2, F32(1)))[:, None].astype(np.float32)
      dec = ((level + ratio).astype(np.float32) * a2[:, None]).astype(np.float32)
    dec = np.where((a2[:, None] > 0) & np.isfinite(ratio), dec, offset)
    dq_codes = q2.reshape(-1)[:n]
    used = dec.reshape(-1)[:n].astype(np.float32)
  deq = (NF4_PUBLISHED[codes] * used[:, None]).astype(np.float32)
  deq = deq.reshape(*lead, nb * block)[..., :length]
  return (codes.reshape(*lead, nb * block), used.reshape(*lead, nb),
          np.moveaxis(deq, -1, axis), absmax.reshape(*lead, nb), dq_codes)


def scaled_blocks(x_nb: np.ndarray, fmt: str, unsigned: bool):
  """Dequantized [N, B] of the 'scaled' codec: grid value of (x/absmax)*top, nearest."""
  x = np.asarray(x_nb, np.float32)
  if unsigned:
    x = np.abs(x)
  top = F32(255.0 if (fmt == "int8" and unsigned) else ELEMENT_MAX[fmt])
  absmax = block_absmax(x, top * MIN_NORMAL)
  factor = np.where(absmax > 0, top / np.where(absmax > 0, absmax, F32(1)), F32(0))
  t = (x * factor.astype(np.float32)[:, None]).astype(np.float32)
  if fmt == "int8":
    lo = 0.0 if unsigned else -127.0
    e = np.clip(np.rint(t), lo, float(top)).astype(np.float32)
  else:
    t = np.clip(t, -top, top)
    e = t.astype(ML_DTYPES[fmt]).astype(np.float32)
  scale = (absmax * (F32(1) / top)).astype(np.float32)
  return (e * scale[:, None]).astype(np.float32)


def blocks_of(x: np.ndarray, block: int) -> np.ndarray:
  flat = np.asarray(x, np.float32).reshape(-1)
  pad = (-flat.size) % block
  return np.concatenate([flat, np.zeros(pad, np.float32)]).reshape(-1, block)
