"""A quantized GEMM's operands: each quantized as its recipe says, for numerics.qdot.

:func:`gemm_operands` applies a GEMM's Hadamard transform (random or fixed) to both
operands along the contraction axis and quantizes each (:func:`quantize_operand`: MX,
NVFP4, per-tensor or delayed scaling, with static or dynamic clipping and macro blocks),
returning :class:`Operand`: the float32 values the emulated GEMM multiplies, the
telemetry, the amax a delayed-scaling state needs, an NVFP4 tensor scale kept apart,
and, for a native GEMM, the storage form (:mod:`numerics.native_gemm`).
:func:`compensate` divides a GEMM's output by its operands' static-clipping prescales.
The GEMMs, their keys and the custom VJP are :mod:`numerics.qdot`'s.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from lowprec.numerics import blockscale
from lowprec.numerics import clipping
from lowprec.numerics import delayed_scaling
from lowprec.numerics import float_bits
from lowprec.numerics import formats as formats_lib
from lowprec.numerics import gradients
from lowprec.numerics import hadamard as hadamard_lib
from lowprec.numerics import kernels
from lowprec.numerics import macro_scaling
from lowprec.numerics import native_gemm
from lowprec.numerics import qdot_state
from lowprec.numerics import quantizer
from lowprec.numerics import recipes as recipes_lib
from lowprec.numerics import telemetry as telemetry_lib


def no_gradient_message(owner: str, what: str) -> str:
  return (f"{owner} has no {what}: its NVFP4 operands enter the GEMMs as block-scaled "
          f"values apart from their tensor scales (which the GEMM applies to its "
          f"output, as NVFP4 hardware does), and that split is not differentiable. "
          f"Differentiate it once (jax.grad), or use a recipe whose operands are "
          f"straight-through fake quantizers (e.g. 'mxfp8', 'mxfp4')")


class Operand(NamedTuple):
  """A quantized GEMM operand: ``q`` (float32) times ``scale`` (where not None) is its
  fake-quantized value; ``native`` its storage form for a native GEMM, or None."""

  q: jax.Array
  tel: Any = None
  amax: jax.Array | None = None
  scale: jax.Array | None = None
  native: native_gemm.Operand | None = None


def quantize_operand(x: jax.Array, op: recipes_lib.OperandQuant | None,
                     contract_axis: int, free_axis: int, key, *,
                     delayed: delayed_scaling.DelayedScalingState | None = None,
                     telemetry: bool = False, owner: tuple[str, str] | None = None,
                     native: bool = False) -> Operand:
  """The GEMM operand ``x`` quantized by ``op`` (an :class:`Operand`: float32 values,
  telemetry or None, amax or None, tensor scale or None, native form or None).

  The operand times its tensor scale (where not None) is the fake-quantized value:
  NVFP4 operands come as block-scaled values (exact in bfloat16) and ``1/S_enc``
  (:func:`numerics.kernels.quantize_dequantize_split`), and the GEMM applies the scale
  to its output. ``x`` in float32 when ``op`` is None. Still multiplied by
  ``op.prescale``: the GEMM divides the prescales out of its output, so the operands
  it multiplies stay exact quantized values. ``delayed`` is the operand's state for
  ``scaling="delayed"``, whose amax is returned for the state update. ``owner``:
  (public function and recipe, what it has none of) for the error raised when an NVFP4
  split operand is differentiated (a second derivative of the custom VJP). ``native``:
  also return the operand's storage form (:mod:`numerics.native_gemm`; ``op`` has one).
  """
  x = x.astype(jnp.float32)
  if op is None:
    return Operand(x)
  key = key if op.rounding.needs_key else None
  x = _prescaled(x, op)
  if isinstance(op, recipes_lib.DelayedQuant):
    if delayed is None:
      raise ValueError("a delayed-scaling operand needs its state: use "
                       "quantized_dot_general_with_state")
    codes, decode = delayed_scaling.quantize(x, delayed, op.fmt, rounding=op.rounding,
                                             key=key)
    q = codes * decode  # delayed_scaling.quantize_dequantize's bits
    tel = (telemetry_lib.scaled_telemetry(x, q, delayed.scale, op.fmt)
           if telemetry else None)
    nat = native_gemm.tensor_operand(codes, decode, op.fmt) if native else None
    return Operand(q, tel, delayed_scaling.amax(x), None, nat)
  x, x_in, spec = _clipped(x, op, contract_axis, free_axis)
  if native:
    q, scale, nat = _native_quantize(x, spec, key, owner)
    tel = (telemetry_lib.spec_telemetry(x_in, q if scale is None else q * scale, spec)
           if telemetry else None)
    return Operand(q, tel, None, scale, nat)
  # The fused Pallas kernel on GPU/TPU where the spec allows (same bits), else jnp;
  # the rule and its NUMERICS_KERNELS override: numerics.kernels.dispatch.
  if op.macro_block is None:
    split = lambda x, key: kernels.quantize_dequantize_split(x, spec, key=key)
    if owner is not None and kernels.splits_tensor_scale(spec):
      # Name the public function: the split's own error names an internal one.
      split = gradients.not_differentiable(split, owner[0], "",
                                           message=no_gradient_message(*owner))
    q, scale = split(x, key)
    return _split_operand(x_in, q, scale, spec, telemetry)
  fmt_max = float(formats_lib.get(op.fmt).max)
  s = macro_scaling.macro_block_scales(
      x, fmt_max, **op.blocks(contract_axis, free_axis, op.macro_block))
  q_in_macro = kernels.quantize_dequantize(x / s, spec, key=key)
  q = q_in_macro * s
  tel = None
  if telemetry:
    tel = telemetry_lib.spec_telemetry(x / s, q_in_macro, spec)
    tel = tel._replace(sqnr_db=telemetry_lib.spec_telemetry(x_in, q, spec).sqnr_db)
  return Operand(q, tel)


def _prescaled(x: jax.Array, op: recipes_lib.OperandQuant) -> jax.Array:
  """``x`` times the operand's static-clipping prescale."""
  return x if op.prescale == 1.0 else x * np.float32(op.prescale)


def _clipped(x: jax.Array, op: recipes_lib.OperandQuant, contract_axis: int,
             free_axis: int) -> tuple[jax.Array, jax.Array, quantizer.QuantSpec]:
  """(the operand as quantized, after any RMS clipping; before it; its spec)."""
  spec = op.spec(contract_axis, free_axis)
  x_in = x
  if op.clip == "rms":
    x = clipping.clip_to_block_rms(x, **op.blocks(contract_axis, free_axis))
  return x, x_in, spec


def _split_operand(x_in, q, scale, spec, telemetry: bool) -> Operand:
  tel = (telemetry_lib.spec_telemetry(x_in, q if scale is None else q * scale, spec)
         if telemetry else None)
  return Operand(q, tel, None, scale)


def _splits_together(x: jax.Array, op, axes, native: bool) -> bool:
  """Whether ``op`` quantizes ``x`` as an NVFP4 (te) split on the jnp path, nothing
  else in the way: such operands of one GEMM share one scale chain."""
  return (op is not None and not native and not isinstance(op, recipes_lib.DelayedQuant)
          and op.macro_block is None and kernels.splits_on_jnp(x, op.spec(*axes)))


def _quantize_together(xs, ops, axes, keys, telemetry: bool, owner
                       ) -> tuple[Operand, ...]:
  """:func:`quantize_operand` of operands that :func:`_splits_together`, bit for bit,
  with their NVFP4 scale chains in one computation
  (:func:`numerics.kernels.quantize_dequantize_split_many`)."""
  ready = []
  for x, op, (contract_axis, free_axis), key in zip(xs, ops, axes, keys):
    ready.append(_clipped(_prescaled(x.astype(jnp.float32), op), op, contract_axis,
                          free_axis)
                 + (key if op.rounding.needs_key else None,))
  split = lambda xs, keys: kernels.quantize_dequantize_split_many(
      xs, [r[2] for r in ready], keys)
  if owner is not None:
    split = gradients.not_differentiable(split, owner[0], "",
                                         message=no_gradient_message(*owner))
  outs = split([r[0] for r in ready], [r[3] for r in ready])
  return tuple(_split_operand(r[1], q, scale, r[2], telemetry)
               for r, (q, scale) in zip(ready, outs))


def _native_quantize(x: jax.Array, spec, key, owner: tuple[str, str] | None):
  """(float32 values, tensor scale or None, storage form) of a native operand: the same
  bits as the emulated path's values (the quantizer's codes decoded exactly)."""
  def quantize(x, key):
    if spec.tensorwise:  # per-tensor FP8: codes / scale, as quantizer.quantize_dequantize
      codes, s = quantizer.tensor_quantize(x, spec, key=key)
      decode = float_bits.div_rn(np.float32(1.0), s)
      return codes / s, None, native_gemm.tensor_operand(codes, decode, spec.fmt)
    qa = quantizer.quantize(x, spec, key=key)
    if kernels.splits_tensor_scale(spec):  # NVFP4 te: E2M1 x E4M3 (exact), 1/S_enc
      values = blockscale.dequantize(dataclasses.replace(
          qa, tensor_scale=jnp.ones_like(qa.tensor_scale)))
      return values, qa.tensor_scale, native_gemm.block_operand(qa)
    return blockscale.dequantize(qa), None, native_gemm.block_operand(qa)

  if owner is not None:  # the codes have no derivative: say so under a 2nd derivative
    quantize = gradients.not_differentiable(quantize, owner[0], "", message=(
        f"{owner[0]} has no {owner[1]}: its native GEMMs take the operands' codes and "
        f"scales apart. Differentiate it once (jax.grad), or use the recipe without "
        f"with_native_gemm"))
  return quantize(x, key)


def prescale(op: recipes_lib.OperandQuant | None) -> float:
  """The operand's static-clipping prescale (1 for an unquantized operand)."""
  return 1.0 if op is None else op.prescale


def compensate(out: jax.Array, *ops) -> jax.Array:
  """Divides a GEMM output by its operands' static-clipping prescales."""
  p = math.prod(prescale(op) for op in ops)
  return out if p == 1.0 else out / np.float32(p)


def _hadamard_pair(a: jax.Array, b: jax.Array, axis_a: int, axis_b: int, block: int,
                   key, random: bool) -> tuple[jax.Array, jax.Array]:
  """Applies the same (random or fixed) Hadamard transform along the contraction axis
  of both operands (zero-padded)."""
  a = blockscale.pad_to_multiple(a, (axis_a,), (block,))
  b = blockscale.pad_to_multiple(b, (axis_b,), (block,))
  r = (hadamard_lib.random_hadamard_matrix(block, key=key) if random
       else hadamard_lib.normalized_hadamard_matrix(block))
  return (hadamard_lib.apply_blockwise(a, r, axis_a),
          hadamard_lib.apply_blockwise(b, r, axis_b))


def gemm_operands(a, b, gemm, axes_a, axes_b, keys, delayed, telemetry, name, owner,
                  natives: tuple[bool, bool] | None = None) -> tuple[Operand, Operand]:
  """The two quantized operands (:class:`Operand`) of the GEMM ``name``; ``natives``
  (default: the GEMM's ``native`` for both) says which also get their storage form."""
  natives = (gemm.native, gemm.native) if natives is None else natives
  a = a.astype(jnp.float32)
  b = b.astype(jnp.float32)
  if gemm.hadamard is not None:
    a, b = _hadamard_pair(a, b, axes_a[0], axes_b[0], gemm.hadamard, keys[0],
                          gemm.hadamard_random)
  lhs_delayed = delayed_state(delayed, name, "lhs")
  rhs_delayed = delayed_state(delayed, name, "rhs")
  if (_splits_together(a, gemm.lhs, axes_a, natives[0])
      and _splits_together(b, gemm.rhs, axes_b, natives[1])):
    return _quantize_together((a, b), (gemm.lhs, gemm.rhs), (axes_a, axes_b),
                              (keys[1], keys[2]), telemetry, owner)
  return (quantize_operand(a, gemm.lhs, *axes_a, keys[1], telemetry=telemetry,
                           delayed=lhs_delayed, owner=owner, native=natives[0]),
          quantize_operand(b, gemm.rhs, *axes_b, keys[2], telemetry=telemetry,
                           delayed=rhs_delayed, owner=owner, native=natives[1]))


def delayed_state(delayed: qdot_state.OperandSlots | None, gemm: str, side: str):
  """The operand's delayed-scaling state, or None."""
  return None if delayed is None else getattr(delayed, qdot_state.slot(f"{gemm}/{side}"))
