"""numerics: bit-exact low-precision formats, rounding and block scaling in JAX.

The public API (see README.md):

    numerics.formats.get(name)                       # the format table
    numerics.cast(x, fmt, rounding=..., key=...)     # element-wise rounding
    numerics.quantize_mx(x, fmt, ...)                # OCP MX block scaling
    numerics.quantize_nvfp4(x, ...)                  # NVFP4
    numerics.dequantize(q)
    numerics.fake_quant(x, fmt, ...)                 # QDQ with straight-through grad
    numerics.random_hadamard(x, key, ...)            # and inverse_random_hadamard
    numerics.rounding.error_feedback(x, residual, fmt)
    numerics.kv_quant.init / write / read           # quantized KV-cache storage
    numerics.nf4.quantize_nf4(x, ...) / dequantize_nf4(q)   # QLoRA NF4 tensors
    numerics.codebooks.get(name)                     # lookup-table formats (NF4, dynamic maps)
    numerics.memory.bytes_per_param(state, params)   # measured pytree bytes
"""

from numerics import blockscale
from numerics import codebooks
from numerics import encoding
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
from numerics.blockscale import QuantizedArray, dequantize, quantize_mx, quantize_nvfp4
from numerics.quantizer import QuantSpec, fake_quant
from numerics.hadamard import inverse_random_hadamard, random_hadamard
from numerics.rounding import cast, cast_with_words, error_feedback

__all__ = [
    "blockscale", "codebooks", "encoding", "formats", "hadamard", "kv_quant", "memory",
    "nf4", "qdot", "quantizer", "random_bits", "recipes", "rounding", "QuantizedArray",
    "QuantSpec", "cast", "cast_with_words",
    "dequantize", "error_feedback", "fake_quant", "inverse_random_hadamard",
    "quantize_mx", "quantize_nvfp4", "random_hadamard",
]
