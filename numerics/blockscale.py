"""Block-scaled quantization: OCP MX (E8M0 scales) and NVFP4 (E4M3 scales + fp32).

The public API of the block-scaled formats, gathered from the modules that implement
them (each name below is importable from here and from its own module):

* :mod:`numerics.block_layout`: :class:`QuantizedArray` (codes, scales, tensor scale
  and layout; a pytree), ``block_shape`` / ``axis`` geometry, padding, per-block
  statistics and amaxes, the mesh-axis amax reduction.
* :mod:`numerics.mx_scales`: the E8M0 scale rules (``floor``, ``ceil``, ``rceil``,
  ``even``, ``alto``).
* :mod:`numerics.mx`: :func:`quantize_mx`, :func:`quantize_dequantize_mx` and the
  integer cores the Pallas kernels run.
* :mod:`numerics.nvfp4`: :func:`quantize_nvfp4` and its dequantizing forms, in
  Transformer Engine's convention (:mod:`numerics.nvfp4_te`, fast path
  :mod:`numerics.nvfp4_fast`) or torchao's (:mod:`numerics.nvfp4_torchao`).
* here: :func:`dequantize`, for every :class:`QuantizedArray`.

Every function is bit-exact against the NumPy references written from the specs
(``tests/numerics/mx_reference.py``) on every backend, float32 subnormals included.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.numerics import block_layout
from lowprec.numerics import encoding
from lowprec.numerics import float_bits
from lowprec.numerics import formats as formats_lib
from lowprec.numerics.block_layout import (AmaxAxisName, NVFP4_BLOCK, NVFP4_CONVENTIONS,
                                          QuantizedArray, block_amax_bits,
                                          block_statistic, canonical_block,
                                          check_amax_axis_name, pad_to_multiple,
                                          reduce_amax_bits)
from lowprec.numerics.mx import (mx_grid_exponents, mx_quantize_core,
                                 mx_quantize_dequantize_core, mx_scale_clamped,
                                 quantize_dequantize_mx, quantize_mx)
from lowprec.numerics.mx_scales import (MX_BLOCK, MX_ELEMENT_FORMATS, SCALE_RULES,
                                        ScaleRule, mx_scale_code_unclamped,
                                        mx_scale_exponent)
from lowprec.numerics.nvfp4 import (nvfp4_grid_multipliers, nvfp4_layout,
                                    quantize_dequantize_nvfp4,
                                    quantize_dequantize_nvfp4_blocks,
                                    quantize_dequantize_nvfp4_blocks_many, quantize_nvfp4)
from lowprec.numerics.nvfp4_fast import nvfp4_te_fast
from lowprec.numerics.nvfp4_te import (encode_e4m3_nonnegative, nvfp4_quantize_core,
                                       nvfp4_tensor_scale, tensor_scaled)
from lowprec.numerics.nvfp4_torchao import (nvfp4_torchao_quantize_core,
                                            nvfp4_torchao_tensor_scale)

__all__ = [
    "AmaxAxisName", "MX_BLOCK", "MX_ELEMENT_FORMATS", "NVFP4_BLOCK", "NVFP4_CONVENTIONS",
    "QuantizedArray", "SCALE_RULES", "ScaleRule", "block_amax_bits", "block_statistic",
    "canonical_block", "check_amax_axis_name", "dequantize", "encode_e4m3_nonnegative",
    "mx_grid_exponents", "mx_quantize_core", "mx_quantize_dequantize_core",
    "mx_scale_clamped", "mx_scale_code_unclamped", "mx_scale_exponent",
    "nvfp4_grid_multipliers", "nvfp4_layout", "nvfp4_quantize_core",
    "nvfp4_te_fast", "nvfp4_tensor_scale", "nvfp4_torchao_quantize_core",
    "nvfp4_torchao_tensor_scale", "pad_to_multiple", "quantize_dequantize_mx",
    "quantize_dequantize_nvfp4", "quantize_dequantize_nvfp4_blocks",
    "quantize_dequantize_nvfp4_blocks_many", "quantize_mx",
    "quantize_nvfp4", "reduce_amax_bits", "tensor_scaled",
]


def _expand_scales(q: QuantizedArray, values: jax.Array) -> jax.Array:
  """Broadcasts per-block ``values`` (scales' shape) to the codes' shape."""
  bshape, bpos = block_layout.blocked_shape(q.padded_shape, q.axes, q.block_shape)
  v = jnp.expand_dims(values, bpos)
  return jnp.broadcast_to(v, bshape).reshape(q.padded_shape)


def _dequantize_one(q: QuantizedArray) -> jax.Array:
  f = formats_lib.get(q.fmt)
  if q.scale_fmt == "e8m0":
    s_code = _expand_scales(q, q.scales.astype(jnp.int32))
    s_int = s_code - 127 - (f.emax - f.mx_emax)
    out = encoding.decode_scaled(q.codes, f, s_int)
    out = jnp.where(s_code == 255, np.float32(np.nan), out)
  elif q.scale_rule == "nvfp4_torchao":
    def decode(mul):
      scale = _expand_scales(q, encoding.decode(q.scales, "e4m3"))
      return mul(encoding.decode(q.codes, f), mul(scale, q.tensor_scale))
    out = tensor_scaled(q.tensor_scale, decode)
  else:
    # Element (n_e 2^qe_e) times E4M3 scale (n_s 2^qe_s): integer product, exact.
    _, n_e_t, qe_e_t, _ = encoding.decode_parts_table(f.name)
    sgn_s_t, n_s_t, qe_s_t, nan_s_t = encoding.decode_parts_table(q.scale_fmt)
    def decode(mul):
      ce = q.codes.astype(jnp.int32)
      cs = _expand_scales(q, q.scales.astype(jnp.int32))
      n = jnp.take(jnp.asarray(n_e_t), ce) * jnp.take(jnp.asarray(n_s_t), cs)
      qe = jnp.take(jnp.asarray(qe_e_t), ce) + jnp.take(jnp.asarray(qe_s_t), cs)
      bits = float_bits.compose_bits(n, qe) | ((q.codes.astype(jnp.uint32) >> 3) << 31)
      out = mul(lax.bitcast_convert_type(bits, jnp.float32), q.tensor_scale)
      return jnp.where(jnp.take(jnp.asarray(nan_s_t), cs), np.float32(np.nan), out)
    out = tensor_scaled(q.tensor_scale, decode)
  return out[tuple(slice(0, d) for d in q.shape)]


@jax.jit
def dequantize(q: QuantizedArray) -> jax.Array:
  """float32 array of the original shape: element * block scale (* tensor scale).

  MX decoding is exact (the product is built bit by bit, so block scales down to
  2^-127 work on XLA:CPU too). NVFP4 (``te``): element * E4M3 scale is exact as well;
  the final multiply by the fp32 tensor scale is one float32 rounding. NVFP4
  (``torchao``): ``element * (per_tensor_scale * scale)``, two roundings, as torchao's
  ``dequantize``. A batched ``q`` (leading dimensions from ``jax.vmap``) gives
  ``batch_shape + shape``. Gradient: none (integer codes).
  """
  if not isinstance(q, QuantizedArray):
    raise TypeError(f"dequantize expects a QuantizedArray, got {type(q).__name__}")
  batch = q.batch_shape
  if not batch:
    return _dequantize_one(q)
  n = math.prod(batch)
  flat = dataclasses.replace(
      q, codes=q.codes.reshape((n,) + q.codes.shape[len(batch):]),
      scales=q.scales.reshape((n,) + q.scales.shape[len(batch):]),
      tensor_scale=(q.tensor_scale.reshape(n) if q.tensor_scale.shape else
                    jnp.broadcast_to(q.tensor_scale, (n,))))
  out = jax.vmap(_dequantize_one)(flat)
  return out.reshape(batch + q.shape)
