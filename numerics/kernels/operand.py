"""The training path's operand quantizer: a QuantSpec through the fused kernel or jnp.

:func:`quantize_dequantize` is :func:`numerics.quantizer.quantize_dequantize` with the
fused Pallas kernels in front: :mod:`numerics.qdot` calls it for every GEMM operand of
every quantized recipe. A spec goes to a kernel when :func:`kernel_eligible` (MX with
1x32 blocks or NVFP4 with 1x16 blocks, along the last or the second-to-last axis --
every 1D operand layout of :mod:`numerics.qdot`'s canonical GEMMs -- with the ``hash``
generator for stochastic rounding) and the dispatch rule picks Pallas
(:mod:`numerics.kernels.dispatch`: by default on GPU/TPU hosts; ``NUMERICS_KERNELS``
overrides it). Everything else -- 2D tiles, element-wise casts, tensorwise scaling,
the ``threefry`` generator, NVFP4's ``torchao`` convention (no kernel: it routes to the
jnp path explicitly), and the CPU by default -- runs the jnp path unchanged. The
result is the same bits either way (tested).
"""

from __future__ import annotations

import jax

from lowprec.numerics import blockscale
from lowprec.numerics import gradients
from lowprec.numerics import quantizer
from lowprec.numerics import rounding as rounding_lib
from lowprec.numerics.kernels import dispatch
from lowprec.numerics.kernels import mx_quantizers
from lowprec.numerics.kernels import nvfp4_quantizers


def kernel_eligible(spec: quantizer.QuantSpec, ndim: int) -> bool:
  """Whether a fused kernel implements ``spec`` for an ``ndim``-d operand."""
  if spec.is_cast or len(spec.block_shape) != 1:
    return False
  if isinstance(spec.rounding, rounding_lib.Stochastic) and spec.rounding.rng != "hash":
    return False
  if isinstance(spec.axis, tuple) or not -ndim <= spec.axis < ndim:
    return False
  if spec.axis % ndim not in (ndim - 1, ndim - 2):
    return False
  if spec.fmt == "nvfp4":
    return spec.convention == "te"  # torchao's convention has no kernel (jnp path)
  return (spec.block_shape == (blockscale.MX_BLOCK,)
          and spec.fmt in blockscale.MX_ELEMENT_FORMATS
          and spec.scale_rule in blockscale.SCALE_RULES)  # qwix's scale: jnp path


def _runs_kernel(x, spec: quantizer.QuantSpec, use_kernel: bool | None, interpret: bool,
                 interpret_as: str) -> bool:
  """Whether ``spec`` on ``x`` goes to a fused kernel: the dispatch rule picks Pallas
  (by default on GPU/TPU hosts) and :func:`kernel_eligible` holds."""
  impl = dispatch.resolve(use_kernel, interpret, interpret_as=interpret_as)
  on_accelerator = jax.default_backend() in ("gpu", "tpu")
  return (impl != "jnp" and (impl != "auto" or on_accelerator)
          and kernel_eligible(spec, jax.numpy.ndim(x)))


def quantize_dequantize(x: jax.Array, spec: quantizer.QuantSpec, *,
                        key: jax.Array | None = None,
                        use_kernel: bool | None = None, interpret: bool = False,
                        interpret_as: str = dispatch.GPU) -> jax.Array:
  """float32 ``dequantize(quantize(x, spec, key))``, by a fused kernel where it applies.

  Same bits as :func:`numerics.quantizer.quantize_dequantize` (which runs when the
  spec is not :func:`kernel_eligible` or the dispatch rule picks jnp). Gradient:
  straight-through, as :func:`numerics.quantizer.quantize_dequantize`. ``use_kernel``, ``interpret``,
  ``interpret_as``: as :func:`numerics.kernels.mx_quantize`.
  """
  x = rounding_lib.check_float_input(x, "kernels.quantize_dequantize")
  if not _runs_kernel(x, spec, use_kernel, interpret, interpret_as):
    return quantizer.quantize_dequantize(x, spec, key=key)
  spec.rounding.check_key(key)
  mode = dict(use_kernel=use_kernel, interpret=interpret, interpret_as=interpret_as)
  if spec.fmt == "nvfp4":
    kernel = lambda x, key: nvfp4_quantizers.nvfp4_quantize_dequantize(
        x, axis=spec.axis, rounding=spec.rounding, key=key, pad=spec.pad,
        amax_axis_name=spec.amax_axis_name, **mode)
  else:
    kernel = lambda x, key: mx_quantizers.mx_quantize_dequantize(
        x, spec.fmt, axis=spec.axis, scale_rule=spec.scale_rule, rounding=spec.rounding,
        key=key, pad=spec.pad, **mode)
  return gradients.straight_through(kernel, jax.numpy.asarray(x), key)


def splits_tensor_scale(spec: quantizer.QuantSpec) -> bool:
  """Whether :func:`quantize_dequantize_split` returns ``spec``'s values apart from a
  tensor scale: NVFP4 in Transformer Engine's convention (``te``)."""
  return spec.fmt == "nvfp4" and spec.convention == "te"


def quantize_dequantize_split(x: jax.Array, spec: quantizer.QuantSpec, *,
                              key: jax.Array | None = None,
                              use_kernel: bool | None = None, interpret: bool = False,
                              interpret_as: str = dispatch.GPU
                              ) -> tuple[jax.Array, jax.Array | None]:
  """``(values, tensor_scale)`` with ``values * tensor_scale`` equal bit for bit to
  :func:`quantize_dequantize` ``(x, spec, key=key)``.

  For NVFP4 (``te``, :func:`splits_tensor_scale`): the block-scaled values ``E2M1 *
  S_dec`` (float32, exact in bfloat16) and ``1/S_enc``, by the fused kernel where it
  applies (:func:`kernel_eligible`); for every other spec ``(quantize_dequantize(x,
  spec), None)``. Not differentiable when the scale is split (raises under
  ``jax.grad``); :mod:`numerics.qdot` calls it inside its custom VJP.
  """
  x = rounding_lib.check_float_input(x, "kernels.quantize_dequantize_split")
  if not splits_tensor_scale(spec):
    return quantize_dequantize(x, spec, key=key, use_kernel=use_kernel,
                               interpret=interpret, interpret_as=interpret_as), None
  spec.rounding.check_key(key)
  if not _runs_kernel(x, spec, use_kernel, interpret, interpret_as):
    return blockscale.quantize_dequantize_nvfp4_blocks(
        x, block_shape=spec.block_shape, axis=spec.axis, rounding=spec.rounding,
        pad=spec.pad, amax_axis_name=spec.amax_axis_name, key=key)
  return nvfp4_quantizers.nvfp4_quantize_dequantize_blocks(
      x, axis=spec.axis, rounding=spec.rounding, pad=spec.pad, use_kernel=use_kernel,
      interpret=interpret, interpret_as=interpret_as,
      amax_axis_name=spec.amax_axis_name, key=key)


def splits_on_jnp(x: jax.Array, spec: quantizer.QuantSpec) -> bool:
  """Whether :func:`quantize_dequantize_split` of ``x`` under ``spec`` (by the default
  dispatch rule) splits the tensor scale and runs the jnp path: what
  :func:`quantize_dequantize_split_many` takes."""
  return splits_tensor_scale(spec) and not _runs_kernel(x, spec, None, False,
                                                        dispatch.GPU)


def quantize_dequantize_split_many(xs: list[jax.Array], specs: list[quantizer.QuantSpec],
                                   keys: list[jax.Array | None]
                                   ) -> list[tuple[jax.Array, jax.Array]]:
  """:func:`quantize_dequantize_split` of several tensors whose specs all pass
  :func:`splits_on_jnp`, bit for bit, in one program with one NVFP4 scale chain for
  all (:func:`numerics.blockscale.quantize_dequantize_nvfp4_blocks_many`)."""
  for x, spec in zip(xs, specs):
    if not splits_on_jnp(x, spec):
      raise ValueError(f"quantize_dequantize_split_many takes NVFP4 (te) specs on the "
                       f"jnp path; got {spec}")
  for spec, key in zip(specs, keys):
    spec.rounding.check_key(key)
  return blockscale.quantize_dequantize_nvfp4_blocks_many(
      [rounding_lib.check_float_input(x, "kernels.quantize_dequantize_split_many")
       for x in xs],
      [dict(block_shape=spec.block_shape, axis=spec.axis, rounding=spec.rounding,
            pad=spec.pad, amax_axis_name=spec.amax_axis_name, key=key)
       for spec, key in zip(specs, keys)])
