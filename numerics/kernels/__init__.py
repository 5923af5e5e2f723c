"""Pallas kernels for block-scaled numerics, compiled for GPU (Triton) and TPU (Mosaic).

* :func:`mx_quantize`: OCP MX quantization (1x32 blocks along the last axis, every
  element format and scale rule, nearest or stochastic rounding with in-kernel
  counter-hash words) -> codes + E8M0 scales.
* :func:`nvfp4_quantize`: NVFP4 (1x16 blocks, E4M3 scales, fp32 tensor scale).
* :func:`mx_quantize_dequantize`, :func:`nvfp4_quantize_dequantize`: fused fake
  quantization (the training path's operand quantizer), blocks along the last or the
  second-to-last axis; :func:`nvfp4_quantize_dequantize_blocks` the NVFP4 one before
  its tensor scale (which :mod:`numerics.qdot` applies to the GEMM output).
* :func:`mx_matmul`: block-scaled matmul on MX codes and scales, fp32 accumulation.
* :func:`quantize_dequantize`: a :class:`numerics.QuantSpec` through the fused kernel
  when the spec and the platform allow it, else through the jnp path;
  :func:`quantize_dequantize_split` the same with NVFP4's tensor scale apart (what
  :mod:`numerics.qdot` calls for every GEMM operand).

Dispatch rule (:mod:`numerics.kernels.dispatch`): compiled Pallas on GPU/TPU, the jnp
path on the CPU; ``use_kernel=``/``interpret=`` per call, ``with
kernels.implementation("jnp"):`` for the calls a block traces, or ``NUMERICS_KERNELS`` =
``auto|jnp|pallas|interpret`` (read once) for the process override it. Every kernel is bit-exact
with the jnp path and with the independent NumPy references in interpret mode
(``tests/numerics/kernels``); CI lowers every case of :mod:`numerics.kernels.cases` for
``cuda`` and ``tpu`` (``python -m lowprec.numerics.kernels.lowering``) and compiles it for H200,
B200, TPU v5e and v6e without a device (``python -m lowprec.numerics.kernels.compile_check``;
docs/kernels.md).
The device check: ``python -m experiments.benchmarks.kernel_check
--out=device_check.json``.
"""

from lowprec.numerics.kernels.dispatch import ENV_VAR, IMPLS, implementation
from lowprec.numerics.kernels.block_matmul import mx_matmul
from lowprec.numerics.kernels.mx_quantizers import mx_quantize, mx_quantize_dequantize
from lowprec.numerics.kernels.nvfp4_quantizers import (nvfp4_quantize, nvfp4_quantize_dequantize,
                                               nvfp4_quantize_dequantize_blocks)
from lowprec.numerics.kernels.operand import (kernel_eligible, quantize_dequantize,
                                      quantize_dequantize_split,
                                      quantize_dequantize_split_many, splits_on_jnp,
                                      splits_tensor_scale)

__all__ = ["ENV_VAR", "IMPLS", "implementation", "kernel_eligible", "mx_matmul",
           "mx_quantize", "mx_quantize_dequantize", "nvfp4_quantize", "nvfp4_quantize_dequantize",
           "nvfp4_quantize_dequantize_blocks", "quantize_dequantize",
           "quantize_dequantize_split", "quantize_dequantize_split_many",
           "splits_on_jnp", "splits_tensor_scale"]
