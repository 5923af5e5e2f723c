"""Block-scaled matmul kernel: ``A (M, K) @ B (K, N)`` from MX codes and E8M0 scales.

A is MX-quantized in 1x32 blocks along K (axis 1), B in 32x1 blocks along K (axis 0),
as a GEMM's operands are. Each ``(bm, bn)`` output tile loops over K in ``bk`` steps:
the step's A and B codes are decoded with their block scales to bfloat16 (exact: MX
elements have at most 8 significant bits, and the power-of-two scale only moves the
exponent, except below 2^-126 where the product is a float32 subnormal), multiplied on
the tensor cores / MXU, and accumulated in float32. The result is
``dequantize(A) @ dequantize(B)`` summed in the backend's order: exact whenever every
partial sum is (tested bit for bit against NumPy on such operands), otherwise within
float32 accumulation error.

Per backend:

* GPU (Triton): grid ``(M/bm, N/bn)``, the K loop inside the kernel (``fori_loop``,
  software-pipelined by Triton with ``num_stages=3``), the fp32 accumulator in
  registers; tiles 128 x 128 x 64, powers of two. Blocks are pointers, not copies, so
  the whole-K block specs cost no shared memory; ragged M and N are masked.
* TPU (Mosaic): grid ``(M/bm, N/bn, K/bk)`` with K last and ``"arbitrary"``, the fp32
  accumulator is the resident output tile; tiles 256 x 256 x 512 (bk the largest of
  512, 256, 128 dividing K; whole dims when smaller). The scales are laid out per K
  step, A's as ``(K/bk, M, bk/32)`` and B's as ``(K/bk, bk/32, N)``, so each scale
  tile's short dim is a whole array dim (TPU tiles need multiples of (8, 128) or
  whole dims).

Hopper has no block-scaled MMA, so decoding costs integer work per operand element,
amortized over the other operand's tile width (1/bn + 1/bm per MAC). Decoding is
exact for scale codes >= 10 at least; tiny scales can underflow to float32/bf16
subnormals, which CPU XLA (interpret mode) flushes to zero.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton
import numpy as np

from lowprec.numerics import blockscale
from lowprec.numerics.blockscale import MX_BLOCK
from lowprec.numerics import formats as formats_lib
from lowprec.numerics.kernels import dispatch
from lowprec.numerics.kernels import partitioning

_U = np.uint32
_GPU_TILE = (128, 128, 64)
_TPU_TILE = (256, 256, 512)


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


def decode_tile(codes: jax.Array, scale_codes: jax.Array, fmt: formats_lib.Format
                ) -> jax.Array:
  """bfloat16 values of uint8 MX ``codes`` with per-element E8M0 ``scale_codes``.

  Integer bit assembly for normal element codes, an exact int-to-float product for
  subnormal ones, then one multiply by the float32 scale ``2^(code - 127)`` (less
  MXINT8's implicit 2^-6). NaN scale codes give NaN. Element NaN/Inf codes are not
  special (block quantizers never emit them).
  """
  c = codes.astype(jnp.uint32)
  if fmt.kind == "int":
    k = c.astype(jnp.int32)
    elem = jnp.where(k >= 128, k - 256, k).astype(jnp.float32)
  else:
    m = fmt.man_bits
    sign = c >> (fmt.bits - 1)
    e = (c >> m) & _U((1 << fmt.exp_bits) - 1)
    man = c & _U((1 << m) - 1)
    normal = lax.bitcast_convert_type(
        (sign << 31) | ((e + _U(127 - fmt.bias)) << 23) | (man << (23 - m)), jnp.float32)
    sub = man.astype(jnp.int32).astype(jnp.float32) * np.float32(2.0 ** (fmt.emin - m))
    sub = jnp.where(sign == 1, -sub, sub)
    elem = jnp.where(e == 0, sub, normal)
  s = scale_codes.astype(jnp.int32)
  exp = s - (127 + fmt.emax - fmt.mx_emax)  # >= -133
  factor_bits = jnp.where(exp >= -126, ((exp + 127) << 23),
                          (1 << jnp.clip(exp + 149, 0, 22)))
  factor = lax.bitcast_convert_type(factor_bits.astype(jnp.uint32), jnp.float32)
  value = jnp.where(s == 255, np.float32(np.nan), elem * factor)
  return value.astype(jnp.bfloat16)


def _expand_rows(scales, nb):
  """(rows, nb) per-block scale codes -> (rows, nb * 32), each repeated 32 times."""
  r = scales.shape[0]
  return jnp.broadcast_to(scales[:, :, None], (r, nb, MX_BLOCK)).reshape(r, nb * MX_BLOCK)


def _expand_cols(scales, nb):
  """(nb, cols) per-block scale codes -> (nb * 32, cols)."""
  c = scales.shape[1]
  return jnp.broadcast_to(scales[:, None, :], (nb, MX_BLOCK, c)).reshape(nb * MX_BLOCK, c)


def _step_product(a_codes, a_scales, b_codes, b_scales, fa, fb, bk):
  nb = bk // MX_BLOCK
  # Scales widen to int32 before they are repeated: Mosaic on v5e cannot reshape the
  # repeated uint8 tile (vector<1x256x16xi8> to <256x16x1xi8>).
  a = decode_tile(a_codes, _expand_rows(a_scales.astype(jnp.int32), nb), fa)
  b = decode_tile(b_codes, _expand_cols(b_scales.astype(jnp.int32), nb), fb)
  return jnp.dot(a, b, preferred_element_type=jnp.float32)


def _gpu_kernel(ac_ref, as_ref, bc_ref, bs_ref, o_ref, *, fa, fb, bk, nk):
  sk = bk // MX_BLOCK

  def step(kk, acc):
    k0 = pl.multiple_of(kk * bk, bk)
    s0 = pl.multiple_of(kk * sk, sk)
    return acc + _step_product(ac_ref[:, pl.ds(k0, bk)], as_ref[:, pl.ds(s0, sk)],
                               bc_ref[pl.ds(k0, bk), :], bs_ref[pl.ds(s0, sk), :],
                               fa, fb, bk)

  acc = jnp.zeros(o_ref.shape, jnp.float32)
  o_ref[...] = lax.fori_loop(0, nk, step, acc)


def _tpu_kernel(ac_ref, as_ref, bc_ref, bs_ref, o_ref, *, fa, fb, bk):
  @pl.when(pl.program_id(2) == 0)
  def _():
    o_ref[...] = jnp.zeros(o_ref.shape, jnp.float32)

  o_ref[...] += _step_product(ac_ref[...], as_ref[...], bc_ref[...], bs_ref[...], fa,
                              fb, bk)


def default_tiles(variant: str, m: int, n: int, k: int) -> tuple[int, int, int]:
  """``(bm, bn, bk)`` of ``variant`` for an ``(M, K) @ (K, N)`` product."""
  if variant == dispatch.GPU:
    bm, bn, bk = _GPU_TILE
    bk = dispatch.largest_divisor(k, (bk, 32))
    return (min(bm, max(16, dispatch.next_pow2(m))), min(bn, max(16, dispatch.next_pow2(n))),
            bk)
  bm, bn, _ = _TPU_TILE
  bk = dispatch.largest_divisor(k, (512, 256, 128)) or k
  return (m if m <= bm else bm), (n if n <= bn else bn), bk


def check_tiles(variant: str, m: int, n: int, k: int, tiles) -> tuple[int, int, int]:
  """Validates ``(bm, bn, bk)`` for ``variant``; returns them as ints."""
  bm, bn, bk = (int(t) for t in tiles)
  if min(bm, bn, bk) < 1 or k % bk or bk % MX_BLOCK:
    raise ValueError(f"block_k {bk} must be a multiple of {MX_BLOCK} dividing K = {k} "
                     f"(tiles {tiles})")
  if variant == dispatch.GPU:
    if any(t & (t - 1) for t in (bm, bn, bk)) or min(bm, bn, bk) < 16:
      raise ValueError(f"Triton tiles must be powers of two >= 16, got {tiles}")
  else:
    if not (bm == m or bm % 32 == 0) or not (bn == n or bn % 128 == 0):
      raise ValueError(f"TPU tiles need block_m % 32 == 0 (or M) and block_n % 128 == 0 "
                       f"(or N), got {tiles} for M={m}, N={n}")
    if not (bk == k or bk % 128 == 0):
      raise ValueError(f"TPU block_k must be K or a multiple of 128, got {bk}")
  return bm, bn, bk


def _kernel_call(variant, interpret, tiles, a_codes, a_scales, b_codes, b_scales, *,
                 fa, fb):
  m, k = a_codes.shape
  n = b_codes.shape[1]
  bm, bn, bk = tiles
  out_shape = jax.ShapeDtypeStruct((m, n), jnp.float32)
  if variant == dispatch.GPU:
    kernel = functools.partial(_gpu_kernel, fa=fa, fb=fb, bk=bk, nk=k // bk)
    return pl.pallas_call(
        kernel,
        grid=(dispatch.cdiv(m, bm), dispatch.cdiv(n, bn)),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((bm, k // MX_BLOCK), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, bn), lambda i, j: (0, j)),
                  pl.BlockSpec((k // MX_BLOCK, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=out_shape,
        compiler_params=None if interpret else pltriton.CompilerParams(
            num_warps=8, num_stages=3),
        interpret=interpret,
        name="mx_matmul",
    )(a_codes, a_scales, b_codes, b_scales)
  sk = bk // MX_BLOCK
  # Per K step, scale tiles whose small dim is a whole array dim (TPU tiles need the
  # last two dims in multiples of (8, 128) or whole): A's (M, K/32) is rearranged to
  # (K/bk, M, bk/32) (a transpose of 1/32 of A's bytes), B's (K/32, N) viewed as
  # (K/bk, bk/32, N) (free).
  a_scales_t = a_scales.reshape(m, k // bk, sk).transpose(1, 0, 2)
  b_scales_t = b_scales.reshape(k // bk, sk, n)
  kernel = functools.partial(_tpu_kernel, fa=fa, fb=fb, bk=bk)
  return pl.pallas_call(
      kernel,
      grid=(dispatch.cdiv(m, bm), dispatch.cdiv(n, bn), k // bk),
      in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((None, bm, sk), lambda i, j, kk: (kk, i, 0)),
                pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
                pl.BlockSpec((None, sk, bn), lambda i, j, kk: (kk, 0, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
      out_shape=out_shape,
      compiler_params=None if interpret else pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "arbitrary")),
      interpret=interpret,
      name="mx_matmul",
  )(a_codes, a_scales_t, b_codes, b_scales_t)


@functools.partial(jax.jit, static_argnames=("tiles", "impl", "interpret_as"))
def _mx_matmul(qa, qb, *, tiles, impl, interpret_as):
  m, k = qa.shape
  n = qb.shape[1]

  def jnp_fn(qa, qb):
    return jnp.dot(blockscale.dequantize(qa), blockscale.dequantize(qb),
                   preferred_element_type=jnp.float32, precision=lax.Precision.HIGHEST)

  def kernel_fn(variant, interpret, qa, qb):
    if tiles is not None:
      check_tiles(variant, m, n, k, tiles)
    fa, fb = formats_lib.get(qa.fmt), formats_lib.get(qb.fmt)

    def run(first_index, a_codes, a_scales, b_codes, b_scales):
      del first_index  # no random words
      ml, nl = a_codes.shape[0], b_codes.shape[1]  # this shard's (or the whole) M, N
      t = check_tiles(variant, ml, nl, k, tiles or default_tiles(variant, ml, nl, k))
      return [_kernel_call(variant, interpret, t, a_codes, a_scales, b_codes, b_scales,
                           fa=fa, fb=fb)]

    # Split along M and N only: every output element sums its K steps in one order.
    (out,) = partitioning.call(
        run, (qa.codes, qa.scales, qb.codes, qb.scales),
        dims=(("m", "k"), ("m", "ks"), ("k", "n"), ("ks", "n")), result_dims=(("m", "n"),),
        prefer=("m", "n"), whole=("k", "ks"))
    return out

  return dispatch.run(impl, jnp_fn, kernel_fn, qa, qb, interpret_as=interpret_as)


def mx_matmul(qa: blockscale.QuantizedArray, qb: blockscale.QuantizedArray, *,
              block_m: int | None = None, block_n: int | None = None,
              block_k: int | None = None, interpret: bool = False,
              use_kernel: bool | None = None, interpret_as: str = dispatch.GPU
              ) -> jax.Array:
  """float32 ``dequantize(qa) @ dequantize(qb)`` from codes and scales.

  Args:
    qa: MX ``(M, K)`` quantized along axis 1; qb: MX ``(K, N)`` along axis 0 (any
      element formats; ``K % 32 == 0``, no padding).
    block_m, block_n, block_k: kernel tiles (all three, or none for the backend's
      defaults: GPU 128 x 128 x 64 powers of two, TPU 256 x 256 x 512); ``block_k`` a
      multiple of 32 dividing K. Explicit tiles are checked against the rules of
      whichever backend's kernel is traced (:func:`check_tiles`).
    interpret, use_kernel, interpret_as: as :func:`numerics.kernels.mx_quantize`; the
      jnp path is one XLA dot of the dequantized operands at HIGHEST precision.

  Returns:
    float32 ``(M, N)``.
  """
  _check(qa, qb)
  impl = dispatch.resolve(use_kernel, interpret, interpret_as=interpret_as,
                          tile=None if block_m is None else (block_m, block_n, block_k))
  given = (block_m, block_n, block_k)
  if all(b is None for b in given):
    tiles = None
  elif any(b is None for b in given):
    raise ValueError(f"give block_m, block_n and block_k together, got {given}")
  else:
    tiles = tuple(int(b) for b in given)
  return _mx_matmul(qa, qb, tiles=tiles, impl=impl,
                    interpret_as=dispatch.check_variant(interpret_as))
