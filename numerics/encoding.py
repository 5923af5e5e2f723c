"""Bit codes of narrow (<= 8-bit) formats: values <-> uint8 codes.

Codes are the format's own bit pattern in the low ``bits`` of a uint8 (FP4 in the low
nibble, FP6 in the low six bits, INT8 as two's complement, E8M0 as the biased
exponent). The decode tables are built here in NumPy from the format definition
(sign, biased exponent, mantissa, specials), not taken from ml_dtypes, so the tests can
check them against ml_dtypes independently.

Decoding is exact without float arithmetic: each code maps to ``(sign, n, qe)`` with
value ``(-1)^sign * n * 2^qe`` and is rebuilt with :func:`numerics.float_bits.compose_bits`
(XLA:CPU flushes float32 subnormals in float arithmetic; block scales reach 2^-127).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.numerics import float_bits
from lowprec.numerics import formats as formats_lib

_U = np.uint32


def _check_narrow(fmt: formats_lib.Format) -> None:
  if not fmt.is_narrow:
    raise ValueError(f"{fmt.name} is {fmt.bits}-bit; codes exist only for formats of "
                     f"at most 8 bits")


@functools.lru_cache(maxsize=None)
def decode_parts_table(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                           np.ndarray]:
  """Per-code ``(sign, n, qe, is_nan)`` NumPy tables: value = (-1)^sign n 2^qe."""
  f = formats_lib.get(name)
  _check_narrow(f)
  size = 2 ** f.bits
  sign = np.zeros(size, np.uint32)
  n = np.zeros(size, np.uint32)
  qe = np.zeros(size, np.int32)
  nan = np.zeros(size, bool)
  for c in range(size):
    if f.kind == "int":
      k = c - 256 if c >= 128 else c
      sign[c], n[c], qe[c] = (1 if k < 0 else 0), abs(k), 0
      if k == -128:  # unused asymmetric code (OCP MXINT8 / microxcaling)
        nan[c] = True
      continue
    if f.kind == "scale":
      n[c], qe[c] = 1, c - f.bias
      nan[c] = c == f.nan_code
      continue
    s = c >> (f.bits - 1)
    e = (c >> f.man_bits) & ((1 << f.exp_bits) - 1)
    m = c & ((1 << f.man_bits) - 1)
    sign[c] = s
    if e == 0:
      n[c], qe[c] = m, f.emin - f.man_bits
    else:
      n[c], qe[c] = (1 << f.man_bits) | m, e - f.bias - f.man_bits
    top = e == (1 << f.exp_bits) - 1
    if f.has_inf and top:  # IEEE-like (e5m2): top exponent is Inf / NaN
      nan[c] = m != 0
      if m == 0:
        n[c], qe[c] = 0, 255  # marker for Inf, handled in decode_table
    elif f.has_nan and top and m == (1 << f.man_bits) - 1:  # e4m3: S.1111.111
      nan[c] = True
  return sign, n, qe, nan


@functools.lru_cache(maxsize=None)
def decode_table(name: str) -> np.ndarray:
  """float32 value of every code of narrow format ``name`` (NaN for NaN codes)."""
  sign, n, qe, nan = decode_parts_table(name)
  with np.errstate(over="ignore"):
    vals = n.astype(np.float64) * np.exp2(qe.astype(np.float64))
  f = formats_lib.get(name)
  if f.has_inf:
    vals = np.where((n == 0) & (qe == 255), np.inf, vals)
  vals = np.where(sign == 1, -vals, vals)
  vals = np.where(nan, np.nan, vals)
  return vals.astype(np.float32)


def decode(codes: jax.Array, fmt: str | formats_lib.Format) -> jax.Array:
  """float32 values of uint8 ``codes`` of a narrow format (exact, any shape)."""
  f = formats_lib.get(fmt)
  _check_narrow(f)
  return decode_scaled(codes, f, 0)


def decode_scaled(codes: jax.Array, fmt: formats_lib.Format,
                  scale_exp: jax.Array | int) -> jax.Array:
  """float32 ``decode(codes) * 2^scale_exp``, exact (no float multiply involved)."""
  sign_t, n_t, qe_t, nan_t = (jnp.asarray(t) for t in decode_parts_table(fmt.name))
  idx = codes.astype(jnp.int32)
  n = jnp.take(n_t, idx)
  qe = jnp.take(qe_t, idx)
  bits = float_bits.compose_bits(n, qe + scale_exp)
  if fmt.has_inf:
    bits = jnp.where((n == 0) & (qe == 255), _U(0x7F800000), bits)
  bits = bits | (jnp.take(sign_t, idx) << 31)
  bits = jnp.where(jnp.take(nan_t, idx), _U(0x7FC00000), bits)
  return lax.bitcast_convert_type(bits, jnp.float32)


def encode(values: jax.Array, fmt: str | formats_lib.Format) -> jax.Array:
  """uint8 codes of float32 ``values`` that are exactly representable in ``fmt``.

  Use after :func:`numerics.cast` (or a block quantizer's rounding). NaN maps to the
  format's NaN code, or 0 where it has none; values off the grid are truncated
  toward zero (they are a caller bug, not a rounding mode).
  """
  f = formats_lib.get(fmt)
  _check_narrow(f)
  v = jnp.asarray(values, jnp.float32)
  b = lax.bitcast_convert_type(v, jnp.uint32)
  sign = b >> 31
  a = b & _U(0x7FFFFFFF)
  is_nan = a > _U(0x7F800000)
  is_inf = a == _U(0x7F800000)
  sig, eb = float_bits.split_bits(a)
  if f.kind == "int":
    k = jnp.where(a == 0, _U(0),
                  sig >> jnp.clip(23 - eb, 0, 31).astype(jnp.uint32))
    code = jnp.where(sign == 1, (_U(256) - k) & _U(0xFF), k)
    return jnp.where(is_nan, _U(0), code).astype(jnp.uint8)
  if f.kind == "scale":
    # 2^-127 is the f32 subnormal 0x00400000; everything else is a normal power of 2.
    code = jnp.where(a == _U(0x00400000), _U(0), (a >> 23) & _U(0xFF))
    return jnp.where(is_nan | (sign == 1) | (a == 0), _U(f.nan_code),
                     code).astype(jnp.uint8)
  m = f.man_bits
  normal = eb >= f.emin
  man_n = (sig >> _U(23 - m)) & _U((1 << m) - 1)
  exp_n = (eb + f.bias).astype(jnp.uint32)
  sub_shift = jnp.clip(23 - m + f.emin - eb, 0, 31).astype(jnp.uint32)
  man_s = sig >> sub_shift
  mag = jnp.where(normal, (exp_n << m) | man_n, man_s)
  mag = jnp.where(a == 0, _U(0), mag)
  if f.inf_code is not None:
    mag = jnp.where(is_inf, _U(f.inf_code), mag)
  code = (sign << (f.bits - 1)) | mag
  nan_code = f.nan_code if f.nan_code is not None else 0
  return jnp.where(is_nan, _U(nan_code), code).astype(jnp.uint8)


def decode_arith_scaled(codes: jax.Array, fmt: formats_lib.Format,
                        scale_exp: jax.Array | int) -> jax.Array:
  """float32 ``decode(codes) * 2^scale_exp`` from the bit fields alone (no tables).

  For kernels, which cannot close over lookup tables. Float and int formats; NaN/Inf
  codes are not special-cased (block quantizers never emit them; a poisoned block is
  marked by its scale). Equal to :func:`decode_scaled` on every other code (tested).
  """
  c = codes.astype(jnp.uint32)
  if fmt.kind == "int":
    sign = c >> 7
    n = jnp.where(sign == 1, _U(256) - c, c)
    qe = jnp.zeros(c.shape, jnp.int32)
  elif fmt.kind == "float":
    m = fmt.man_bits
    sign = c >> (fmt.bits - 1)
    e = ((c >> m) & _U((1 << fmt.exp_bits) - 1)).astype(jnp.int32)
    man = c & _U((1 << m) - 1)
    n = jnp.where(e == 0, man, man | _U(1 << m))
    qe = jnp.where(e == 0, fmt.emin - m, e - fmt.bias - m)
  else:
    raise ValueError(f"decode_arith_scaled does not handle {fmt.name}")
  bits = float_bits.compose_bits(n, qe + scale_exp) | (sign << 31)
  return lax.bitcast_convert_type(bits, jnp.float32)


def pack_nibbles(codes: jax.Array) -> jax.Array:
  """Packs 4-bit codes (uint8 in [0, 15]) two per byte along the last axis.

  Element ``2j`` goes to the high nibble and ``2j + 1`` to the low nibble of byte
  ``j`` (the order of bitsandbytes' 4-bit kernels and torchao's 4-bit optimizer
  state). An odd last axis is padded with a zero code. Bits above the low nibble of
  the input are ignored.
  """
  c = jnp.asarray(codes)
  if c.dtype != jnp.uint8:
    raise TypeError(f"pack_nibbles expects uint8 codes, got {c.dtype}")
  if c.ndim == 0:
    raise ValueError("pack_nibbles needs at least one axis")
  if c.shape[-1] % 2:
    c = jnp.pad(c, [(0, 0)] * (c.ndim - 1) + [(0, 1)])
  c = c & np.uint8(0x0F)
  return (c[..., 0::2] << np.uint8(4)) | c[..., 1::2]


def unpack_nibbles(packed: jax.Array, length: int | None = None) -> jax.Array:
  """Inverse of :func:`pack_nibbles`: uint8 codes in [0, 15], last axis doubled.

  ``length`` (optional) trims the unpacked last axis (drops the pad of an odd one).
  """
  p = jnp.asarray(packed)
  if p.dtype != jnp.uint8:
    raise TypeError(f"unpack_nibbles expects uint8 bytes, got {p.dtype}")
  out = jnp.stack([p >> np.uint8(4), p & np.uint8(0x0F)], axis=-1)
  out = out.reshape(*p.shape[:-1], 2 * p.shape[-1])
  if length is not None:
    if not 0 <= length <= out.shape[-1]:
      raise ValueError(f"length {length} out of range for {out.shape[-1]} codes")
    out = out[..., :length]
  return out
