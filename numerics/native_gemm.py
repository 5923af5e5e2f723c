"""Native low-precision GEMMs: quantized operands consumed in their storage types.

By default every quantized GEMM of :mod:`numerics.qdot` is *emulated*: each operand is
quantized, dequantized to float32 (or bf16) and multiplied by an ordinary GEMM. A GEMM
whose recipe sets ``GemmRecipe.native`` (:func:`numerics.recipes.with_native_gemm`)
keeps its operands in their storage types where the program is lowered for ``cuda``:

* per-tensor FP8 (``TensorQuant``/``DelayedQuant`` in ``e4m3``/``e5m2``): an
  ``f8 x f8 -> f32`` ``dot_general`` of the codes (Hopper's and Blackwell's FP8 tensor
  cores, cuBLASLt), the output multiplied by the two decode scales ``1/s`` (the
  ``scale_inv`` of Transformer Engine), as :func:`numerics.qdot` applies NVFP4 tensor
  scales;
* MXFP8 (``MXQuant`` ``e4m3``/``e5m2``, E8M0 scales over 32 elements of the
  contraction axis) and NVFP4 (``te``/``qwix`` convention, E4M3 scales over 16) through
  :func:`jax.nn.scaled_matmul` (cuDNN's block-scaled GEMM on Blackwell; XLA rewrites
  it to dequantize + GEMM elsewhere), NVFP4's tensor scales applied to the output.

A 2D tile's scale is repeated along the free axis (a square tile of the forward weight
is a valid block of the dgrad contraction too). Everywhere else -- a program lowered for
``cpu``, ``tpu`` or ``rocm`` -- the GEMM is the emulated one (one
``lax.platform_dependent`` switch per GEMM), so on those platforms a native recipe gives
the emulated recipe's bits exactly: the operands are quantized by the same quantizer
(:func:`numerics.quantizer.tensor_quantize`, :func:`numerics.delayed_scaling.quantize`,
:func:`numerics.quantizer.quantize`) and the emulated GEMM multiplies their exact
dequantized values. On a GPU the two differ by the accumulation (order and
precision: Hopper's FP8 tensor cores accumulate in about 14 fraction bits,
:mod:`numerics.accumulation` emulates it) and, for per-tensor FP8, by where the decode
scale is applied (once to the float32 sum, instead of rounding every dequantized
element). :func:`reference_output` is that native arithmetic in NumPy float64.
"""

from __future__ import annotations

import dataclasses
from typing import Callable
import warnings

import jax
import jax.numpy as jnp
from jax import lax

from lowprec.numerics import block_layout
from lowprec.numerics import blockscale
from lowprec.numerics import operand_quant

# Kinds of native operand (both operands of a native GEMM are of one kind).
FP8_TENSOR, MXFP8, NVFP4 = "fp8_tensor", "mxfp8", "nvfp4"
KINDS = (FP8_TENSOR, MXFP8, NVFP4)
_FP8 = {"e4m3": jnp.float8_e4m3fn, "e5m2": jnp.float8_e5m2}
_BLOCK = {MXFP8: blockscale.MX_BLOCK, NVFP4: blockscale.NVFP4_BLOCK}


class NativeGemmFallback(UserWarning):
  """A native GEMM was traced for a default backend without native GEMMs."""


def kind(op: operand_quant.OperandQuant | None) -> str | None:
  """The native form of an operand quantizer (:data:`KINDS`), or None if it has none.

  FP8 tensor and delayed scaling (``e4m3``/``e5m2``), MX ``e4m3``/``e5m2`` without
  macro blocks whose contraction-axis block is 32, NVFP4 (``te`` or ``qwix``; torchao's
  decode rounds twice, so its values are no code x scale product).
  """
  if isinstance(op, (operand_quant.TensorQuant, operand_quant.DelayedQuant)):
    return FP8_TENSOR if op.fmt in _FP8 else None
  if isinstance(op, operand_quant.MXQuant):
    ok = (op.fmt in _FP8 and op.macro_block is None
          and op.block_extents[0] == blockscale.MX_BLOCK)
    return MXFP8 if ok else None
  if isinstance(op, operand_quant.NVFP4Quant):
    return NVFP4 if op.convention in ("te", "qwix") else None
  return None


def pair_kind(lhs: operand_quant.OperandQuant | None,
              rhs: operand_quant.OperandQuant | None) -> str | None:
  """The native form of a GEMM with these operand quantizers, or None."""
  k = kind(lhs)
  return k if k is not None and kind(rhs) == k else None


@dataclasses.dataclass(frozen=True)
class Operand:
  """A quantized GEMM operand in its storage form (a pytree).

  ``codes``: the operand's elements in their storage dtype (float8 or float4), the
  operand's shape with the blocked axes zero-padded to whole blocks; ``scales``: the
  block scales (float8_e8m0fnu or float8_e4m3fn) over the blocked axes (None for
  per-tensor FP8); ``decode``: a float32 scalar the GEMM output is multiplied by (FP8:
  ``1/s``; NVFP4 ``te``: ``1/S_enc``; 1 otherwise). ``extents``: the block extent along
  each axis of ``codes`` (1: unblocked), static.
  """

  codes: jax.Array
  scales: jax.Array | None
  decode: jax.Array
  extents: tuple[int, ...]


jax.tree_util.register_dataclass(Operand, data_fields=["codes", "scales", "decode"],
                                 meta_fields=["extents"])


def tensor_operand(codes: jax.Array, decode: jax.Array, fmt: str) -> Operand:
  """The native form of a per-tensor FP8 operand: its float32 ``codes`` (values of
  ``fmt``, exact) and its decode scale."""
  return Operand(codes.astype(_FP8[fmt]), None, jnp.asarray(decode, jnp.float32),
                 (1,) * codes.ndim)


def block_operand(q: block_layout.QuantizedArray) -> Operand:
  """The native form of an MXFP8 or NVFP4 :class:`QuantizedArray` (unbatched)."""
  ext = dict(zip(q.axes, q.block_shape))
  extents = tuple(ext.get(a, 1) for a in range(len(q.shape)))
  values = q.element_values()  # exact in float32
  if q.scale_fmt == "e8m0":
    codes = values.astype(_FP8[q.fmt])
    scales = lax.bitcast_convert_type(q.scales.astype(jnp.uint8), jnp.float8_e8m0fnu)
  else:
    codes = values.astype(jnp.float4_e2m1fn)
    scales = q.scale_values().astype(jnp.float8_e4m3fn)  # E4M3 values: exact (NaN kept)
  return Operand(codes, scales, jnp.asarray(q.tensor_scale, jnp.float32), extents)


def _rows_by_contraction(op: Operand, contract_axis: int, rows: int,
                         block: int) -> tuple[jax.Array, jax.Array | None]:
  """(codes, scales) as ``(B, rows, K_padded)`` and ``(B, rows, K_padded / block)``:
  the contraction axis last, the free axis cropped to ``rows``, a tile's scale repeated
  along the free axis."""
  codes, scales = op.codes, op.scales
  if contract_axis % codes.ndim != codes.ndim - 1:
    codes = jnp.swapaxes(codes, -1, -2)
    scales = None if scales is None else jnp.swapaxes(scales, -1, -2)
    free_extent, k_extent = op.extents[-1], op.extents[-2]
  else:
    free_extent, k_extent = op.extents[-2], op.extents[-1]
  codes = codes[..., :rows, :]
  if scales is None:
    return codes, None
  if k_extent != block:
    raise ValueError(f"a native block-scaled GEMM needs blocks of {block} along the "
                     f"contraction axis, got {k_extent}")
  if free_extent != 1:
    scales = jnp.repeat(scales, free_extent, axis=-2)
  return codes, scales[..., :rows, :]


def gemm(a: Operand, b: Operand, contract_a: int, contract_b: int, out_rows: int,
         out_cols: int, native_kind: str) -> jax.Array:
  """The native GEMM ``(B, out_rows, out_cols)`` float32 of two operands contracted
  over ``contract_a``/``contract_b`` (-1 or -2; the other of the last two axes is each
  operand's free axis), the decode scales applied to the output."""
  if native_kind == FP8_TENSOR:
    a_c, _ = _rows_by_contraction(a, contract_a, out_rows, 1)
    b_c, _ = _rows_by_contraction(b, contract_b, out_cols, 1)
    out = lax.dot_general(a_c, b_c, (((2,), (2,)), ((0,), (0,))),
                          preferred_element_type=jnp.float32)
  else:
    block = _BLOCK[native_kind]
    a_c, a_s = _rows_by_contraction(a, contract_a, out_rows, block)
    b_c, b_s = _rows_by_contraction(b, contract_b, out_cols, block)
    out = jax.nn.scaled_matmul(a_c, b_c, a_s, b_s, preferred_element_type=jnp.float32)
  return out * (a.decode * b.decode)


def switch(native: Callable[..., jax.Array], native_args: tuple,
           emulated: Callable[..., jax.Array], emulated_args: tuple, what: str
           ) -> jax.Array:
  """``native(*native_args)`` in programs lowered for ``cuda``,
  ``emulated(*emulated_args)`` elsewhere (warned once per ``what`` and backend when the
  default backend has no native GEMM)."""
  backend = jax.default_backend()
  if backend != "gpu":
    warnings.warn(f"{what}: no native GEMM on the default backend {backend!r}; the "
                  f"emulated GEMM runs there (same bits as the recipe without "
                  f"with_native_gemm)", NativeGemmFallback, stacklevel=2)
  return lax.platform_dependent(native_args, emulated_args,
                                cuda=lambda n, e: native(*n),
                                default=lambda n, e: emulated(*e))
