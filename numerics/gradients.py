"""The gradient policy of the public quantizers: straight-through, or none at all.

Rounding has derivative zero almost everywhere, so autodiff through the integer ops of
a quantizer silently gives an all-zero gradient. Every public function therefore states
one of two policies, and implements it here:

* straight-through (:func:`straight_through`): the gradient w.r.t. the input is the
  cotangent itself, cast to the input's dtype (also where the value saturated), as for
  ``x.astype(dtype)``. Functions that return values (``cast``,
  ``quantize_dequantize_mx``, ``quantizer.quantize_dequantize``, ``fake_quant``).
* not differentiable (:func:`not_differentiable`): differentiating raises a
  ``TypeError`` naming the function and the straight-through alternative. Functions
  that return integer codes (``quantize_mx``, ``quantize_nvfp4``): their codes have no
  gradient, and a zero one would be a silent wrong answer.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp


def straight_through(fn: Callable[..., jax.Array], x: jax.Array, *operands: Any
                     ) -> jax.Array:
  """``fn(x, *operands)`` whose gradient w.r.t. ``x`` is the identity.

  ``operands`` (e.g. a PRNG key) get no gradient. ``fn`` must return an array of
  ``x``'s shape.
  """
  return _ste(fn, x, operands)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ste(fn, x, operands):
  return fn(x, *operands)


def _ste_fwd(fn, x, operands):
  return _ste(fn, x, operands), jnp.zeros((), x.dtype)  # only x's dtype is needed


def _ste_bwd(fn, dtype_of_x, g):
  del fn
  return g.astype(dtype_of_x.dtype), None


_ste.defvjp(_ste_fwd, _ste_bwd)


def not_differentiable(fn: Callable[..., Any], name: str, alternative: str, *,
                       message: str | None = None) -> Callable[..., Any]:
  """``fn(x, *operands)`` that raises ``TypeError`` when differentiated w.r.t. ``x``.

  ``name`` is the public function's name and ``alternative`` what to use instead; both
  go into the message (or ``message``, when given, is the whole message). Calls that
  do not differentiate ``x`` run ``fn`` unchanged.
  """
  if message is None:
    message = (f"{name} has no gradient (it returns integer codes); for a "
               f"straight-through gradient use {alternative}")

  @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
  def call(fn, x, operands):
    return fn(x, *operands)

  def fwd(fn, x, operands):
    raise TypeError(message)

  def bwd(fn, res, g):  # never reached: fwd raises
    raise AssertionError

  call.defvjp(fwd, bwd)
  return lambda x, *operands: call(fn, x, operands)
