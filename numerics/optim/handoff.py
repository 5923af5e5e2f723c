"""``handoff(first, second, switch_step)``: one transform that runs ``first``, then ``second``.

Both states live in one pytree (:class:`HandoffState`) from ``init`` on, and the phase
is chosen with ``lax.cond`` on the step count, so a jitted train step compiles once and
does not retrace at the switch; only the taken branch runs (so a SAM ``second`` costs its
extra gradient evaluation only after the switch, outside ``vmap``).

- Steps ``0 .. switch_step - 1``: ``first.update``; ``second``'s state stays at its init.
- Step ``switch_step``: ``second_state <- transfer(first_state, second_state, params)``
  once, then ``second.update``; from then on only ``second`` runs. ``second``'s own
  count, and so its learning-rate schedule, starts at 0 at the switch.

Extra keyword arguments (e.g. SAM's ``grad_fn``) are forwarded to both phases
(transforms that take none ignore them).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Union

import jax
import jax.numpy as jnp
import optax

from lowprec.numerics.optim.muon import MuonState

Transfer = Callable[[Any, Any, Any], Any]


class HandoffState(NamedTuple):
  """``count`` int32[] (total steps); both phases' states."""

  count: jax.Array
  first_state: Any
  second_state: Any


def no_transfer(first_state: Any, second_state: Any, params: Any) -> Any:
  """``second`` starts from its freshly initialised state."""
  del first_state, params
  return second_state


def _is_buffer_state(x) -> bool:
  return isinstance(x, (optax.TraceState, MuonState))


def _find_trace(state: Any) -> optax.TraceState | None:
  found = [s for s in jax.tree.leaves(state, is_leaf=_is_buffer_state)
           if isinstance(s, optax.TraceState)]
  if len(found) > 1:
    raise ValueError(f"first_state holds {len(found)} TraceStates; momentum_transfer needs "
                     "exactly one (write a custom transfer)")
  return found[0] if found else None


def momentum_transfer(first_state: Any, second_state: Any, params: Any) -> Any:
  """Temperon's ``transfer="momentum"``: a raw copy of ``first``'s momentum-SGD buffer
  (its single ``optax.TraceState``) into every momentum buffer of ``second``
  (:class:`MuonState.momentum` and fallback ``TraceState.trace``), leaf by leaf.

  Valid because both accumulate ``buf = mu * buf + g`` and Muon orthogonalises at update
  time, not in the buffer. Leaves ``second`` does not own (``optax.MaskedNode`` under
  ``optax.partition``) stay masked. Raises if ``first`` has no momentum buffer.
  """
  del params
  trace = _find_trace(first_state)
  if trace is None:
    raise ValueError("momentum_transfer: first_state has no optax.TraceState")
  source = trace.trace

  def copy_into(buffer):
    is_masked = lambda x: isinstance(x, optax.MaskedNode)
    return jax.tree.map(lambda dst, src: dst if is_masked(dst) else src.astype(dst.dtype),
                        buffer, source, is_leaf=is_masked)

  def visit(s):
    if isinstance(s, MuonState):
      return s._replace(momentum=copy_into(s.momentum))
    if isinstance(s, optax.TraceState):
      return s._replace(trace=copy_into(s.trace))
    return s

  return jax.tree.map(visit, second_state, is_leaf=_is_buffer_state)


TRANSFERS: dict[str, Transfer] = {"none": no_transfer, "momentum": momentum_transfer}


def handoff(first: optax.GradientTransformation, second: optax.GradientTransformation,
            switch_step: int, transfer: Union[str, Transfer] = "none"
            ) -> optax.GradientTransformationExtraArgs:
  """Runs ``first`` for ``switch_step`` steps, then ``second`` (see the module docstring).

  ``transfer``: ``"none"``, ``"momentum"`` (:func:`momentum_transfer`) or a callable
  ``(first_state, second_state, params) -> second_state`` returning the same tree
  structure, shapes and dtypes as ``second_state``. Under ``optax.inject_hyperparams``
  pass ``static_args=("transfer",)`` when it is a callable.
  """
  if isinstance(switch_step, int) and switch_step < 0:
    raise ValueError(f"switch_step must be >= 0, got {switch_step}")
  if isinstance(transfer, str):
    if transfer not in TRANSFERS:
      raise ValueError(f"transfer must be one of {sorted(TRANSFERS)} or a callable, "
                       f"got {transfer!r}")
    transfer = TRANSFERS[transfer]
  if not callable(transfer):
    raise TypeError(f"transfer must be a string or callable, got {type(transfer)}")
  first = optax.with_extra_args_support(first)
  second = optax.with_extra_args_support(second)

  def init(params):
    return HandoffState(jnp.zeros((), jnp.int32), first.init(params), second.init(params))

  def update(updates, state, params=None, **extra_args):
    count = state.count

    def run_first():
      new_updates, s1 = first.update(updates, state.first_state, params, **extra_args)
      return new_updates, s1, state.second_state

    def run_second():
      moved = transfer(state.first_state, state.second_state, params)
      if jax.tree.structure(moved) != jax.tree.structure(state.second_state):
        raise ValueError("transfer changed the structure of second's state: "
                         f"{jax.tree.structure(moved)} vs "
                         f"{jax.tree.structure(state.second_state)}")
      s2 = jax.tree.map(lambda m, s: jnp.where(count == switch_step, m, s).astype(s.dtype),
                        moved, state.second_state)
      new_updates, s2 = second.update(updates, s2, params, **extra_args)
      return new_updates, state.first_state, s2

    new_updates, s1, s2 = jax.lax.cond(count < switch_step, run_first, run_second)
    return new_updates, HandoffState(count + 1, s1, s2)

  return optax.GradientTransformationExtraArgs(init, update)


def in_second_phase(state: HandoffState, switch_step: int) -> jax.Array:
  """bool[]: whether the NEXT update runs ``second`` (for logging a phase scalar)."""
  return state.count >= switch_step
