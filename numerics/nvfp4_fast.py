"""NVFP4 (Transformer Engine's chain) in two passes: the jnp fast path.

:func:`nvfp4_te_fast` is what :func:`numerics.nvfp4.quantize_nvfp4` and its
dequantizing forms run for the ``te`` convention, with any rounding: the block amaxes
(with the tensor amax taken from them), then the elements. The per-tensor scalars and
the per-block values (``S_dec``, ``enc``) are materialized once (:func:`_materialize`),
so XLA neither recomputes them per element nor copies the scalar chain into every
fusion that reads it. ``S_dec`` is rounded onto E4M3 by float adds, and ``enc`` read
from a 127-entry table (one per E4M3 value of ``S_dec``) formed once per tensor
(:func:`enc_table`). The tensor scales and the table are exact IEEE float32 arithmetic
in ops XLA fuses (:mod:`numerics.fused_division`: a division estimate corrected by
the exact remainder), not XLA:CPU's native division, which is correctly rounded for
normal quotients but flushes subnormal ones (e.g. ``1/S_enc``), nor XLA:GPU's, which is
approximate. E2M1 rounding is done in float arithmetic
(:func:`_e2m1_rne_magnitude`, :func:`_e2m1_sr_magnitude`) on operands that are never
subnormal. The ``torchao`` convention and the Pallas kernels run the reference cores
(:mod:`numerics.nvfp4_torchao`, :func:`numerics.nvfp4_te.nvfp4_quantize_core`); the
tests hold this path bit-equal to the TE core and both to the NumPy reference.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.numerics import block_layout
from lowprec.numerics import fused_division
from lowprec.numerics import formats as formats_lib
from lowprec.numerics import nvfp4_te
from lowprec.numerics import rounding as rounding_lib
from lowprec.numerics.block_layout import AmaxAxisName

_U = np.uint32


def _materialize(*block_values: jax.Array) -> tuple[jax.Array, ...]:
  """The same float32 arrays (values >= +0, or NaN with the sign bit clear), computed
  once.

  XLA fuses cheap arithmetic into each consumer: per-block values into the
  per-element loop that broadcasts them, which recomputes them for every element
  (16-256x the work), and a scalar chain (the tensor scale's exact divisions, ~400
  ops) into every fusion that reads it, which multiplies what is compiled; the CPU
  pipeline drops ``optimization_barrier`` before fusion. A reduction is never fused
  into its consumer, so each array is passed through a max-reduction with zero over a
  new axis of two, on the int32 bits (such floats order as their bits, NaN above every
  number): the result is the input, bit for bit, and materialized.
  """
  bits = [lax.bitcast_convert_type(v, jnp.int32) for v in block_values]
  stacked = [jnp.stack([b, jnp.zeros_like(b)], axis=-1) for b in bits]
  out = lax.reduce(tuple(stacked), tuple(np.int32(0) for _ in bits),
                   lambda x, y: tuple(jnp.maximum(a, b) for a, b in zip(x, y)),
                   (bits[0].ndim,))
  return tuple(lax.bitcast_convert_type(o, jnp.float32) for o in out)


def _e4m3_rne_nonnegative(m: jax.Array) -> jax.Array:
  """float32 E4M3 value nearest to float32 ``0 <= m <= 448``, ties to even, in float
  arithmetic: ``(m + C) - C`` with ``C = 1.5 * 2^(e + 20)`` rounds ``m`` to a multiple
  of ``2^(e - 3)`` (E4M3's quantum in ``m``'s binade ``2^e``, and ``2^-9`` below
  ``2^-6``), the sum's ulp. Equal bit for bit to
  :func:`numerics.rounding.round_f32` on E4M3 (tested against ml_dtypes' cast on
  every float32 exponent in range with all patterns of the top 11 mantissa bits).
  """
  e_field = jnp.maximum(lax.bitcast_convert_type(m, jnp.uint32) >> 23, _U(127 - 6))
  c = lax.bitcast_convert_type(((e_field + _U(20)) << 23) | _U(0x400000), jnp.float32)
  return (m + c) - c


def _magnitude_times(a: jax.Array, b: jax.Array) -> jax.Array:
  """float32 ``|x| * b`` from the uint32 magnitude bits ``a`` of a finite ``x`` (``b >
  0`` finite), also for a float32 subnormal ``|x|`` (XLA:CPU would read it as zero):
  the bits of a subnormal are its value in units of 2^-149, so ``float(a) * 2^-125``
  is ``|x| * 2^24`` exactly, and the product is scaled back by 2^-24. The same
  product as :func:`numerics.nvfp4_te.mul_subnormal_lhs`, in fewer ops."""
  sub = a < np.uint32(0x00800000)
  up = jnp.where(sub, a.astype(jnp.float32) * np.float32(2.0 ** -125),
                 lax.bitcast_convert_type(a, jnp.float32))
  prod = up * b
  return jnp.where(sub, prod * np.float32(2.0 ** -24), prod)


def _e4m3_significands() -> tuple[np.ndarray, np.ndarray]:
  """(uint32 significand in [8, 15], int32 exponent) of the E4M3 values of codes
  1..126 (value = sig * 2^exp; subnormal codes normalized); significand 0 for code 0."""
  code = np.arange(127)
  field, mant = code >> 3, code & 7
  sig = np.where(field == 0, mant, mant | 8)
  exp = np.where(field == 0, -9, field - 10)
  for _ in range(3):  # subnormals: shift the leading one up to bit 3
    low = (sig > 0) & (sig < 8)
    sig, exp = np.where(low, sig << 1, sig), np.where(low, exp - 1, exp)
  return sig.astype(np.uint32), exp.astype(np.int32)


_E4M3_SIG, _E4M3_EXP = _e4m3_significands()


def enc_table(inv_s_enc: jax.Array) -> jax.Array:
  """float32 ``min(1 / (v * (1/S_enc)), FLT_MAX)`` for the 127 E4M3 values ``v >= 0``
  (codes 0..126; code 0 gives FLT_MAX), each operation rounded to nearest even as
  IEEE float32 does, subnormal ``1/S_enc`` and products included: shape
  ``inv_s_enc.shape + (127,)``, for ``1/S_enc <= 2^117`` (every tensor scale's).

  The product of E4M3's 4-bit significand and ``1/S_enc``'s 24-bit one is exact in
  uint32 and rounded once (:func:`numerics.fused_division.round_bits`); the reciprocal
  is :func:`numerics.fused_division.reciprocal_bits`: fused ops, no integer division.
  """
  bits = lax.bitcast_convert_type(inv_s_enc, jnp.uint32)[..., None]
  sig, e = fused_division.significand(jnp.maximum(bits, _U(1)), subnormal=True)
  n = _E4M3_SIG * sig  # in [2^26, 2^28), or 0 for code 0
  p = fused_division.round_bits(jnp.maximum(n, _U(1 << 26)), 26, _E4M3_EXP + e - 23,
                                jnp.zeros(n.shape, bool), subnormal=True,
                                overflow=False)  # v * (1/S_enc) <= 448 * 2^117
  p = jnp.where((n == 0) | (bits == 0), _U(0), p)
  enc = fused_division.reciprocal_bits(p, subnormal_in=True, subnormal_out=False,
                                       overflow=True)  # 1/p >= 2^-126
  return lax.bitcast_convert_type(jnp.minimum(enc, _U(0x7F7FFFFF)), jnp.float32)


def te_block_scales_by_table(block_amax: jax.Array, s_enc: jax.Array,
                             inv_s_enc: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(E4M3-rounded ``S_dec``, element multiplier ``enc``) per block: the values of
  :func:`numerics.nvfp4_te.te_block_scales`, bit for bit, with per-block work in
  float arithmetic.

  ``S_dec`` is rounded onto E4M3 by float adds (:func:`_e4m3_rne_nonnegative`), and
  ``enc = min(1 / (S_dec * (1/S_enc)), FLT_MAX)``, which depends on the block only
  through ``S_dec``'s code, is read from a table of its 127 values formed once per
  tensor (:func:`enc_table`).
  """
  table, = _materialize(enc_table(inv_s_enc))
  return _block_scales(block_amax, s_enc, table)


def _block_scales(block_amax: jax.Array, s_enc: jax.Array, table: jax.Array
                  ) -> tuple[jax.Array, jax.Array]:
  """:func:`te_block_scales_by_table` with the tensor's table given."""
  s_dec = _e4m3_rne_nonnegative(jnp.minimum(_magnitude_times(
      lax.bitcast_convert_type(block_amax, jnp.uint32), s_enc * np.float32(1.0 / 6.0)),
      np.float32(448.0)))
  code = nvfp4_te.encode_e4m3_nonnegative(s_dec)
  return s_dec, jnp.take(table, code.astype(jnp.int32), mode="clip")


# E2M1 round-to-nearest-even of a magnitude m >= 0 (saturating at 6) as float adds:
# ``(m + C) - C`` rounds m to a multiple of C's ulp in the sum's binade, ties to even,
# with C = 1.5 * 2^22 (quantum 0.5) below 2, 1.5 * 2^23 (quantum 1) below 4 and
# 1.5 * 2^24 (quantum 2) above; larger m (and Inf) come out above 6 and saturate.
_E2M1_RNE_ADD = (np.float32(1.5 * 2.0 ** 22), np.float32(1.5 * 2.0 ** 23),
                 np.float32(1.5 * 2.0 ** 24))


def _e2m1_rne_magnitude(m: jax.Array) -> jax.Array:
  """float32 E2M1 value (0 .. 6) nearest to float32 ``m >= 0``, ties to even."""
  c = jnp.where(m < np.float32(2.0), _E2M1_RNE_ADD[0],
                jnp.where(m < np.float32(4.0), _E2M1_RNE_ADD[1], _E2M1_RNE_ADD[2]))
  return jnp.minimum((m + c) - c, np.float32(6.0))


def _e2m1_sr_magnitude(m: jax.Array, words: jax.Array, rand_bits: int | None
                       ) -> jax.Array:
  """float32 E2M1 value (0 .. 6) of float32 ``m >= 0`` rounded stochastically.

  Equal bit for bit to :func:`numerics.rounding.round_magnitude` on E2M1's grid (then
  saturated at 6), but in float arithmetic: with quantum ``q`` (0.5 below 2, 1 below
  4, 2 above), ``t = m / q`` and its fraction ``t - floor(t)`` are exact, and the
  reference rounds away from zero exactly when the fraction's top ``r`` bits plus the
  word's top ``r`` bits carry out of ``r`` bits (``r = rand_bits``, 32 when None; a
  fraction with fewer bits is padded with zeros, which cannot change the carry). That
  is the carry of the fraction's top 32 bits plus the word with its low ``32 - r``
  bits cleared: the fraction's bits below ``r`` are too few to carry on their own.
  """
  inv_q = jnp.where(m < np.float32(2.0), np.float32(2.0),
                    jnp.where(m < np.float32(4.0), np.float32(1.0), np.float32(0.5)))
  t = m * inv_q
  k = jnp.floor(t)
  # The fraction's top 32 bits; exact below 2^32, and an Inf m gives NaN here, which
  # only decides whether Inf + 1 saturates to 6.
  frac = ((t - k) * np.float32(2.0 ** 32)).astype(jnp.uint32)
  if rand_bits is not None and rand_bits < 32:
    words = words & np.uint32((0xFFFFFFFF << (32 - rand_bits)) & 0xFFFFFFFF)
  away = words > ~frac  # frac + words >= 2^32
  return jnp.minimum((k + away.astype(jnp.float32)) / inv_q, np.float32(6.0))


def _e2m1_code_of_magnitude(bits: jax.Array) -> jax.Array:
  """uint32 E2M1 magnitude code (0..7) of the float32 bits of an E2M1 value >= 0."""
  e = bits >> 23  # 0.5 -> 126, 1 -> 127, ..., 6 -> 129
  normal = ((e - np.uint32(126)) << 1) | ((bits >> 22) & np.uint32(1))
  return jnp.where(e >= np.uint32(127), normal,
                   jnp.where(e == np.uint32(126), np.uint32(1), np.uint32(0)))


def nvfp4_te_fast(xp: jax.Array, axes: tuple[int, ...], blocks: tuple[int, ...], *,
                  rounding: rounding_lib.Rounding, words,
                  dequantize: bool | str, amax_axis_name: AmaxAxisName = None):
  """NVFP4 (``te`` convention, any rounding) in two passes over ``xp``.

  The fast jnp path of :func:`numerics.nvfp4.quantize_nvfp4` and
  :func:`numerics.nvfp4.quantize_dequantize_nvfp4`: one pass takes each block's amax
  (finite and not, in one variadic reduction), from which the tensor amax, ``S_enc``
  and each block's ``S_dec`` and ``enc`` follow
  (:func:`te_block_scales_by_table`, materialized once per block by
  :func:`_materialize`); the second works on ``x`` in its blocked shape (a per-block
  value is a plain broadcast there): it scales ``|x|`` by ``enc`` (a float32 subnormal
  ``x`` scaled up by 2^24 first, as :func:`numerics.nvfp4_te.mul_subnormal_lhs` does)
  and rounds onto E2M1, to nearest by float adds (:func:`_e2m1_rne_magnitude`),
  stochastically on ``words`` in float arithmetic (:func:`_e2m1_sr_magnitude`), toward
  zero by the reference :func:`numerics.rounding.round_magnitude`. Equal bit for bit
  to :func:`numerics.nvfp4_te.nvfp4_quantize_core` (tested, and both against the NumPy
  reference). Returns (codes, scale codes, 1/S_enc), or the dequantized float32 tensor
  with ``dequantize``, or with ``dequantize="blocks"`` (the dequantized tensor before
  its tensor scale, 1/S_enc). ``words``: uint32 of ``xp``'s shape (or a function
  returning them, called where they are used, so that XLA fuses them), or None.
  ``amax_axis_name``: as :func:`numerics.nvfp4.quantize_nvfp4`. With
  ``dequantize=True`` the second pass runs behind
  :func:`numerics.nvfp4_te.tensor_scaled`.
  """
  first = _first_pass(xp, axes, blocks, amax_axis_name)
  s_enc, inv_s_enc, table = _tensor_scales(first.t_amax_bits)
  return _finish(xp, first, s_enc, inv_s_enc, table, rounding=rounding, words=words,
                 dequantize=dequantize)


def _tensor_scales(t_amax_bits: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(``S_enc``, ``1/S_enc``, the ``enc`` table) of tensor amax bits of any shape,
  materialized: XLA would otherwise copy this chain into every fusion that reads
  ``1/S_enc``, down to the consumers of a GEMM that applies it."""
  s_enc, inv_s_enc = _materialize(*nvfp4_te.tensor_scale_of_amax(t_amax_bits))
  table, = _materialize(enc_table(inv_s_enc))
  return s_enc, inv_s_enc, table


def nvfp4_te_fast_blocks_many(xps: Sequence[jax.Array],
                              layouts: Sequence[tuple[tuple[int, ...], tuple[int, ...]]],
                              roundings: Sequence[rounding_lib.Rounding],
                              words: Sequence, amax_axis_names: Sequence[AmaxAxisName]
                              ) -> list[tuple[jax.Array, jax.Array]]:
  """:func:`nvfp4_te_fast` with ``dequantize="blocks"`` on several tensors at once, bit
  for bit: ``[(values, 1/S_enc), ...]``, one per ``xps[i]`` with its ``(axes, blocks)``,
  rounding, words and amax axis names.

  The tensors' scale chains (``S_enc``, ``1/S_enc``, the ``enc`` table) run as one
  vectorized computation on their stacked amaxes: the same ops on a longer vector, so
  the program holds one chain instead of one per tensor (a GEMM's two operands).
  """
  firsts = [_first_pass(xp, axes, blocks, name)
            for xp, (axes, blocks), name in zip(xps, layouts, amax_axis_names)]
  s_enc, inv_s_enc, tables = _tensor_scales(jnp.stack([f.t_amax_bits for f in firsts]))
  return [_finish(xp, f, s_enc[i], inv_s_enc[i], tables[i], rounding=r, words=w,
                  dequantize="blocks")
          for i, (xp, f, r, w) in enumerate(zip(xps, firsts, roundings, words))]


class _FirstPass(NamedTuple):
  """What the first pass over a tensor leaves: its blocked bits and shape, the block
  amax bits (non-finite values included: a poisoned block's are >= Inf's) and the
  finite tensor amax's bits."""
  xb: jax.Array
  amax: jax.Array
  bshape: tuple[int, ...]
  bpos: tuple[int, ...]
  t_amax_bits: jax.Array


def _first_pass(xp, axes, blocks, amax_axis_name) -> _FirstPass:
  bshape, bpos = block_layout.blocked_shape(xp.shape, axes, blocks)
  xb = lax.bitcast_convert_type(xp, jnp.uint32).reshape(bshape)
  ab = lax.bitcast_convert_type(xb & np.uint32(0x7FFFFFFF), jnp.int32)
  finite_ab = jnp.where(ab < np.int32(0x7F800000), ab, np.int32(0))
  amax, finite_amax = ab, finite_ab
  for p in reversed(bpos):  # tiles: the contiguous in-block axis first (faster on CPU)
    amax, finite_amax = lax.reduce(
        (amax, finite_amax), (np.int32(0), np.int32(0)),
        lambda x, y: (jnp.maximum(x[0], y[0]), jnp.maximum(x[1], y[1])), (p,))
    amax, finite_amax = (jnp.expand_dims(v, p) for v in (amax, finite_amax))
  t_amax_bits = block_layout.reduce_amax_bits(jnp.max(finite_amax, initial=np.int32(0)),
                                              amax_axis_name)
  return _FirstPass(xb, amax, bshape, bpos, t_amax_bits)


def _finish(xp, first: _FirstPass, s_enc, inv_s_enc, table, *, rounding, words,
            dequantize):
  """The block scales and the second pass over ``xp`` (:func:`nvfp4_te_fast`'s
  returns), given its first pass and tensor scales."""
  xb, amax, bshape, bpos, _ = first
  poisoned = amax >= np.int32(0x7F800000)
  block_amax = lax.bitcast_convert_type(jnp.where(poisoned, np.int32(0), amax),
                                        jnp.float32)
  s_dec, enc = _materialize(*_block_scales(block_amax, s_enc, table))
  if dequantize is True:
    # x, not its bits, enters the branches: an operand of lax.cond is materialized.
    return nvfp4_te.tensor_scaled(inv_s_enc, lambda mul: _nvfp4_te_second_pass(
        xp, poisoned, s_dec, enc, words, rounding, bshape,
        lambda v: mul(v, inv_s_enc))).reshape(xp.shape)
  elem, elem_bits, sign = _nvfp4_te_elements(xb, poisoned, enc, words, rounding,
                                             bshape)
  if dequantize:
    value = elem * s_dec  # exact: at most 2 + 4 significant bits, >= 2^-10
    value = lax.bitcast_convert_type(
        lax.bitcast_convert_type(value, jnp.uint32) | sign, jnp.float32)
    value = jnp.where(poisoned, np.float32(np.nan), value).reshape(xp.shape)
    return value, inv_s_enc
  codes = (sign >> 28) | _e2m1_code_of_magnitude(elem_bits)
  codes = jnp.where(poisoned, np.uint32(0), codes).astype(jnp.uint8).reshape(xp.shape)
  scale_codes = jnp.where(poisoned, np.uint32(formats_lib.get("e4m3").nan_code),
                          nvfp4_te.encode_e4m3_nonnegative(s_dec)).astype(jnp.uint8)
  return codes, jnp.squeeze(scale_codes, axis=bpos), inv_s_enc


def _call(words):
  """Random words given as an array or as a function returning one."""
  return words() if callable(words) else words


def _nvfp4_te_elements(xb, poisoned, enc, words, rounding, bshape):
  """(E2M1 magnitudes as float32 and as bits, sign bits) of the blocked bits ``xb``."""
  words = None if words is None else _call(words)
  a = jnp.where(poisoned, np.uint32(0), xb & np.uint32(0x7FFFFFFF))
  sign = xb & np.uint32(0x80000000)
  scaled = _magnitude_times(a, enc)
  if isinstance(rounding, rounding_lib.Nearest):
    elem = _e2m1_rne_magnitude(scaled)
    elem_bits = lax.bitcast_convert_type(elem, jnp.uint32)
  elif isinstance(rounding, rounding_lib.Stochastic):
    elem = _e2m1_sr_magnitude(scaled, words.reshape(bshape), rounding.bits)
    elem_bits = lax.bitcast_convert_type(elem, jnp.uint32)
  else:
    elem_bits = block_layout.round_elements(
        lax.bitcast_convert_type(scaled, jnp.uint32), _U(0), formats_lib.get("e2m1"), 0,
        rounding, None if words is None else words.reshape(bshape))
    elem = lax.bitcast_convert_type(elem_bits, jnp.float32)
  return elem, elem_bits, sign


def _nvfp4_te_second_pass(xp, poisoned, s_dec, enc, words, rounding, bshape,
                          scale_by_tensor):
  """The dequantized tensor (blocked shape): ``scale_by_tensor(element * S_dec)``."""
  xb = lax.bitcast_convert_type(xp, jnp.uint32).reshape(bshape)
  elem, _, sign = _nvfp4_te_elements(xb, poisoned, enc, words, rounding, bshape)
  value = elem * s_dec  # exact: at most 2 + 4 significant bits, >= 2^-10
  value = lax.bitcast_convert_type(
      lax.bitcast_convert_type(value, jnp.uint32) | sign, jnp.float32)
  return jnp.where(poisoned, np.float32(np.nan), scale_by_tensor(value))
