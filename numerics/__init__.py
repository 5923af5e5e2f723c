"""numerics: bit-exact low-precision formats, rounding and block scaling in JAX."""

from numerics import formats
from numerics import random_bits
from numerics import rounding
from numerics.rounding import cast, cast_with_words, error_feedback

__all__ = ["formats", "random_bits", "rounding", "cast", "cast_with_words",
           "error_feedback"]
