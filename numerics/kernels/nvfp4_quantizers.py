"""NVFP4 quantization kernels: E2M1 codes + E4M3 scales, and fused quantize-dequantize.

NVFP4 (:func:`numerics.quantize_nvfp4`, Transformer Engine's chain): 1x16 blocks,
E4M3 block scales ``S_dec = e4m3(min(block_amax * (S_enc / 6), 448))`` under an fp32
tensor scale ``S_enc = 2688 / amax``. ``S_enc`` needs the amax of the whole tensor,
which no tile sees, so it is one XLA reduction before the kernel
(:func:`numerics.nvfp4_te.nvfp4_tensor_scale`, as TPU's quantized-matmul kernel
computes its abs-max outside); ``S_enc`` and ``1/S_enc`` enter the kernel as scalars
(SMEM on TPU). The kernel body is :func:`numerics.nvfp4_te.nvfp4_quantize_core` on
one tile.

* :func:`nvfp4_quantize`: codes, scale codes and the tensor scale, equal bit for bit
  to ``numerics.quantize_nvfp4`` (blocks along the last axis).
* :func:`nvfp4_quantize_dequantize`: float32 ``dequantize(quantize_nvfp4(x))`` in one
  pass, blocks along the last or second-to-last axis.
* :func:`nvfp4_quantize_dequantize_blocks`: the same before the tensor scale, and
  ``1/S_enc`` (the training path's operand quantizer for the ``nvfp4`` recipe's 1D
  operands: :mod:`numerics.qdot` applies the tensor scales to the GEMM output).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from lowprec.numerics import blockscale
from lowprec.numerics import gradients
from lowprec.numerics import nvfp4_te
from lowprec.numerics.blockscale import NVFP4_BLOCK
from lowprec.numerics import rounding as rounding_lib
from lowprec.numerics.kernels import blockwise
from lowprec.numerics.kernels import dispatch


def _check(x, rounding, key, fn):
  rounding_lib.check_kernel_rounding(rounding, key, fn)
  x = rounding_lib.check_float_input(x, fn)
  if x.ndim < 1:
    raise ValueError("NVFP4 needs an array with at least one axis")
  return x


def _body(x, words, scalars, axis, *, rounding, dequantize):
  w = words() if rounding.needs_key else None
  codes, scales, values = nvfp4_te.nvfp4_quantize_core(
      x, scalars[0], (axis,), (NVFP4_BLOCK,), rounding, w)
  if dequantize == "blocks":
    return (values,)
  if dequantize:
    # 1/S_enc can be subnormal (tensor amax < 2688 * 2^-126), which TPUs and XLA:CPU
    # read as zero: the exact integer product then, behind a scalar branch.
    return (nvfp4_te.tensor_scaled(scalars[1], lambda mul: mul(values, scalars[1])),)
  return codes, scales


_STATIC = ("axis", "rounding", "tile", "impl", "interpret_as", "dequantize",
           "amax_axis_name")


@functools.partial(jax.jit, static_argnames=_STATIC)
def _nvfp4(xp, key, *, axis, rounding, tile, impl, interpret_as, dequantize,
           amax_axis_name):
  xf = xp.astype(jnp.float32)
  s_enc, inv_s_enc = nvfp4_te.nvfp4_tensor_scale(xf, amax_axis_name=amax_axis_name)

  def jnp_fn(xp, key, s_enc, inv_s_enc):
    del s_enc, inv_s_enc
    if dequantize == "blocks":
      return blockscale.quantize_dequantize_nvfp4_blocks(
          xp, axis=axis, rounding=rounding, amax_axis_name=amax_axis_name, key=key)[0]
    q = blockscale.quantize_nvfp4(xp, axis=axis, rounding=rounding,
                                  amax_axis_name=amax_axis_name, key=key)
    if dequantize:
      return blockscale.dequantize(q)
    return q.codes, q.scales

  def kernel_fn(variant, interpret, xp, key, s_enc, inv_s_enc):
    x2, axis2 = blockwise.as_2d(xp, axis)
    body = functools.partial(_body, rounding=rounding, dequantize=dequantize)
    if dequantize:
      outputs = ((blockwise.FULL, jnp.float32),)
    else:
      outputs = ((blockwise.FULL, jnp.uint8), (blockwise.BLOCKS, jnp.uint8))
    res = blockwise.blockwise_call(
        body, x2, axis=axis2, block=NVFP4_BLOCK, outputs=outputs,
        seeds=blockwise.seeds_of(key, xp), scalars=jnp.stack([s_enc, inv_s_enc]),
        variant=variant, interpret=interpret, tile=tile,
        name=("nvfp4_quantize_dequantize_blocks" if dequantize == "blocks" else
              "nvfp4_quantize_dequantize" if dequantize else "nvfp4_quantize"))
    if dequantize:
      return res[0].reshape(xp.shape)
    return (res[0].reshape(xp.shape),
            res[1].reshape(xp.shape[:-1] + (xp.shape[-1] // NVFP4_BLOCK,)))

  out = dispatch.run(impl, jnp_fn, kernel_fn, xp, key, s_enc, inv_s_enc,
                     interpret_as=interpret_as)
  return out, inv_s_enc


def nvfp4_quantize(x: jax.Array, *,
                   rounding: rounding_lib.Rounding = rounding_lib.Nearest(),
                   key: jax.Array | None = None, pad: bool = False,
                   tile: tuple[int, int] | None = None,
                   interpret: bool = False, use_kernel: bool | None = None,
                   interpret_as: str = dispatch.GPU,
                   amax_axis_name: blockscale.AmaxAxisName = None
                   ) -> blockscale.QuantizedArray:
  """NVFP4 quantization in 1x16 blocks along the last axis, as one Pallas kernel.

  Equal bit for bit to ``numerics.quantize_nvfp4(x, rounding=..., key=..., pad=...)``
  (``Stochastic`` with the ``"hash"`` generator only).

  Args:
    x: float32/bfloat16/float16, ndim >= 1; the last axis a multiple of 16 unless
      ``pad``.
    amax_axis_name: as :func:`numerics.quantize_nvfp4` (the tensor amax over these
      mesh axes inside ``shard_map``).
    Others: as :func:`numerics.kernels.mx_quantize`.

  Returns:
    A :class:`numerics.QuantizedArray` (E2M1 codes, E4M3 scale codes,
    ``tensor_scale = 1/S_enc``).
  """
  x = _check(x, rounding, key, "nvfp4_quantize")
  amax_axis_name = blockscale.check_amax_axis_name(amax_axis_name, "nvfp4_quantize")
  impl = dispatch.resolve(use_kernel, interpret, interpret_as=interpret_as, tile=tile)
  xp = blockwise.pad_blocked_axis(x, x.ndim - 1, NVFP4_BLOCK, pad)
  (codes, scales), inv_s_enc = _nvfp4(
      xp, key, axis=x.ndim - 1, rounding=rounding,
      tile=None if tile is None else tuple(tile), impl=impl,
      interpret_as=dispatch.check_variant(interpret_as), dequantize=False,
      amax_axis_name=amax_axis_name)
  return blockscale.QuantizedArray(
      codes=codes, scales=scales, tensor_scale=inv_s_enc, fmt="e2m1", scale_fmt="e4m3",
      axes=(x.ndim - 1,), block_shape=(NVFP4_BLOCK,), shape=tuple(x.shape),
      scale_rule="nvfp4")


def _fake_quantizer(x, axis, rounding, key, pad, tile, interpret, use_kernel,
                    interpret_as, *, dequantize, fn, amax_axis_name):
  """(checked x, x padded along the blocked axis, ``run(xp, key)`` returning
  ``_nvfp4``'s (output, 1/S_enc)) of the fused fake quantizers."""
  x = _check(x, rounding, key, fn)
  amax_axis_name = blockscale.check_amax_axis_name(amax_axis_name, fn)
  ax = blockwise.normalize_axis(axis, x.ndim)
  impl = dispatch.resolve(use_kernel, interpret, interpret_as=interpret_as, tile=tile)
  xp = blockwise.pad_blocked_axis(x, ax, NVFP4_BLOCK, pad)
  run = lambda xp, key: _nvfp4(
      xp, key, axis=ax, rounding=rounding,
      tile=None if tile is None else tuple(tile), impl=impl,
      interpret_as=dispatch.check_variant(interpret_as), dequantize=dequantize,
      amax_axis_name=amax_axis_name)
  return x, xp, run


def nvfp4_quantize_dequantize(x: jax.Array, *, axis: int = -1,
                              rounding: rounding_lib.Rounding = rounding_lib.Nearest(),
                              key: jax.Array | None = None, pad: bool = False,
                              tile: tuple[int, int] | None = None,
                              interpret: bool = False, use_kernel: bool | None = None,
                              interpret_as: str = dispatch.GPU,
                              amax_axis_name: blockscale.AmaxAxisName = None
                              ) -> jax.Array:
  """Fused NVFP4 fake quantization: float32 ``dequantize(quantize_nvfp4(x))``.

  Equal bit for bit to ``numerics.dequantize(numerics.quantize_nvfp4(x, axis=axis,
  ...))``: ``(element * S_dec) * (1/S_enc)``, the product exact and one float32
  rounding by the tensor scale; NaN/Inf blocks come out NaN.

  Args:
    x: float32/bfloat16/float16; 1x16 blocks along ``axis`` (last or second-to-last).
    Others: as :func:`nvfp4_quantize`.

  Gradient: straight-through (:mod:`numerics.gradients`).
  """
  x, xp, run = _fake_quantizer(x, axis, rounding, key, pad, tile, interpret,
                               use_kernel, interpret_as, dequantize=True,
                               fn="nvfp4_quantize_dequantize",
                               amax_axis_name=amax_axis_name)
  out = gradients.straight_through(lambda xp, key: run(xp, key)[0], xp, key)
  return out[tuple(slice(0, d) for d in x.shape)]


def nvfp4_quantize_dequantize_blocks(x: jax.Array, *, axis: int = -1,
                                     rounding: rounding_lib.Rounding = (
                                         rounding_lib.Nearest()),
                                     key: jax.Array | None = None, pad: bool = False,
                                     tile: tuple[int, int] | None = None,
                                     interpret: bool = False,
                                     use_kernel: bool | None = None,
                                     interpret_as: str = dispatch.GPU,
                                     amax_axis_name: blockscale.AmaxAxisName = None
                                     ) -> tuple[jax.Array, jax.Array]:
  """:func:`nvfp4_quantize_dequantize` up to its tensor scale: ``(values, 1/S_enc)``.

  Equal bit for bit to ``numerics.blockscale.quantize_dequantize_nvfp4_blocks(x,
  axis=axis, ...)``: ``values = element * S_dec`` (exact in bfloat16), so that
  ``values * (1/S_enc)`` is :func:`nvfp4_quantize_dequantize`'s result. The operand
  quantizer of :mod:`numerics.qdot`'s NVFP4 GEMMs, which apply both operands' tensor
  scales to the GEMM output.

  Args: as :func:`nvfp4_quantize_dequantize`. Not differentiable (raises under
  ``jax.grad``: ``values`` is not in x's units).
  """
  x, xp, run = _fake_quantizer(x, axis, rounding, key, pad, tile, interpret,
                               use_kernel, interpret_as, dequantize="blocks",
                               fn="nvfp4_quantize_dequantize_blocks",
                               amax_axis_name=amax_axis_name)
  values, inv_s_enc = gradients.not_differentiable(
      run, "nvfp4_quantize_dequantize_blocks",
      "nvfp4_quantize_dequantize (straight-through)")(
          xp, key)
  return values[tuple(slice(0, d) for d in x.shape)], inv_s_enc
