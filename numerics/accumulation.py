"""Emulated limited-precision accumulation of a GEMM's products (tensor-core style).

Low-precision GEMMs on tensor cores do not accumulate in full float32: Hopper's FP8
GEMMs keep about 14 bits of the running sum's fraction (DeepSeek-V3, §3.3.2), and
DeepSeek-V3's recipe therefore promotes the partial sum to a float32 register every
``N_C = 128`` products (4 WGMMAs) and accumulates those in full float32.

:class:`Accumulation` describes such an accumulator and :func:`emulated_matmul`
computes a batched matmul with it, exactly as follows. For each output element, the
products ``p_k = a_k * b_k`` are formed in float32 (exact for the low-precision
operands of a quantized GEMM) and added one by one in increasing ``k`` into a partial
sum ``s`` that holds ``fraction_bits`` bits below its leading one:
``s <- R(fl32(s + p_k))``, where ``R`` rounds the float32 sum to ``fraction_bits``
fraction bits (toward zero by default, as an alignment shifter truncates; or to nearest
even). After every ``promote_every`` products (and after the last), the partial sum is
added to a float32 accumulator (``out <- fl32(out + s)``) and reset to zero.
``promote_every=None`` never promotes: the whole of K goes through the narrow
accumulator. The exponent range is float32's.

The cost is ``K`` sequential elementwise steps over the ``M x N`` output (a scan): an
emulation for studying numerics, not a fast path.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.numerics import rounding as rounding_lib

AccumulatorRounding = rounding_lib.TowardZero | rounding_lib.Nearest


@dataclasses.dataclass(frozen=True)
class Accumulation:
  """A limited-precision accumulator with periodic promotion to float32.

  Attributes:
    fraction_bits: bits of the partial sum kept below its leading one (float32: 23;
      Hopper FP8 GEMMs: about 14), in [1, 23].
    promote_every: products accumulated in the narrow partial sum before it is added
      to the float32 accumulator (DeepSeek-V3: 128); None: never promoted.
    rounding: how the partial sum is rounded to ``fraction_bits``: ``TowardZero()``
      (truncation) or ``Nearest()`` (ties to even).
  """

  fraction_bits: int = 14
  promote_every: int | None = 128
  rounding: AccumulatorRounding = rounding_lib.TowardZero()

  def __post_init__(self):
    fb = self.fraction_bits
    if isinstance(fb, bool) or not isinstance(fb, (int, np.integer)) or not 1 <= fb <= 23:
      raise ValueError(f"fraction_bits must be an int in [1, 23], got {fb!r}")
    pe = self.promote_every
    if pe is not None and (isinstance(pe, bool) or not isinstance(pe, (int, np.integer))
                           or pe < 1):
      raise ValueError(f"promote_every must be a positive int or None, got {pe!r}")
    rounding_lib.check_rounding(self.rounding, "Accumulation",
                                kinds=(rounding_lib.TowardZero, rounding_lib.Nearest))


def round_fraction(x: jax.Array, fraction_bits: int,
                   rounding: AccumulatorRounding = rounding_lib.TowardZero()
                   ) -> jax.Array:
  """float32 ``x`` rounded to ``fraction_bits`` bits below its leading one.

  Bit-level (float32 subnormals keep their absolute quantum ``2^(-126 - bits)``);
  Inf and NaN pass through.
  """
  x = jnp.asarray(x, jnp.float32)
  b = lax.bitcast_convert_type(x, jnp.uint32)
  a = b & np.uint32(0x7FFFFFFF)
  special = a >= np.uint32(0x7F800000)
  mag = rounding_lib.round_magnitude(jnp.where(special, np.uint32(0), a), fraction_bits,
                                     -126, rounding)
  out = jnp.where(special, b, mag | (b & np.uint32(0x80000000)))
  return lax.bitcast_convert_type(out, jnp.float32)


def emulated_matmul(a_BxMxK: jax.Array, b_BxKxN: jax.Array,
                    accumulation: Accumulation) -> jax.Array:
  """float32 ``a @ b`` per batch, accumulated as ``accumulation`` says (module doc).

  Args:
    a_BxMxK, b_BxKxN: float operands (cast to float32; their products are formed in
      float32).
    accumulation: the accumulator.

  Returns:
    float32 ``[B, M, N]``.
  """
  acc = accumulation
  a = jnp.asarray(a_BxMxK, jnp.float32)
  b = jnp.asarray(b_BxKxN, jnp.float32)
  if a.ndim != 3 or b.ndim != 3 or a.shape[2] != b.shape[1] or a.shape[0] != b.shape[0]:
    raise ValueError(f"expected [B, M, K] and [B, K, N] operands, got {a.shape} and "
                     f"{b.shape}")
  k = a.shape[2]
  every = k if acc.promote_every is None else acc.promote_every
  zeros = jnp.zeros((a.shape[0], a.shape[1], b.shape[2]), jnp.float32)

  def step(carry, inputs):
    out, partial = carry
    i, a_k, b_k = inputs
    partial = round_fraction(partial + a_k[:, :, None] * b_k[:, None, :],
                             acc.fraction_bits, acc.rounding)
    promote = (i + 1) % every == 0
    out = jnp.where(promote, out + partial, out)
    return (out, jnp.where(promote, 0.0, partial)), None

  (out, partial), _ = lax.scan(
      step, (zeros, zeros),
      (jnp.arange(k), jnp.moveaxis(a, 2, 0), jnp.moveaxis(b, 1, 0)))
  return out + partial  # the last, partial chunk (zero when K is a multiple)
