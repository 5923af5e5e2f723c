"""SAM (Foret et al. 2021) around any optax transform, with the second pass explicit.

Protocol: ``update(grads, state, params, grad_fn=grad_fn)``. ``grads`` is the gradient
at ``params``; ``grad_fn(p) -> grads at p`` is a pure function the caller closes over
the same batch and PRNG key (so both passes see the same data). The transform:

1. ``e = rho_t * g / (||g||_2 + eps)`` with the global L2 norm over all leaves
   (``eps`` keeps an all-zero gradient at ``e = 0``, not NaN);
2. ``g' = grad_fn(params + e)``;
3. returns ``inner.update(g', inner_state, params)`` (the step is taken from ``params``,
   not from the perturbed point).

``rho`` may be a schedule of SAM's own step count (e.g. a ramp from 0). One ``update``
is one outer step: schedules inside ``inner`` count outer steps, and there are exactly
two gradient evaluations per step (the caller's and ``grad_fn``'s).

``active`` (optional) is a predicate of the same count: on steps where it is false the
step is ``inner.update(grads, ...)`` and ``grad_fn`` is not run (``lax.cond``; one
gradient evaluation), which gives late-phase SAM (``count >= start``) and periodic SAM
(a fixed share of the steps) in one compiled step.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax


class SAMState(NamedTuple):
  """``count`` int32[] (outer steps); ``inner_state`` the wrapped transform's state."""

  count: jax.Array
  inner_state: Any


def perturbation(grads: Any, rho: jax.Array, eps: float = 1e-12) -> Any:
  """``rho * g / (||g||_2 + eps)`` over the whole tree (zero for a zero gradient)."""
  norm = optax.tree.norm(grads)
  scale = rho / (norm + eps)
  return jax.tree.map(lambda g: (scale * g).astype(g.dtype), grads)


def sam(inner: optax.GradientTransformation, rho: optax.ScalarOrSchedule = 0.05, *,
        eps: float = 1e-12, active: Callable[[jax.Array], Any] | None = None
        ) -> optax.GradientTransformationExtraArgs:
  """Wraps ``inner`` in the two-pass SAM step; ``update`` requires ``params`` and
  ``grad_fn`` (see the module docstring). Extra keyword arguments other than
  ``grad_fn`` are forwarded to ``inner``. ``active(count) -> bool`` (default: always)
  chooses the steps that take the second pass."""
  if not isinstance(inner, optax.GradientTransformation):
    raise TypeError(f"inner must be an optax GradientTransformation, got {type(inner)}")
  if isinstance(rho, (int, float)) and rho < 0:
    raise ValueError(f"rho must be >= 0, got {rho}")
  if active is not None and not callable(active):
    raise TypeError(f"active must be a callable of the step count, got {type(active)}")
  inner = optax.with_extra_args_support(inner)

  def init(params):
    return SAMState(jnp.zeros((), jnp.int32), inner.init(params))

  def update(updates, state, params=None, *, grad_fn=None, **extra_args):
    if params is None:
      raise ValueError("sam needs params (the point to perturb)")
    if grad_fn is None or not callable(grad_fn):
      raise ValueError("sam needs grad_fn=callable(params) -> grads for its second pass")
    rho_t = rho(state.count) if callable(rho) else rho

    def second_pass():
      e = perturbation(updates, jnp.asarray(rho_t, jnp.float32), eps)
      perturbed = jax.tree.map(lambda p, d: p + d.astype(p.dtype), params, e)
      return grad_fn(perturbed)

    if active is None:
      sam_grads = second_pass()
    else:
      sam_grads = jax.lax.cond(jnp.asarray(active(state.count), bool), second_pass,
                               lambda: updates)
    new_updates, inner_state = inner.update(sam_grads, state.inner_state, params,
                                            **extra_args)
    return new_updates, SAMState(state.count + 1, inner_state)

  return optax.GradientTransformationExtraArgs(init, update)
