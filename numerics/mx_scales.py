"""OCP MX block scales: the E8M0 exponent each scale rule gives a block's amax.

For a block with ``amax = max|x|`` and an element format whose largest binade is
``emax`` and largest value ``max``, the rules (``scale_rule``) are:

* ``floor`` (OCP MX v1.0 §6.3, the default): ``e = floor(log2 amax) - emax``.
  ``amax / 2^e`` lies in ``[2^emax, 2^(emax+1))`` and can exceed ``max`` (E4M3: 448
  < 512, E2M1: 6 < 8); those elements saturate to ``max`` (e.g. MXFP8 957 -> 896).
* ``ceil``: ``e = ceil(log2 amax) - emax``; never saturates, loses a binade of range.
* ``rceil``: the smallest ``e`` with ``amax <= max * 2^e`` (the cuBLAS/TE UE8M0 rule,
  never saturates), computed exactly; hardware that forms ``amax * (1/max)`` in f32
  can differ when that product is within an ulp of a power of two.
* ``even``: round ``amax`` to the element's mantissa width (add half of the discarded
  bits), then ``floor`` (torchao's EVEN).
* ``alto``: round ``amax`` to one mantissa bit, then ``floor`` (ALTO's
  ``_calculate_scales``; equal to ``even`` for E2M1).

``e`` is clamped to the E8M0 range [-127, 127] (code ``e + 127``). The arithmetic is on
the float32 bit patterns of the amax, so float32 subnormal amaxes (which XLA:CPU's
float arithmetic flushes) get their exact ``floor(log2 amax)``. The quantizers that
use these rules are in :mod:`numerics.mx`.

``qwix`` (not one of ``SCALE_RULES``: chosen by ``convention="qwix"`` in
:func:`numerics.mx.quantize_mx`, for E4M3 and E2M1 only) is qwix 0.1.8's
``compute_scale_zero_point`` as XLA:CPU runs it: ``s = amax / max``, which XLA:CPU
computes as ``amax * (1/max)`` (both float32 roundings: it turns a division by a
constant into a multiplication by the rounded reciprocal; measured), ``s = 1`` where
``s < 2^-63`` (zero and tiny blocks: code 127), ``e = ceil(log2 s)`` with ``jnp.log2``
(``log(s) / log(2)`` in float32). That is ``rceil`` of ``s`` except where ``s`` or the
float32 logarithm rounds across a power of two: just above ``2^k`` the logarithm
rounds to ``k`` (the largest elements saturate), and at ``s = 2^k`` it is above ``k``
for some ``k`` (one binade coarser; on XLA:CPU ``k`` in {-62, -60, -57, -54, -52, -49,
-31, -30, -27, -26, -15, -13}). Which ``k`` depends on the backend's float32 ``log``,
as qwix's own scale does.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.numerics import float_bits
from lowprec.numerics import formats as formats_lib

_U = np.uint32
_I = np.int32

ScaleRule = Literal["floor", "ceil", "rceil", "even", "alto"]
SCALE_RULES = ("floor", "ceil", "rceil", "even", "alto")
MX_ELEMENT_FORMATS = ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "int8")
MX_BLOCK = 32  # OCP MX v1.0: elements per shared E8M0 scale
MX_CONVENTIONS = ("ocp", "qwix")
QWIX_RULE = "qwix"  # the scale_rule a qwix-convention QuantizedArray records
QWIX_MX_FORMATS = ("e4m3", "e2m1")  # qwix's mxfp8 and mxfp4
_QWIX_TINY = np.float32(2.0 ** -63)  # qwix: sqrt(finfo(float32).tiny)


def _floor_log2(bits: jax.Array) -> jax.Array:
  """floor(log2 v) (int32) of finite float32 magnitude bits, subnormals included
  (:func:`numerics.float_bits.split_bits`'s exponent)."""
  return float_bits.split_bits(bits)[1]


def _round_amax_mantissa(bits: jax.Array, keep: int) -> jax.Array:
  """amax bits with the mantissa rounded (half up) to ``keep`` bits."""
  return bits + _U(1 << (22 - keep))


def mx_scale_exponent(amax_bits: jax.Array, fmt: formats_lib.Format,
                      scale_rule: str) -> jax.Array:
  """OCP E8M0 scale code (int32 in [0, 254]) for block amax bits (finite, >= 0)."""
  return jnp.clip(mx_scale_code_unclamped(amax_bits, fmt, scale_rule), 0, 254)


def mx_scale_code_unclamped(amax_bits: jax.Array, fmt: formats_lib.Format,
                            scale_rule: str) -> jax.Array:
  """The E8M0 code the scale rule asks for (int32), before clamping to [0, 254].

  Outside [0, 254] the block's scale is clamped (numerics telemetry counts these);
  a zero amax gives code 0 (not a clamp).
  """
  if scale_rule == QWIX_RULE:
    return qwix_scale_code(amax_bits, fmt)
  m = fmt.man_bits if fmt.kind == "float" else 7
  if scale_rule == "floor":
    e = _floor_log2(amax_bits) - fmt.emax
  elif scale_rule == "ceil":
    sig, eb = float_bits.split_bits(amax_bits)
    e = eb - fmt.emax + (sig != _U(0x800000)).astype(jnp.int32)
  elif scale_rule == "rceil":
    sig, eb = float_bits.split_bits(amax_bits)
    max_sig = _U((np.float32(fmt.max).view(np.uint32) & 0x7FFFFF) | 0x800000)
    e = eb - fmt.emax + (sig > max_sig).astype(jnp.int32)
  elif scale_rule == "even":
    e = _floor_log2(_round_amax_mantissa(amax_bits, m)) - fmt.emax
  elif scale_rule == "alto":
    e = _floor_log2(_round_amax_mantissa(amax_bits, 1)) - fmt.emax
  else:
    raise ValueError(f"unknown scale_rule {scale_rule!r}; known: "
                     f"{', '.join(SCALE_RULES)}")
  # OCP's code counts from the spec's emax_elem (MXINT8 carries an implicit 2^-6).
  code = e + (fmt.emax - fmt.mx_emax) + 127
  return jnp.where(amax_bits == 0, 0, code)


def qwix_scale_code(amax_bits: jax.Array, fmt: formats_lib.Format) -> jax.Array:
  """E8M0 code (int32, in [64, 254]) of qwix 0.1.8's MX scale for block amax bits
  (finite, >= 0): ``2^ceil(log2(amax * (1/max)))``, and 2^0 where ``amax / max <
  2^-63`` (zero blocks included). See the module docstring."""
  amax = lax.bitcast_convert_type(amax_bits, jnp.float32)
  # A float32 product of normal numbers rounds alike on every backend; a subnormal amax
  # (which XLA:CPU reads as zero) or product falls below the threshold either way.
  s = amax * (np.float32(1.0) / np.float32(fmt.max))
  # Compared as bits: a float32 subnormal quotient is below the threshold either way.
  tiny = lax.bitcast_convert_type(s, jnp.uint32) < _QWIX_TINY.view(np.uint32)
  s = jnp.where(tiny, np.float32(1.0), s)
  return jnp.ceil(jnp.log2(s)).astype(jnp.int32) + 127
