"""OCP MX quantization kernels: codes + E8M0 scales, and fused quantize-dequantize.

* :func:`mx_quantize`: ``x`` in 1x32 blocks along the last axis -> uint8 element codes
  and E8M0 scale codes (a :class:`numerics.QuantizedArray`), equal bit for bit to
  ``numerics.quantize_mx(x, fmt, ...)``.
* :func:`mx_quantize_dequantize`: the fake quantization the training path runs on
  every GEMM operand, ``dequantize(quantize_mx(x))`` in float32 in one pass (no codes
  written), blocks along the last or the second-to-last axis, equal bit for bit to
  ``numerics.blockscale.quantize_dequantize_mx``.

Every OCP element format (e4m3, e5m2, e2m3, e3m2, e2m1, int8), every scale rule, and
nearest, toward-zero or stochastic rounding; stochastic words come from the counter
hash at each element's row-major index in the (padded) array, so they equal the jnp
path's ``rng="hash"`` words whatever the tiling. The kernel body is the jnp path's
integer-only core (:func:`numerics.mx.mx_quantize_core`,
:func:`~numerics.mx.mx_quantize_dequantize_core`) on one tile; the tests hold
both against the independent NumPy reference of the OCP spec. Tiling and dispatch:
:mod:`numerics.kernels.blockwise`, :mod:`numerics.kernels.dispatch`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from lowprec.numerics import blockscale
from lowprec.numerics import gradients
from lowprec.numerics import mx
from lowprec.numerics.blockscale import MX_BLOCK
from lowprec.numerics import formats as formats_lib
from lowprec.numerics import rounding as rounding_lib
from lowprec.numerics.kernels import blockwise
from lowprec.numerics.kernels import dispatch


def _check(x, fmt, scale_rule, rounding, key, fn):
  f = formats_lib.get(fmt)
  if f.name not in blockscale.MX_ELEMENT_FORMATS:
    raise ValueError(f"MX element format must be one of {blockscale.MX_ELEMENT_FORMATS}, "
                     f"got {f.name!r}")
  if scale_rule not in blockscale.SCALE_RULES:
    raise ValueError(f"unknown scale_rule {scale_rule!r}; known: "
                     f"{', '.join(blockscale.SCALE_RULES)}")
  rounding_lib.check_kernel_rounding(rounding, key, fn)
  return f, rounding_lib.check_float_input(x, fn)


def _quantize_body(x, words, scalars, axis, *, f, scale_rule, rounding):
  del scalars
  w = words() if rounding.needs_key else None
  return mx.mx_quantize_core(x, f, (axis,), (MX_BLOCK,), scale_rule, rounding, w)


def _qdq_body(x, words, scalars, axis, *, f, scale_rule, rounding):
  del scalars
  w = words() if rounding.needs_key else None
  return (mx.mx_quantize_dequantize_core(x, f, (axis,), (MX_BLOCK,), scale_rule,
                                         rounding, w),)


_STATIC = ("fmt", "scale_rule", "rounding", "tile", "impl", "interpret_as")


@functools.partial(jax.jit, static_argnames=_STATIC)
def _mx_quantize(xp, key, *, fmt, scale_rule, rounding, tile, impl, interpret_as):
  f = formats_lib.get(fmt)

  def jnp_fn(xp, key):
    q = blockscale.quantize_mx(xp, f, block_shape=MX_BLOCK, axis=-1,
                               scale_rule=scale_rule, rounding=rounding, key=key)
    return q.codes, q.scales

  def kernel_fn(variant, interpret, xp, key):
    x2, axis = blockwise.as_2d(xp, xp.ndim - 1)
    body = functools.partial(_quantize_body, f=f, scale_rule=scale_rule,
                             rounding=rounding)
    codes, scales = blockwise.blockwise_call(
        body, x2, axis=axis, block=MX_BLOCK,
        outputs=((blockwise.FULL, jnp.uint8), (blockwise.BLOCKS, jnp.uint8)),
        seeds=blockwise.seeds_of(key, xp), scalars=jnp.zeros((2,), jnp.float32),
        variant=variant, interpret=interpret, tile=tile, name="mx_quantize")
    return (codes.reshape(xp.shape),
            scales.reshape(xp.shape[:-1] + (xp.shape[-1] // MX_BLOCK,)))

  return dispatch.run(impl, jnp_fn, kernel_fn, xp, key, interpret_as=interpret_as)


def mx_quantize(x: jax.Array, fmt: str = "e4m3", *, scale_rule: str = "floor",
                rounding: rounding_lib.Rounding = rounding_lib.Nearest(),
                key: jax.Array | None = None, pad: bool = False,
                tile: tuple[int, int] | None = None, interpret: bool = False,
                use_kernel: bool | None = None, interpret_as: str = dispatch.GPU
                ) -> blockscale.QuantizedArray:
  """OCP MX quantization in 1x32 blocks along the last axis, as one Pallas kernel.

  Equal bit for bit to ``numerics.quantize_mx(x, fmt, scale_rule=..., rounding=...,
  key=..., pad=...)`` (``Stochastic`` with the ``"hash"`` generator only).

  Args:
    x: float32/bfloat16/float16 array, ndim >= 1 (leading axes are flattened into
      rows); the last axis a multiple of 32 unless ``pad``.
    fmt: e4m3, e5m2, e2m3, e3m2, e2m1 or int8.
    scale_rule, rounding, key: as :func:`numerics.quantize_mx`.
    pad: zero-pad the last axis to a multiple of 32 (the codes keep the padding).
    tile: kernel tile ``(rows, cols)`` (default per backend, see
      :mod:`numerics.kernels.blockwise`).
    interpret, use_kernel: the implementation (:mod:`numerics.kernels.dispatch`):
      default the compiled kernel on GPU/TPU and the jnp path on the CPU.
    interpret_as: in interpret mode, the GPU (``"gpu"``) or TPU (``"tpu"``) kernel's
      tiling.

  Returns:
    A :class:`numerics.QuantizedArray` (axes ``(ndim-1,)``, blocks ``(32,)``).
  """
  f, x = _check(x, fmt, scale_rule, rounding, key, "mx_quantize")
  if x.ndim < 1:
    raise ValueError("mx_quantize needs an array with at least one axis")
  impl = dispatch.resolve(use_kernel, interpret, interpret_as=interpret_as, tile=tile)
  xp = blockwise.pad_blocked_axis(x, x.ndim - 1, MX_BLOCK, pad)
  codes, scales = _mx_quantize(
      xp, key, fmt=f.name, scale_rule=scale_rule, rounding=rounding,
      tile=None if tile is None else tuple(tile), impl=impl,
      interpret_as=dispatch.check_variant(interpret_as))
  return blockscale.QuantizedArray(
      codes=codes, scales=scales, tensor_scale=jnp.float32(1.0), fmt=f.name,
      scale_fmt="e8m0", axes=(x.ndim - 1,), block_shape=(MX_BLOCK,),
      shape=tuple(x.shape), scale_rule=scale_rule)


@functools.partial(jax.jit, static_argnames=_STATIC + ("axis",))
def _mx_qdq(xp, key, *, fmt, axis, scale_rule, rounding, tile, impl, interpret_as):
  f = formats_lib.get(fmt)

  def jnp_fn(xp, key):
    return blockscale.quantize_dequantize_mx(
        xp, f, block_shape=MX_BLOCK, axis=axis, scale_rule=scale_rule,
        rounding=rounding, key=key)

  def kernel_fn(variant, interpret, xp, key):
    x2, axis2 = blockwise.as_2d(xp, axis)
    body = functools.partial(_qdq_body, f=f, scale_rule=scale_rule, rounding=rounding)
    (out,) = blockwise.blockwise_call(
        body, x2, axis=axis2, block=MX_BLOCK, outputs=((blockwise.FULL, jnp.float32),),
        seeds=blockwise.seeds_of(key, xp), scalars=jnp.zeros((2,), jnp.float32),
        variant=variant, interpret=interpret, tile=tile, name="mx_quantize_dequantize")
    return out.reshape(xp.shape)

  return dispatch.run(impl, jnp_fn, kernel_fn, xp, key, interpret_as=interpret_as)


def mx_quantize_dequantize(x: jax.Array, fmt: str = "e4m3", *, axis: int = -1,
                           scale_rule: str = "floor",
                           rounding: rounding_lib.Rounding = rounding_lib.Nearest(),
                           key: jax.Array | None = None, pad: bool = False,
                           tile: tuple[int, int] | None = None,
                           interpret: bool = False, use_kernel: bool | None = None,
                           interpret_as: str = dispatch.GPU) -> jax.Array:
  """Fused MX fake quantization: float32 ``dequantize(quantize_mx(x))``, one pass.

  Equal bit for bit to ``numerics.blockscale.quantize_dequantize_mx(x, fmt,
  axis=axis, ...)`` (hash random words). NaN/Inf blocks come out NaN.

  Args:
    x: float32/bfloat16/float16 array; 1x32 blocks along ``axis``, the last or the
      second-to-last axis (a multiple of 32 unless ``pad``).
    pad: zero-pad the blocked axis for the kernel (the result has x's shape).
    Others: as :func:`mx_quantize`.

  Returns:
    float32, x's shape. Gradient: straight-through (:mod:`numerics.gradients`).
  """
  f, x = _check(x, fmt, scale_rule, rounding, key, "mx_quantize_dequantize")
  ax = blockwise.normalize_axis(axis, x.ndim)
  impl = dispatch.resolve(use_kernel, interpret, interpret_as=interpret_as, tile=tile)
  xp = blockwise.pad_blocked_axis(x, ax, MX_BLOCK, pad)
  run = lambda xp, key: _mx_qdq(
      xp, key, fmt=f.name, axis=ax, scale_rule=scale_rule, rounding=rounding,
      tile=None if tile is None else tuple(tile), impl=impl,
      interpret_as=dispatch.check_variant(interpret_as))
  out = gradients.straight_through(run, xp, key)
  return out[tuple(slice(0, d) for d in x.shape)]
