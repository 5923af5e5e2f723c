"""Quantized convolution: ``lax.conv_general_dilated`` as an im2col GEMM under a recipe.

A convolution contracts each output position over its input channels and kernel
window. Written as a GEMM, the patches ``P`` (``N x out_positions x K``, with ``K =
window_size * C_in``) times the kernel ``W`` (``K x C_out``), the recipe's three GEMMs
apply as they do to a linear layer (:mod:`numerics.qdot`):

* forward ``O = P W`` (contraction over ``K``),
* dgrad ``dP = dO W^T`` (over ``C_out``; ``dP`` then goes through the patches'
  adjoint, a sum of shifted copies, exactly),
* wgrad ``dW = P^T dO`` (over batch x output positions).

``K`` is ordered (window offset, input channel): the channels of one offset are
contiguous, so 1D blocks along ``K`` (MX 32, NVFP4 16) hold consecutive input channels
of one kernel position whenever ``C_in`` is a multiple of the block (as Transformer
Engine-style recipes block a GEMM's K). With fewer channels (an RGB stem) a block spans
neighbouring offsets. The patches are extracted exactly (a one-hot convolution at
``HIGHEST`` precision), so with a non-quantizing recipe the result differs from XLA's
convolution only by float32 summation order.

Grouped convolutions (``feature_group_count`` or ``batch_group_count`` above 1) are not
expressible as one GEMM per recipe and raise.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from lowprec.numerics import qdot
from lowprec.numerics import recipes as recipes_lib
from lowprec.numerics import telemetry as telemetry_lib


def _check(lhs, rhs, feature_group_count, batch_group_count):
  for name, x in (("lhs", lhs), ("rhs", rhs)):
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
      raise TypeError(f"quantized_conv_general_dilated: {name} must be a float array, "
                      f"got {jnp.result_type(x)}")
  if feature_group_count != 1 or batch_group_count != 1:
    raise ValueError(
        f"quantized_conv_general_dilated: a grouped convolution (feature_group_count="
        f"{feature_group_count}, batch_group_count={batch_group_count}) is not one GEMM; "
        f"keep it unquantized")
  if jnp.ndim(lhs) != jnp.ndim(rhs) or jnp.ndim(lhs) < 3:
    raise ValueError(f"quantized_conv_general_dilated: lhs {jnp.shape(lhs)} and rhs "
                     f"{jnp.shape(rhs)} must have the same rank n + 2, n >= 1")


def _as_gemm(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
             dimension_numbers):
  """(patches ``(N, *out_spatial, K)``, kernel ``(K, C_out)``, the output's layout)."""
  dn = lax.conv_dimension_numbers(jnp.shape(lhs), jnp.shape(rhs), dimension_numbers)
  n_sp = len(dn.lhs_spec) - 2
  # Canonical layouts: lhs (N, C, *spatial), rhs (O, I, *window).
  lhs_c = jnp.transpose(lhs, dn.lhs_spec)
  rhs_c = jnp.transpose(rhs, dn.rhs_spec)
  window = rhs_c.shape[2:]
  c_in, c_out = lhs_c.shape[1], rhs_c.shape[0]
  if rhs_c.shape[1] != c_in:
    raise ValueError(f"quantized_conv_general_dilated: lhs has {c_in} input features, "
                     f"rhs expects {rhs_c.shape[1]}")
  patches = lax.conv_general_dilated_patches(
      lhs_c, window, window_strides, padding, lhs_dilation, rhs_dilation,
      precision=lax.Precision.HIGHEST)  # (N, C * prod(window), *out_spatial), c major
  out_sp = patches.shape[2:]
  patches = patches.reshape((patches.shape[0], c_in, *window, *out_sp))
  # -> (N, *out_spatial, *window, C): channels contiguous along K.
  perm = (0, *range(2 + n_sp, 2 + 2 * n_sp), *range(2, 2 + n_sp), 1)
  k = c_in * math.prod(window)
  patches = jnp.transpose(patches, perm).reshape((patches.shape[0], *out_sp, k))
  kernel = jnp.transpose(rhs_c, (*range(2, 2 + n_sp), 1, 0)).reshape((k, c_out))
  return patches, kernel, dn.out_spec


def _to_layout(out, out_spec):
  """``out`` (N, *spatial, C) in the layout ``out_spec`` (batch, feature, spatial...)."""
  nd = out.ndim
  perm = [0] * nd
  perm[out_spec[0]] = 0
  perm[out_spec[1]] = nd - 1
  for i, pos in enumerate(out_spec[2:]):
    perm[pos] = 1 + i
  return jnp.transpose(out, perm)


def quantized_conv_general_dilated_with_state(
    lhs: jax.Array, rhs: jax.Array, window_strides: Sequence[int],
    padding: str | Sequence[tuple[int, int]],
    lhs_dilation: Sequence[int] | None = None, rhs_dilation: Sequence[int] | None = None,
    dimension_numbers: Any = None, feature_group_count: int = 1,
    batch_group_count: int = 1, precision: Any = None,
    preferred_element_type: Any = None, *, recipe: str | recipes_lib.Recipe,
    state: qdot.State, key: jax.Array | None = None
) -> tuple[jax.Array, dict[str, telemetry_lib.OperandTelemetry]]:
  """:func:`quantized_conv_general_dilated` with a call site's qdot state.

  ``state`` is from :func:`numerics.qdot.init_state` (delayed-scaling histories,
  telemetry probes); returns ``(output, forward telemetry)`` as
  :func:`numerics.qdot.quantized_dot_general_with_state` does, whose gradient w.r.t.
  ``state`` is the next state.
  """
  _check(lhs, rhs, feature_group_count, batch_group_count)
  patches, kernel, out_spec = _as_gemm(lhs, rhs, window_strides, padding, lhs_dilation,
                                       rhs_dilation, dimension_numbers)
  dn = (((patches.ndim - 1,), (0,)), ((), ()))
  out, telemetry = qdot.quantized_dot_general_with_state(
      patches, kernel, dn, recipe, state, key=key, precision=precision,
      preferred_element_type=preferred_element_type)
  return _to_layout(out, out_spec), telemetry


def quantized_conv_general_dilated(
    lhs: jax.Array, rhs: jax.Array, window_strides: Sequence[int],
    padding: str | Sequence[tuple[int, int]],
    lhs_dilation: Sequence[int] | None = None, rhs_dilation: Sequence[int] | None = None,
    dimension_numbers: Any = None, feature_group_count: int = 1,
    batch_group_count: int = 1, precision: Any = None,
    preferred_element_type: Any = None, *, recipe: str | recipes_lib.Recipe,
    key: jax.Array | None = None) -> jax.Array:
  """``lax.conv_general_dilated`` with its im2col GEMM quantized by ``recipe``.

  Arguments as ``lax.conv_general_dilated`` (any layout in ``dimension_numbers``,
  strides, padding, dilations; no grouping), plus the :mod:`numerics.recipes` recipe
  and, for recipes that draw random numbers, ``key``. The output has the convolution's
  shape and layout; its dtype follows :func:`numerics.qdot.quantized_dot_general`.
  Gradient: the recipe's dgrad and wgrad GEMMs (see the module docstring); recipes
  with delayed scaling need :func:`quantized_conv_general_dilated_with_state`.
  """
  r = recipes_lib.get(recipe)
  if r.delayed_operands:
    raise ValueError(f"recipe {r.name!r} uses delayed scaling, whose state this function "
                     f"cannot carry: use quantized_conv_general_dilated_with_state")
  return quantized_conv_general_dilated_with_state(
      lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
      feature_group_count, batch_group_count, precision, preferred_element_type,
      recipe=r, state=qdot.State(), key=key)[0]
