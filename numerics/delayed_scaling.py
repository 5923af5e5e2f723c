"""Delayed tensor scaling (Transformer Engine's ``DelayedScaling``), as carried state.

A delayed-scaled operand is quantized with a float32 scale that was computed *before*
this step, from an amax history of the previous steps; this step's amax then enters the
history for the next step. Per operand, the state is an amax history ``h`` of length
``L`` and the scale ``s`` (initially zeros and 1). One step, as Transformer Engine's
``DelayedScaleQuantizer`` (transformer_engine/jax/quantize/quantizer.py) does it:

1. quantize with the current scale: ``q = R(clip(x * s, -max, max)) * (1 / s)``, where
   ``R`` rounds to the element format (``max`` is its largest finite value);
2. write this step's ``amax = max|x|`` into ``h[0]``;
3. ``a = max(h)`` (``amax_compute_algo="max"``) or ``h[0]`` (``"most_recent"``);
4. the next scale ``s' = (max / a) / 2^margin``, keeping ``s`` where ``a`` is zero or
   not finite;
5. the next history ``h' = roll(h, -1)`` with ``h'[0] = 0``.

So ``h[1:]`` holds the last ``L - 1`` amaxes, and the scale used at step ``t`` reflects
steps ``t - L .. t - 1``. ``1 / s`` is IEEE round-to-nearest on every backend
(:func:`numerics.float_bits.div_rn`); ``x * s`` and the final product are float32
multiplies (XLA:CPU flushes float32 subnormals in them).

State lives outside the function (arrays in, arrays out): :func:`init_state`,
:func:`quantize_dequantize` and :func:`next_state`. :mod:`numerics.qdot` carries one
state per delayed operand of a GEMM and returns the next states as the gradient of the
state (the amax of a backward operand exists only in the backward pass).
"""

from __future__ import annotations

import functools
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from lowprec.numerics import float_bits
from lowprec.numerics import formats as formats_lib
from lowprec.numerics import rounding as rounding_lib

AmaxAlgo = Literal["max", "most_recent"]


class DelayedScalingState(NamedTuple):
  """One operand's delayed-scaling state (a pytree of float32 arrays).

  Attributes:
    amax_history: float32[L]; ``[0]`` is this step's slot (zero between steps), ``[1:]``
      the previous ``L - 1`` amaxes, oldest first.
    scale: float32[] the scale this step quantizes with (``max / amax`` of the history).
  """

  amax_history: jax.Array
  scale: jax.Array


def init_state(history_len: int) -> DelayedScalingState:
  """Zero history of ``history_len`` steps and scale 1 (Transformer Engine's start)."""
  if isinstance(history_len, bool) or not isinstance(history_len, (int, np.integer)) \
      or history_len < 1:
    raise ValueError(f"history_len must be a positive int, got {history_len!r}")
  return DelayedScalingState(jnp.zeros((int(history_len),), jnp.float32),
                             jnp.ones((), jnp.float32))


@functools.partial(jax.jit, static_argnames=("fmt", "rounding"))
def quantize(x: jax.Array, state: DelayedScalingState, fmt: str | formats_lib.Format, *,
             rounding: rounding_lib.Rounding = rounding_lib.Nearest(),
             key: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """``(codes, decode)``: float32 ``R(clip(x * s, -max, max))`` (values of ``fmt``,
  exact) and the float32 scalar ``1 / s`` (correctly rounded) for the state's scale
  ``s``. ``R`` is :func:`numerics.rounding.round_f32` to ``fmt`` with ``rounding`` (NaN
  stays NaN). No gradient policy."""
  f = formats_lib.get(fmt)
  x = rounding_lib.check_float_input(x, "delayed_scaling.quantize").astype(jnp.float32)
  scale = jnp.asarray(state.scale, jnp.float32)
  scaled = jnp.clip(x * scale, -np.float32(f.max), np.float32(f.max))
  rounding_lib.check_rounding_and_key(rounding, key, "delayed_scaling.quantize")
  words = rounding.words(key, x.shape, shard_of=x)
  q = rounding_lib.round_f32(scaled, f, rounding=rounding, words=words, saturate=True)
  return q, float_bits.div_rn(np.float32(1.0), scale)


def quantize_dequantize(x: jax.Array, state: DelayedScalingState,
                        fmt: str | formats_lib.Format, *,
                        rounding: rounding_lib.Rounding = rounding_lib.Nearest(),
                        key: jax.Array | None = None) -> jax.Array:
  """float32 ``R(clip(x * s, -max, max)) * (1 / s)`` with the state's scale ``s``
  (:func:`quantize`'s codes times its decode scale).

  ``R`` is :func:`numerics.rounding.round_f32` to ``fmt`` with ``rounding`` (NaN stays
  NaN). No gradient policy: callers (``numerics.qdot``) apply straight-through.
  """
  x = rounding_lib.check_float_input(x, "delayed_scaling.quantize_dequantize")
  codes, decode = quantize(x, state, fmt, rounding=rounding, key=key)
  return codes * decode


def amax(x: jax.Array) -> jax.Array:
  """float32[] ``max|x|`` (NaN if x holds NaN, as Transformer Engine's ``jnp.max``)."""
  return jnp.max(jnp.abs(jnp.asarray(x).astype(jnp.float32)), initial=0.0)


@functools.partial(jax.jit, static_argnames=("fmt", "amax_compute_algo", "margin"))
def next_state(state: DelayedScalingState, current_amax: jax.Array,
               fmt: str | formats_lib.Format, *, amax_compute_algo: AmaxAlgo = "max",
               margin: int = 0) -> DelayedScalingState:
  """The state after a step whose operand had amax ``current_amax`` (module doc 2-5)."""
  f = formats_lib.get(fmt)
  if amax_compute_algo not in ("max", "most_recent"):
    raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent', got "
                     f"{amax_compute_algo!r}")
  history = state.amax_history.at[0].set(jnp.asarray(current_amax, jnp.float32))
  a = jnp.max(history) if amax_compute_algo == "max" else history[0]
  new = (np.float32(f.max) / a) / np.float32(2.0 ** margin)
  scale = jnp.where((a > 0) & jnp.isfinite(a), new, state.scale)
  return DelayedScalingState(jnp.roll(history, -1).at[0].set(0.0),
                             scale.astype(jnp.float32))
