"""NVFP4's Transformer Engine chain: tensor and block scales, and the reference core.

Tensor ``S_enc = min(448*6 / amax, FLT_MAX)`` (1 when amax is 0), block scale
``S_dec = e4m3(min(block_amax * (S_enc * (1/6)), 448))``, elements
``e2m1(x * min(1 / (S_dec * (1/S_enc)), FLT_MAX))``, decode
``x = (e2m1 * S_dec) * (1/S_enc)`` (as transcribed by torchao's NVFP4 training
reference). The block scale has no lower clamp: a block whose scale rounds below
E4M3's smallest subnormal (2^-9) stores scale 0 and decodes to 0.

Here are the pieces both NVFP4 conventions share (the tensor amax, the element
rounding of ``x * multiplier``, the tensor-scale multiply), the TE scale chain, and
:func:`nvfp4_quantize_core`, the integer-exact reference that the Pallas kernels run.
:mod:`numerics.nvfp4_fast` is the same chain in two passes for the jnp path, and
:mod:`numerics.nvfp4` holds the public functions.

NVFP4's divisions are IEEE round-to-nearest on every backend (GPU Triton kernels and
XLA:GPU divide approximately, TPUs by a reciprocal estimate, XLA:CPU flushes
subnormals): :func:`numerics.float_bits.div_rn` (integer ops) in the Pallas kernels,
:mod:`numerics.fused_division` (an estimate corrected by the exact remainder) for the
tensor scales and the jnp path's table. Its products with a possibly subnormal operand
(``block_amax * S_enc/6`` and ``x * enc``) rescale that operand in the bits first
(:func:`mul_subnormal_lhs`). A tensor whose amax is below ``2688 * 2^-126`` (3.2e-35)
has a subnormal ``1/S_enc``, and its dequantized values are subnormal: the products
with those are formed exactly in integers and rounded once (:func:`numerics.float_bits.mul_narrow`, behind
:func:`tensor_scaled`), and zero tests read the bits. So NVFP4 gives the spec's float32
bits on every backend, for tensors of float32 subnormals too, although CPU and TPU
arithmetic flush subnormals.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.numerics import block_layout
from lowprec.numerics import encoding
from lowprec.numerics import float_bits
from lowprec.numerics import formats as formats_lib
from lowprec.numerics import fused_division
from lowprec.numerics import rounding as rounding_lib
from lowprec.numerics.block_layout import AmaxAxisName

_U = np.uint32
_I = np.int32
_FLT_MAX = np.float32(np.finfo(np.float32).max)
_FLT_MAX_BITS = _U(0x7F7FFFFF)


def finite_tensor_amax(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(int32 bits, float32 value) of max |x| over finite values (0 when none)."""
  a = lax.bitcast_convert_type(x, jnp.uint32) & _U(0x7FFFFFFF)
  finite = a < _U(0x7F800000)
  bits = jnp.max(jnp.where(finite, a, _U(0)).astype(jnp.int32), initial=0)
  return bits, lax.bitcast_convert_type(bits, jnp.float32)


def nvfp4_tensor_scale(x: jax.Array, *, amax_axis_name: AmaxAxisName = None
                       ) -> tuple[jax.Array, jax.Array]:
  """float32 scalars ``(S_enc, 1/S_enc)`` of float32 ``x`` (amax over finite values,
  and over the mesh axes ``amax_axis_name`` inside ``shard_map``).

  The only whole-tensor step of NVFP4 (``te`` convention): the Pallas kernels take both
  as inputs.
  """
  bits, _ = finite_tensor_amax(x)
  bits = block_layout.reduce_amax_bits(bits, amax_axis_name)
  return tensor_scale_of_amax(bits)


def tensor_scale_of_amax(t_amax_bits: jax.Array) -> tuple[jax.Array, jax.Array]:
  """float32 ``(S_enc, 1/S_enc)`` from the int32 bits of the finite tensor amax.

  Scalars outside the Pallas kernels (they take both as inputs), in fused exact
  arithmetic (:mod:`numerics.fused_division`): ``S_enc = min(RN(2688 / amax),
  FLT_MAX)``, which is FLT_MAX for every subnormal amax (the quotient overflows) and 1
  for a zero one; ``1/S_enc`` is subnormal for amax below ``2688 * 2^-126``.
  """
  bits = t_amax_bits.astype(jnp.uint32)
  normal = bits >= _U(0x00800000)
  s = fused_division.constant_over_bits(
      448.0 * 6.0, jnp.where(normal, bits, _U(0x3F800000)), subnormal_out=False,
      overflow=True)
  s = jnp.where(normal, jnp.minimum(s, _FLT_MAX_BITS), _FLT_MAX_BITS)
  s = jnp.where(bits == 0, _U(0x3F800000), s)  # S_enc >= 2^-117: never zero
  inv = fused_division.reciprocal_bits(s, subnormal_in=False, subnormal_out=True,
                                       overflow=False)
  return (lax.bitcast_convert_type(s, jnp.float32),
          lax.bitcast_convert_type(inv, jnp.float32))


def mul_subnormal_lhs(a: jax.Array, b: jax.Array) -> jax.Array:
  """float32 ``a * b`` (``b`` positive, finite) also where ``a`` is an f32 subnormal.

  XLA:CPU (and TPU) treat subnormal float inputs as zero, which would zero NVFP4
  elements and block scales of tiny blocks that the spec's float32 arithmetic (GPU,
  NumPy) keeps. A subnormal ``a`` is scaled up by 2^24 in the bits first, and the
  product back down: exact whenever ``a * b`` is normal (smaller products round to
  zero in E2M1 and E4M3 either way).
  """
  bits = lax.bitcast_convert_type(a, jnp.uint32)
  mag = bits & _U(0x7FFFFFFF)
  sub = (mag < _U(0x00800000)) & (mag != 0)
  up = lax.bitcast_convert_type(
      float_bits.ldexp_bits(mag, 24) | (bits & _U(0x80000000)), jnp.float32)
  prod = jnp.where(sub, up, a) * b
  return jnp.where(sub, prod * np.float32(2.0 ** -24), prod)


def round_scaled_e2m1(xp, enc_full, poison_full, rounding, words):
  """(E2M1 codes, float32 element values) of ``xp * enc_full`` (both conventions'
  element step; poisoned blocks: zero codes)."""
  f = formats_lib.get("e2m1")
  scaled = mul_subnormal_lhs(jnp.where(poison_full, np.float32(0.0), xp), enc_full)
  sb = lax.bitcast_convert_type(scaled, jnp.uint32)
  elem = block_layout.round_elements(sb & _U(0x7FFFFFFF), sb >> 31, f, 0, rounding,
                                     words)
  elem_f = lax.bitcast_convert_type(elem, jnp.float32)
  codes = jnp.where(poison_full, jnp.uint8(0), encoding.encode(elem_f, f))
  return codes, elem_f


def finite_block_amax(xp, axes, blocks):
  """(float32 finite block amax, poisoned, blocked shape, block positions) of ``xp``."""
  a = lax.bitcast_convert_type(xp, jnp.uint32) & _U(0x7FFFFFFF)
  amax, bshape, bpos = block_layout.max_bits_per_block(a, axes, blocks)
  poisoned = amax >= _U(0x7F800000)
  block_amax = lax.bitcast_convert_type(jnp.where(poisoned, _U(0), amax), jnp.float32)
  return block_amax, poisoned, bshape, bpos


def te_block_scales(block_amax, s_enc, scalar_div=float_bits.div_rn):
  """(E4M3-rounded S_dec, element multiplier enc) per block, TE's chain.

  ``scalar_div`` forms the scalar ``1/S_enc``: :func:`numerics.float_bits.div_rn` in the
  Pallas kernels' body, :func:`numerics.float_bits.div_rn_idiv` in jnp programs (the
  same bits as :func:`tensor_scale_of_amax`'s). The per-block reciprocal stays on
  ``div_rn``'s loop, which fuses into one pass (XLA:CPU keeps integer divisions out
  of fusions: per-block divisions took ``quantize_nvfp4`` from 0.8-1.3x a copy's time
  to 1.4-2.5x)."""
  s_dec = jnp.minimum(mul_subnormal_lhs(block_amax, s_enc * np.float32(1.0 / 6.0)),
                      np.float32(448.0))
  s_dec = rounding_lib.round_f32(s_dec, formats_lib.get("e4m3"),
                                 rounding=rounding_lib.Nearest(), saturate=True)
  inv_s_enc = scalar_div(np.float32(1.0), s_enc)
  # 1/S_enc is subnormal for a tensor amax below 2688 * 2^-126: the product is formed
  # in integers, as XLA:CPU and TPUs would read that operand as zero.
  enc = jnp.minimum(
      float_bits.div_rn(np.float32(1.0), float_bits.mul_narrow(s_dec, inv_s_enc)),
      _FLT_MAX)
  return s_dec, enc


def nvfp4_quantize_core(xp: jax.Array, s_enc: jax.Array, axes: tuple[int, ...],
                        blocks: tuple[int, ...], rounding: rounding_lib.Rounding,
                        words: jax.Array | None
                        ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(E2M1 codes, E4M3 scale codes, float32 element x block-scale values) of ``xp``.

  The ``te`` convention. ``xp`` is float32 with block-divisible axes and ``s_enc`` its
  tensor scale (:func:`nvfp4_tensor_scale`); the values (NaN in poisoned blocks) times
  ``1/S_enc`` are the dequantized tensor. The Pallas kernels in
  :mod:`numerics.kernels.nvfp4_quantizers` run it; :mod:`numerics.nvfp4_fast` is held
  bit-equal to it.
  """
  e4m3 = formats_lib.get("e4m3")
  block_amax, poisoned, bshape, bpos = finite_block_amax(xp, axes, blocks)
  s_dec, enc = te_block_scales(block_amax, s_enc)
  enc_full = jnp.broadcast_to(enc, bshape).reshape(xp.shape)
  # The poison flag travels as a NaN scale (S_dec is otherwise finite): Mosaic TPU
  # cannot move a boolean mask between layouts (no i1 transpose).
  s_dec_full = jnp.broadcast_to(jnp.where(poisoned, np.float32(np.nan), s_dec),
                                bshape).reshape(xp.shape)
  poison_full = jnp.isnan(s_dec_full)
  codes, elem_f = round_scaled_e2m1(xp, enc_full, poison_full, rounding, words)
  scale_codes = jnp.where(poisoned, jnp.uint8(e4m3.nan_code),
                          encoding.encode(s_dec, e4m3))
  scale_codes = jnp.squeeze(scale_codes, axis=bpos)
  # element * E4M3 scale is exact in float32 (at most 2 + 4 significant bits, >= 2^-10);
  # poisoned blocks: 0 * NaN.
  values = elem_f * s_dec_full
  return codes, scale_codes, values


_NORMAL_PRODUCT_MIN = np.int32(np.float32(2.0 ** -116).view(np.int32))


def _multiply_is_normal(scale: jax.Array) -> jax.Array:
  """Whether ``scale >= 2^-116``: then ``v * scale`` for every nonzero NVFP4 value
  ``v`` before its tensor scale (``|v| >= 2^-10``, or torchao's ``s >= 2^-9`` and
  ``element >= 2^-1``) has normal operands and a normal result, so a float multiply
  rounds it as IEEE does on every backend, XLA:CPU's flushing ones included."""
  # int32 bits (magnitudes order like them): the Pallas kernels run this on a scalar.
  return (lax.bitcast_convert_type(scale, jnp.int32) & _I(0x7FFFFFFF)) >= \
      _NORMAL_PRODUCT_MIN


def tensor_scaled(scale: jax.Array, fn):
  """``fn(mul)``: a per-element pass that multiplies NVFP4 values by the tensor scale
  ``scale`` with ``mul``, the float multiply where :func:`_multiply_is_normal` and
  :func:`numerics.float_bits.mul_narrow` (exact in integers, about as costly as the rest
  of the pass) where a subnormal scale or result needs it. The pass is traced twice
  behind a scalar ``lax.cond``, so a normal tensor pays nothing for the exact one."""
  return lax.cond(_multiply_is_normal(scale), lambda: fn(jnp.multiply),
                  lambda: fn(float_bits.mul_narrow))


def encode_e4m3_nonnegative(v: jax.Array) -> jax.Array:
  """uint32 E4M3 code (0..126) of float32 ``v >= 0`` exactly representable in E4M3."""
  b = lax.bitcast_convert_type(v, jnp.uint32)
  e = (b >> 23).astype(jnp.int32) - 127  # normal float32 (E4M3 values are >= 2^-9)
  normal = ((e + 7).astype(jnp.uint32) << 3) | ((b >> 20) & np.uint32(7))
  sub = (b >> 20 & np.uint32(7) | np.uint32(8)) >> jnp.clip(-6 - e, 0, 4).astype(
      jnp.uint32)
  return jnp.where(v == 0, np.uint32(0), jnp.where(e >= -6, normal, sub))
