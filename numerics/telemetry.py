"""Numerics telemetry of one quantized GEMM operand, computed inside ``jit``.

For an operand ``x`` and its quantized value ``q`` (float32, x's shape):

* ``saturated``: fraction of the elements whose magnitude lies beyond the largest value
  of their block's grid (``|x| * m > max``, with ``m`` the multiplier that maps ``x``
  onto the element format: ``2^-s`` of its MX block, NVFP4's ``enc``, the tensor or
  delayed scale, or 1 for a cast), so that the quantizer clamped them to ``+-max``.
  Under the OCP ``floor`` rule this is the 957 -> 896 clipping of a block's top values.
* ``flushed``: fraction of the elements that are finite and nonzero but quantized to
  zero (underflow).
* ``scale_clamped``: fraction of the blocks whose scale left its format's range: an
  E8M0 exponent outside [-127, 127] (MX), an E4M3 block scale rounded to zero (NVFP4,
  ``te``) or raised to 2^-6 / lowered to 448 (NVFP4, ``torchao``); 0 without blocks.
* ``sqnr_db``: ``10 log10(sum x^2 / sum (x - q)^2)`` over the elements where both are
  finite; ``+inf`` when ``q == x`` there.

All four are float32 scalars (a :class:`OperandTelemetry`). They recompute the
quantizer's scales, so turning telemetry on costs extra passes over each operand
(measured by ``python -m experiments.benchmarks.library_speed``); turned off,
:mod:`numerics.qdot` traces none of it.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.numerics import blockscale
from lowprec.numerics import float_bits
from lowprec.numerics import formats as formats_lib
from lowprec.numerics import quantizer

STATS = ("saturated", "flushed", "scale_clamped", "sqnr_db")


class OperandTelemetry(NamedTuple):
  """Telemetry of one quantized operand (float32 scalars; see the module docstring)."""

  saturated: jax.Array
  flushed: jax.Array
  scale_clamped: jax.Array
  sqnr_db: jax.Array


def zeros() -> OperandTelemetry:
  """All-zero telemetry (the placeholder the backward pass overwrites)."""
  z = jnp.zeros((), jnp.float32)
  return OperandTelemetry(z, z, z, z)


def _fraction(mask: jax.Array) -> jax.Array:
  return jnp.mean(mask.astype(jnp.float32)) if mask.size else jnp.zeros((), jnp.float32)


def _common(x: jax.Array, q: jax.Array, beyond: jax.Array, clamped: jax.Array
            ) -> OperandTelemetry:
  finite = jnp.isfinite(x) & jnp.isfinite(q)
  flushed = finite & (x != 0) & (q == 0)
  xf = jnp.where(finite, x, 0.0).astype(jnp.float32)
  err = jnp.where(finite, x - q, 0.0).astype(jnp.float32)
  signal, noise = jnp.sum(xf * xf), jnp.sum(err * err)
  sqnr = jnp.where(noise > 0, 10.0 * jnp.log10(signal / noise), jnp.inf)
  return OperandTelemetry(_fraction(beyond & jnp.isfinite(x)), _fraction(flushed),
                          _fraction(clamped), sqnr.astype(jnp.float32))


def _scaled_magnitude(x: jax.Array, exponent: jax.Array) -> jax.Array:
  """float32 ``|x| * 2^exponent`` by exponent arithmetic (no subnormal flush)."""
  bits = lax.bitcast_convert_type(x, jnp.uint32) & np.uint32(0x7FFFFFFF)
  finite = bits < np.uint32(0x7F800000)
  scaled = float_bits.ldexp_bits(jnp.where(finite, bits, np.uint32(0)), exponent)
  return lax.bitcast_convert_type(scaled, jnp.float32)


@functools.partial(jax.jit, static_argnames=("spec",))
def spec_telemetry(x: jax.Array, q: jax.Array, spec: quantizer.QuantSpec
                   ) -> OperandTelemetry:
  """Telemetry of ``q``, the result of quantizing ``x`` with ``spec`` (module doc)."""
  x = jnp.asarray(x, jnp.float32)
  q = jnp.asarray(q, jnp.float32)
  no_blocks = jnp.zeros((0,), bool)
  if spec.scaling == "none":
    fmax = formats_lib.get(spec.fmt).max
    return _common(x, q, jnp.abs(x) > fmax, no_blocks)
  if spec.scaling == "tensor":
    fmax = formats_lib.get(spec.fmt).max
    scale = quantizer.tensor_scale(x, spec.fmt, amax_axis_name=spec.amax_axis_name)
    return _common(x, q, jnp.abs(x) * scale > fmax, no_blocks)
  layout = dict(block_shape=spec.block_shape, axis=spec.axis, pad=spec.pad)
  if spec.fmt == "nvfp4":
    mult, clamped = blockscale.nvfp4_grid_multipliers(x, convention=spec.convention,
                                                     amax_axis_name=spec.amax_axis_name,
                                                     **layout)
    return _common(x, q, jnp.abs(x) * mult > 6.0, clamped)
  f = formats_lib.get(spec.fmt)
  s = blockscale.mx_grid_exponents(x, f, scale_rule=spec.scale_rule, **layout)
  clamped = blockscale.mx_scale_clamped(x, f, scale_rule=spec.scale_rule, **layout)
  return _common(x, q, _scaled_magnitude(x, -s) > f.max, clamped)


@functools.partial(jax.jit, static_argnames=("fmt",))
def scaled_telemetry(x: jax.Array, q: jax.Array, scale: jax.Array,
                     fmt: str | formats_lib.Format) -> OperandTelemetry:
  """Telemetry of a cast of ``x * scale`` to ``fmt`` (delayed scaling's quantizer)."""
  x = jnp.asarray(x, jnp.float32)
  f = formats_lib.get(fmt)
  return _common(x, jnp.asarray(q, jnp.float32), jnp.abs(x) * scale > f.max,
                 jnp.zeros((0,), bool))
