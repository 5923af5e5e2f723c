"""Fused OCP MX quantization kernel (1x32 blocks along the last axis of a 2D array).

The kernel body is :func:`numerics.blockscale.mx_quantize_core` on a row tile, with
stochastic-rounding words drawn in the kernel from the counter hash of
:mod:`numerics.random_bits` at each element's global row-major index. Tiles therefore
see exactly the bits the reference (``quantize_mx(..., rng="hash")``) sees, and the
result does not depend on ``block_rows``.
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
from numerics import formats as formats_lib
from numerics import random_bits as random_bits_lib
from numerics.kernels import dispatch


def _kernel(seed_ref, x_ref, codes_ref, scales_ref, *, fmt, scale_rule, rounding,
            rand_bits, block_rows, k):
  x = x_ref[...].astype(jnp.float32)
  words = None
  if rounding == "stochastic":
    row0 = pl.program_id(0) * block_rows
    rows = (row0 + lax.broadcasted_iota(jnp.int32, (block_rows, k), 0)).astype(jnp.uint32)
    cols = lax.broadcasted_iota(jnp.uint32, (block_rows, k), 1)
    words = random_bits_lib.hash_words(rows * np.uint32(k) + cols, seed_ref[0],
                                       seed_ref[1])
  codes, scales = blockscale.mx_quantize_core(x, fmt, (1,), (MX_BLOCK,), scale_rule,
                                              rounding, words, rand_bits)
  codes_ref[...] = codes
  scales_ref[...] = scales


@functools.partial(jax.jit, static_argnames=(
    "fmt", "scale_rule", "rounding", "rand_bits", "block_rows", "interpret", "use_kernel"))
def mx_quantize(x: jax.Array, fmt: str = "e4m3", *, scale_rule: str = "floor",
                rounding: str = "nearest", key: jax.Array | None = None,
                rand_bits: int | None = None, block_rows: int | None = None,
                interpret: bool = False, use_kernel: bool | None = None
                ) -> blockscale.QuantizedArray:
  """MX-quantizes a 2D ``(M, K)`` array in 1x32 blocks along K (``K % 32 == 0``).

  Same result as ``numerics.quantize_mx(x, fmt, scale_rule=..., rounding=..., key=...,
  rand_bits=...)`` (hash random words), bit for bit.

  Args:
    x: float32/bfloat16 ``(M, K)``.
    block_rows: rows per kernel tile (default: the largest power of two <= 256
      dividing M).
    interpret: run the Pallas kernel in interpret mode (CPU tests).
    use_kernel: force (True) or skip (False) the Pallas kernel; default: kernel on
      GPU/TPU, fused jnp on the CPU.
  """
  f = formats_lib.get(fmt)
  x = jnp.asarray(x)
  if x.ndim != 2 or x.shape[1] % MX_BLOCK:
    raise ValueError(f"mx_quantize takes a 2D array with K % {MX_BLOCK} == 0, got "
                     f"{x.shape}; use numerics.quantize_mx(..., pad=True) otherwise")
  if rounding == "stochastic" and key is None:
    raise ValueError("rounding='stochastic' needs a PRNG key")
  if not dispatch.use_pallas(interpret, use_kernel):
    return blockscale.quantize_mx(x, f, block_size=MX_BLOCK, axis=-1,
                                  scale_rule=scale_rule, rounding=rounding, key=key,
                                  rand_bits=rand_bits, rng="hash")
  if f.name not in blockscale.MX_ELEMENT_FORMATS:
    raise ValueError(f"MX element format must be one of {blockscale.MX_ELEMENT_FORMATS}")
  m, k = x.shape
  br = block_rows or dispatch.default_block(m, 256)
  if m % br:
    raise ValueError(f"block_rows {br} does not divide M = {m}")
  if key is None:
    seeds = jnp.zeros((2,), jnp.uint32)
  else:
    seeds = jnp.stack(random_bits_lib.key_to_seeds(key))
  kernel = functools.partial(_kernel, fmt=f, scale_rule=scale_rule, rounding=rounding,
                             rand_bits=rand_bits, block_rows=br, k=k)
  codes, scales = pl.pallas_call(
      kernel,
      grid=(m // br,),
      in_specs=[pl.BlockSpec((2,), lambda i: (0,)),
                pl.BlockSpec((br, k), lambda i: (i, 0))],
      out_specs=[pl.BlockSpec((br, k), lambda i: (i, 0)),
                 pl.BlockSpec((br, k // MX_BLOCK), lambda i: (i, 0))],
      out_shape=[jax.ShapeDtypeStruct((m, k), jnp.uint8),
                 jax.ShapeDtypeStruct((m, k // MX_BLOCK), jnp.uint8)],
      interpret=interpret,
  )(seeds, x.astype(jnp.float32))
  return blockscale.QuantizedArray(
      codes=codes, scales=scales, tensor_scale=jnp.float32(1.0), fmt=f.name,
      scale_fmt="e8m0", axes=(1,), block_shape=(MX_BLOCK,), shape=(m, k),
      scale_rule=scale_rule)
