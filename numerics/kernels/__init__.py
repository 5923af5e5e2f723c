"""Pallas kernels, each beside its jnp reference.

* :func:`mx_quantize`: fused OCP MX quantization of a 2D array in 1x32 blocks along
  the last axis (amax, scale, cast, optional stochastic rounding with in-kernel
  counter-hash random bits, so the result does not depend on the tiling).
* :func:`mx_matmul`: a block-scaled matmul consuming MX codes and E8M0 scales and
  accumulating in float32.

Dispatch: compiled Pallas on GPU/TPU, the fused jnp path on the CPU, and
``interpret=True`` (Pallas interpret mode, any backend) in the tests, which hold the
kernels equal to the references bit for bit. ``python -m numerics.kernels.check``
runs the kernels compiled on an accelerator and prints their throughput.
"""

from numerics.kernels.mx_matmul import mx_matmul, mx_matmul_reference
from numerics.kernels.mx_quantize import mx_quantize

__all__ = ["mx_matmul", "mx_matmul_reference", "mx_quantize"]
