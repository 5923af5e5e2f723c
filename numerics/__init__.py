"""numerics: bit-exact low-precision formats, rounding and block scaling in JAX.

The public API (see README.md):

    numerics.formats.get(name)                       # the format table
    numerics.cast(x, fmt, rounding=..., key=...)     # element-wise rounding
    numerics.quantize_mx(x, fmt, block_shape=...)    # OCP MX block scaling
    numerics.quantize_nvfp4(x, convention=...)       # NVFP4 (TE's or torchao's scales)
    numerics.dequantize(q)
    numerics.fake_quant(x, fmt, ...)                 # QDQ with straight-through grad
    numerics.random_hadamard(x, key=..., ...)        # and inverse_random_hadamard
    numerics.rounding.error_feedback(x, residual, fmt)
    numerics.kv_quant.init / write / read           # quantized KV-cache storage
    numerics.nf4.quantize_nf4(x, ...) / dequantize_nf4(q)   # QLoRA NF4 tensors
    numerics.codebooks.get(name)                     # lookup-table formats (NF4, dynamic maps)
    numerics.memory.bytes_per_param(state, params)   # measured pytree bytes
    numerics.qdot.quantized_dot_general(...)         # a recipe per GEMM
    numerics.qdot.quantized_dot_general_with_state(...)  # delayed scaling, telemetry

Conventions: ``key`` is keyword-only everywhere; block geometry is ``block_shape`` (an
int for 1D blocks, a tuple for tiles); formats and compute dtypes use the format names
(``bf16``, ``fp32``, ``e4m3``, ...); recipes, ``fp32`` included, live in
:mod:`numerics.recipes`. Each public function states its gradient
(:mod:`numerics.gradients`).
"""

if __name__ != "lowprec.numerics":  # one module object per module (docs/layout.md)
  raise ImportError(f"this package is lowprec.numerics; import it as `from lowprec import "
                    f"numerics` (it was imported as {__name__!r}, which would make a second "
                    f"copy of every module and class)")

from lowprec.numerics import accumulation
from lowprec.numerics import blockscale
from lowprec.numerics import codebooks
from lowprec.numerics import delayed_scaling
from lowprec.numerics import encoding
from lowprec.numerics import gradients
from lowprec.numerics import qdot
from lowprec.numerics import quantizer
from lowprec.numerics import recipes
from lowprec.numerics import formats
from lowprec.numerics import hadamard
from lowprec.numerics import kv_quant
from lowprec.numerics import memory
from lowprec.numerics import nf4
from lowprec.numerics import random_bits
from lowprec.numerics import rounding
from lowprec.numerics import telemetry
from lowprec.numerics.blockscale import QuantizedArray, dequantize, quantize_mx, quantize_nvfp4
from lowprec.numerics.quantizer import QuantSpec, fake_quant
from lowprec.numerics.hadamard import inverse_random_hadamard, random_hadamard
from lowprec.numerics.rounding import cast, cast_with_words, error_feedback

__all__ = [
    "accumulation", "blockscale", "codebooks", "delayed_scaling", "encoding", "formats",
    "gradients", "hadamard", "kv_quant", "memory", "nf4", "qdot", "quantizer",
    "random_bits", "recipes", "rounding", "telemetry", "QuantizedArray", "QuantSpec",
    "cast", "cast_with_words", "dequantize", "error_feedback", "fake_quant",
    "inverse_random_hadamard", "quantize_mx", "quantize_nvfp4", "random_hadamard",
]
