"""Block-scaled matmul kernel: ``A (M, K) @ B (K, N)`` from MX codes and E8M0 scales.

A is MX-quantized in 1x32 blocks along K (axis 1), B in 32x1 blocks along K (axis 0),
as a GEMM's operands are. Each output tile accumulates, chunk by chunk along K, the
float32 product of the decoded chunks (decoding is exact; see
:func:`numerics.encoding.decode_arith_scaled`). The reference
:func:`mx_matmul_reference` runs the same tile and chunk loop in jnp, so interpret mode
matches it bit for bit; with exactly summable operands both equal
``dequantize(A) @ dequantize(B)``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
import numpy as np

from numerics import blockscale
from numerics.blockscale import MX_BLOCK
from numerics import encoding
from numerics import formats as formats_lib
from numerics.kernels import dispatch


def _check(qa: blockscale.QuantizedArray, qb: blockscale.QuantizedArray) -> None:
  for name, q, axis in (("lhs", qa, 1), ("rhs", qb, 0)):
    if not isinstance(q, blockscale.QuantizedArray) or q.scale_fmt != "e8m0":
      raise TypeError(f"{name} must be an MX QuantizedArray")
    if len(q.shape) != 2 or q.axes != (axis,) or q.block_shape != (MX_BLOCK,):
      raise ValueError(f"{name} must be 2D with 1D blocks of {MX_BLOCK} along axis "
                       f"{axis} (the contraction axis), got axes {q.axes} blocks "
                       f"{q.block_shape} shape {q.shape}")
    if q.padded_shape != q.shape:
      raise ValueError(f"{name} is padded; mx_matmul needs K % {MX_BLOCK} == 0")
  if qa.shape[1] != qb.shape[0]:
    raise ValueError(f"contraction mismatch: {qa.shape} @ {qb.shape}")


def _decode_chunk(codes, scales, fmt, axis):
  f = formats_lib.get(fmt)
  s = jnp.repeat(scales.astype(jnp.int32), MX_BLOCK, axis=axis)
  v = encoding.decode_arith_scaled(codes, f, s - 127 - (f.emax - f.mx_emax))
  return jnp.where(s == 255, np.float32(np.nan), v)


def _tile_product(a_codes, a_scales, b_codes, b_scales, fa, fb, block_k):
  """float32 (bm, bn) = sum over K chunks of decode(A chunk) @ decode(B chunk)."""
  k = a_codes.shape[1]
  acc = jnp.zeros((a_codes.shape[0], b_codes.shape[1]), jnp.float32)
  sk = block_k // MX_BLOCK
  for c in range(k // block_k):
    a = _decode_chunk(a_codes[:, c * block_k:(c + 1) * block_k],
                      a_scales[:, c * sk:(c + 1) * sk], fa, 1)
    b = _decode_chunk(b_codes[c * block_k:(c + 1) * block_k],
                      b_scales[c * sk:(c + 1) * sk], fb, 0)
    acc = acc + jnp.dot(a, b, preferred_element_type=jnp.float32,
                        precision=lax.Precision.HIGHEST)
  return acc


def _kernel(ac_ref, as_ref, bc_ref, bs_ref, o_ref, *, fa, fb, block_k):
  o_ref[...] = _tile_product(ac_ref[...], as_ref[...], bc_ref[...], bs_ref[...], fa, fb,
                             block_k)


def _blocks(qa, qb, block_m, block_n, block_k):
  m, k = qa.shape
  n = qb.shape[1]
  bm = block_m or dispatch.default_block(m, 128)
  bn = block_n or dispatch.default_block(n, 128)
  bk = block_k or dispatch.default_block(k, 256)
  if m % bm or n % bn or k % bk or bk % MX_BLOCK:
    raise ValueError(f"blocks ({bm}, {bn}, {bk}) must divide ({m}, {n}, {k}) and "
                     f"block_k must be a multiple of {MX_BLOCK}")
  return bm, bn, bk


@functools.partial(jax.jit, static_argnames=("block_m", "block_n", "block_k"))
def mx_matmul_reference(qa: blockscale.QuantizedArray, qb: blockscale.QuantizedArray,
                        *, block_m: int | None = None, block_n: int | None = None,
                        block_k: int | None = None) -> jax.Array:
  """The kernel's computation in jnp, tile by tile and chunk by chunk (float32)."""
  _check(qa, qb)
  bm, bn, bk = _blocks(qa, qb, block_m, block_n, block_k)
  m, n = qa.shape[0], qb.shape[1]
  rows = []
  for i in range(m // bm):
    cols = []
    for j in range(n // bn):
      cols.append(_tile_product(
          qa.codes[i * bm:(i + 1) * bm], qa.scales[i * bm:(i + 1) * bm],
          qb.codes[:, j * bn:(j + 1) * bn], qb.scales[:, j * bn:(j + 1) * bn],
          qa.fmt, qb.fmt, bk))
    rows.append(jnp.concatenate(cols, axis=1))
  return jnp.concatenate(rows, axis=0)


@functools.partial(jax.jit, static_argnames=(
    "block_m", "block_n", "block_k", "interpret", "use_kernel"))
def mx_matmul(qa: blockscale.QuantizedArray, qb: blockscale.QuantizedArray, *,
              block_m: int | None = None, block_n: int | None = None,
              block_k: int | None = None, interpret: bool = False,
              use_kernel: bool | None = None) -> jax.Array:
  """float32 ``dequantize(qa) @ dequantize(qb)`` from codes and scales.

  Args:
    qa: MX ``(M, K)`` quantized along axis 1; qb: MX ``(K, N)`` along axis 0.
    block_m, block_n, block_k: kernel tile sizes (defaults: powers of two up to 128,
      128, 256 dividing the dims).
    interpret, use_kernel: as in :func:`numerics.kernels.mx_quantize`; on the CPU
      without them this is ``dequantize(qa) @ dequantize(qb)`` in one XLA dot.
  """
  _check(qa, qb)
  if not dispatch.use_pallas(interpret, use_kernel):
    return jnp.dot(blockscale.dequantize(qa), blockscale.dequantize(qb),
                   preferred_element_type=jnp.float32, precision=lax.Precision.HIGHEST)
  bm, bn, bk = _blocks(qa, qb, block_m, block_n, block_k)
  m, k = qa.shape
  n = qb.shape[1]
  kernel = functools.partial(_kernel, fa=qa.fmt, fb=qb.fmt, block_k=bk)
  return pl.pallas_call(
      kernel,
      grid=(m // bm, n // bn),
      in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                pl.BlockSpec((bm, k // MX_BLOCK), lambda i, j: (i, 0)),
                pl.BlockSpec((k, bn), lambda i, j: (0, j)),
                pl.BlockSpec((k // MX_BLOCK, bn), lambda i, j: (0, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
      out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
      interpret=interpret,
  )(qa.codes, qa.scales, qb.codes, qb.scales)
