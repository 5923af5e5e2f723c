"""The state of a quantized ``dot_general`` call site: delayed scaling and telemetry.

:func:`numerics.qdot.quantized_dot_general_with_state` carries a ``state`` pytree per
call site (:func:`init_state`): ``{"delayed": {"<gemm>/<side>": DelayedScalingState}}``
for the recipe's delayed-scaling operands (:mod:`numerics.delayed_scaling`) and, with
telemetry, ``{"telemetry": {"<gemm>/<side>": OperandTelemetry}}`` for the backward
GEMMs' quantized operands (:mod:`numerics.telemetry`). Both can be updated only once
the backward pass ran, so the next state comes back as the state's cotangent
(:func:`next_state`; Flax's ``_overwrite_with_gradient`` convention).
"""

from __future__ import annotations

from typing import Any

from jax import lax

from lowprec.numerics import delayed_scaling
from lowprec.numerics import random_bits
from lowprec.numerics import recipes as recipes_lib
from lowprec.numerics import telemetry as telemetry_lib

State = dict[str, Any]


def excess_axes(value, like) -> tuple[str, ...]:
  """Manual mesh axes (mesh order) ``value`` varies over and ``like`` does not."""
  have = set(random_bits.varying_manual_axes(like))
  return tuple(a for a in random_bits.varying_manual_axes(value) if a not in have)


def next_state(recipe: recipes_lib.Recipe, state: State, amaxes: dict, tel: dict,
                api: str) -> State:
  """The state's cotangent: the next delayed states and the backward telemetry.

  Inside ``shard_map`` an operand's amax is its shard's; where the state is replicated
  over mesh axes the operand varies over, the amax is maximized over them first
  (``lax.pmax``), so the next state is that of the whole operand, as Transformer
  Engine reduces amaxes over its group.
  """
  out = {}
  if "delayed" in state:
    out["delayed"] = {}
    for slot, s in state["delayed"].items():
      gemm, side = slot.split("/")
      op = getattr(getattr(recipe, gemm), side)
      amax = amaxes[slot]
      axes = excess_axes(amax, s.scale)
      if axes:
        amax = lax.pmax(amax, axes)
      out["delayed"][slot] = delayed_scaling.next_state(
          s, amax, op.fmt, amax_compute_algo=op.amax_compute_algo,
          margin=op.margin)
  if "telemetry" in state:
    out["telemetry"] = {}
    for slot, like in state["telemetry"].items():
      axes = excess_axes(tel[slot].sqnr_db, like.sqnr_db)
      if axes:
        raise ValueError(
            f"{api}: the backward telemetry of {slot!r} is per shard (its operand "
            f"varies over the mesh axes {axes} inside shard_map) but the state holding "
            f"it is replicated over them, and an SQNR has no exact reduction across "
            f"shards; build the state with init_state(recipe) and no telemetry, or "
            f"take telemetry outside shard_map")
      out["telemetry"][slot] = tel[slot]
  return out


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
  """The initial state of one :func:`numerics.qdot.quantized_dot_general_with_state` call
  site.

  ``{"delayed": {"<gemm>/<side>": DelayedScalingState}}`` for the recipe's
  delayed-scaling operands (zero histories, scale 1) and, with ``telemetry``,
  ``{"telemetry": {"<gemm>/<side>": OperandTelemetry}}`` zeros for the quantized
  operands of the backward GEMMs (their telemetry comes back as the state's gradient).
  """
  r = recipes_lib.get(recipe)
  state: State = {}
  if r.delayed_operands:
    state["delayed"] = {}
    for slot in r.delayed_operands:
      gemm, side = slot.split("/")
      op = getattr(getattr(r, gemm), side)
      state["delayed"][slot] = delayed_scaling.init_state(op.amax_history_len)
  if telemetry:
    state["telemetry"] = {f"{g}/{s}": telemetry_lib.zeros()
                          for g, s in _operand_slots(r) if g != "forward"}
  return state


def check_state(r: recipes_lib.Recipe, state: State) -> None:
  if not isinstance(state, dict) or set(state) - {"delayed", "telemetry"}:
    raise ValueError(f"state must be a dict from init_state, got {type(state).__name__} "
                     f"with keys {sorted(state) if isinstance(state, dict) else ''}")
  have = tuple(sorted(state.get("delayed", {})))
  if have != tuple(sorted(r.delayed_operands)):
    raise ValueError(f"recipe {r.name!r} has delayed-scaling operands "
                     f"{sorted(r.delayed_operands)}, the state holds {list(have)}: build "
                     f"it with init_state(recipe)")
