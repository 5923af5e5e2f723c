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

from numerics import accumulation
from numerics import blockscale
from numerics import codebooks
from numerics import delayed_scaling
from numerics import encoding
from numerics import gradients
from numerics import qdot
from numerics import quantizer
from numerics import recipes
from numerics import formats
from numerics import hadamard
from numerics import kv_quant
from numerics import memory
from numerics import nf4
from numerics import random_bits
from numerics import rounding
from numerics import telemetry
from numerics.blockscale import QuantizedArray, dequantize, quantize_mx, quantize_nvfp4
from numerics.quantizer import QuantSpec, fake_quant
from numerics.hadamard import inverse_random_hadamard, random_hadamard
from numerics.rounding import cast, cast_with_words, error_feedback

__all__ = [
    "accumulation", "blockscale", "codebooks", "delayed_scaling", "encoding", "formats",
    "gradients", "hadamard", "kv_quant", "memory", "nf4", "qdot", "quantizer",
    "random_bits", "recipes", "rounding", "telemetry", "QuantizedArray", "QuantSpec",
    "cast", "cast_with_words", "dequantize", "error_feedback", "fake_quant",
    "inverse_random_hadamard", "quantize_mx", "quantize_nvfp4", "random_hadamard",
]
