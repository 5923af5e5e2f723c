"""The state of a quantized ``dot_general`` call site: delayed scaling and telemetry.

:func:`numerics.qdot.quantized_dot_general_with_state` carries a :class:`State` per call
site (:func:`init_state`): ``State(delayed, telemetry)``, each an :class:`OperandSlots`
(one field per operand of the three GEMMs: ``forward_lhs`` ... ``wgrad_rhs``) or None.
``delayed`` holds a :class:`numerics.delayed_scaling.DelayedScalingState` for each of
the recipe's delayed-scaling operands; ``telemetry`` (with ``telemetry=True``) an
:class:`numerics.telemetry.OperandTelemetry` for each quantized operand of the backward
GEMMs. Both can be updated only once the backward pass ran, so the next state comes
back as the state's cotangent (:func:`next_state`; Flax's ``_overwrite_with_gradient``
convention). Fields the recipe does not use are None (empty pytree nodes).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
from jax import lax

from lowprec.numerics import delayed_scaling
from lowprec.numerics import random_bits
from lowprec.numerics import recipes as recipes_lib
from lowprec.numerics import telemetry as telemetry_lib


class OperandSlots(NamedTuple):
  """One entry per operand of a call site's forward, dgrad and wgrad GEMMs; None for an
  operand that has none (unquantized, not delayed, or a forward operand's telemetry,
  which the call returns instead)."""
  forward_lhs: Any = None
  forward_rhs: Any = None
  dgrad_lhs: Any = None
  dgrad_rhs: Any = None
  wgrad_lhs: Any = None
  wgrad_rhs: Any = None

  def items(self) -> tuple[tuple[str, Any], ...]:
    """``(field, value)`` of the operands that have an entry."""
    return tuple((k, v) for k, v in zip(self._fields, self) if v is not None)


class State(NamedTuple):
  """A call site's state (:func:`init_state`): delayed-scaling histories and the
  backward GEMMs' telemetry, each None when the recipe or call keeps none."""
  delayed: OperandSlots | None = None
  telemetry: OperandSlots | None = None


def slot(name: str) -> str:
  """The :class:`OperandSlots` field of the operand ``"<gemm>/<side>"``:
  ``slot("dgrad/lhs")`` is ``"dgrad_lhs"``."""
  return name.replace("/", "_")


def operand_name(field: str) -> str:
  """The inverse of :func:`slot`: ``"dgrad/lhs"`` for ``"dgrad_lhs"``, the operand's key
  in the returned telemetry and in ``Recipe.delayed_operands``."""
  return field.replace("_", "/")


def as_state(state: Any) -> State:
  """``state`` if it is a :class:`State` (from :func:`init_state`); anything else
  raises, naming what it got."""
  if isinstance(state, State):
    return state
  got = (f"a dict with keys {sorted(state)}" if isinstance(state, dict)
         else type(state).__name__)
  raise ValueError(f"state must be a qdot.State from init_state, got {got}")


def excess_axes(value, like) -> tuple[str, ...]:
  """Manual mesh axes (mesh order) ``value`` varies over and ``like`` does not."""
  have = set(random_bits.varying_manual_axes(like))
  return tuple(a for a in random_bits.varying_manual_axes(value) if a not in have)


def next_state(recipe: recipes_lib.Recipe, state: State, amaxes: dict, tel: dict,
               api: str) -> State:
  """The state's cotangent: the next delayed states and the backward telemetry.

  ``amaxes`` and ``tel`` are keyed ``"<gemm>/<side>"`` (as the forward telemetry the
  call returns). Inside ``shard_map`` an operand's amax is its shard's; where the state
  is replicated over mesh axes the operand varies over, the amax is maximized over them
  first (``lax.pmax``), so the next state is that of the whole operand, as Transformer
  Engine reduces amaxes over its group.
  """
  delayed = telemetry = None
  if state.delayed is not None:
    nxt = {}
    for field, s in state.delayed.items():
      name = operand_name(field)
      gemm, side = name.split("/")
      op = getattr(getattr(recipe, gemm), side)
      amax = amaxes[name]
      axes = excess_axes(amax, s.scale)
      if axes:
        amax = lax.pmax(amax, axes)
      nxt[field] = delayed_scaling.next_state(
          s, amax, op.fmt, amax_compute_algo=op.amax_compute_algo, margin=op.margin)
    delayed = OperandSlots(**nxt)
  if state.telemetry is not None:
    nxt = {}
    for field, like in state.telemetry.items():
      name = operand_name(field)
      axes = excess_axes(tel[name].sqnr_db, like.sqnr_db)
      if axes:
        raise ValueError(
            f"{api}: the backward telemetry of {name!r} is per shard (its operand "
            f"varies over the mesh axes {axes} inside shard_map) but the state holding "
            f"it is replicated over them, and an SQNR has no exact reduction across "
            f"shards; build the state with init_state(recipe) and no telemetry, or "
            f"take telemetry outside shard_map")
      nxt[field] = tel[name]
    telemetry = OperandSlots(**nxt)
  return State(delayed, telemetry)


def _operand_slots(recipe: recipes_lib.Recipe) -> tuple[tuple[str, str], ...]:
  """(gemm name, side) of every operand a recipe quantizes, in forward/dgrad/wgrad
  order (dgrad's weight is left out when it reuses the forward-quantized one)."""
  out = []
  for name, g in zip(recipes_lib.GEMM_NAMES, recipe.gemms):
    for side in ("lhs", "rhs"):
      if getattr(g, side) is None:
        continue
      if name == "dgrad" and side == "rhs" and recipe.reuse_forward_weight:
        continue
      out.append((name, side))
  return tuple(out)


def init_state(recipe: str | recipes_lib.Recipe, *, telemetry: bool = False) -> State:
  """The initial :class:`State` of one
  :func:`numerics.qdot.quantized_dot_general_with_state` call site.

  ``delayed``: a :class:`numerics.delayed_scaling.DelayedScalingState` (zero history,
  scale 1) for each of the recipe's delayed-scaling operands, None without any.
  ``telemetry`` (with ``telemetry=True``): zero
  :class:`numerics.telemetry.OperandTelemetry` for the quantized operands of the
  backward GEMMs, whose telemetry comes back as the state's gradient; None otherwise.
  """
  r = recipes_lib.get(recipe)
  delayed = tel = None
  if r.delayed_operands:
    fields = {}
    for name in r.delayed_operands:
      gemm, side = name.split("/")
      op = getattr(getattr(r, gemm), side)
      fields[slot(name)] = delayed_scaling.init_state(op.amax_history_len)
    delayed = OperandSlots(**fields)
  if telemetry:
    tel = OperandSlots(**{slot(f"{g}/{s}"): telemetry_lib.zeros()
                          for g, s in _operand_slots(r) if g != "forward"})
  return State(delayed, tel)


def check_state(r: recipes_lib.Recipe, state: State) -> None:
  """Raises unless ``state`` (a :class:`State`) holds exactly ``r``'s delayed-scaling
  operands."""
  have = sorted(operand_name(k) for k, _ in
                (state.delayed.items() if state.delayed is not None else ()))
  if have != sorted(r.delayed_operands):
    raise ValueError(f"recipe {r.name!r} has delayed-scaling operands "
                     f"{sorted(r.delayed_operands)}, the state holds {have}: build "
                     f"it with init_state(recipe)")
