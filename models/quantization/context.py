"""The state of a quantized model's call, and how one intercepted op runs.

:class:`Config` holds a quantized model's rules and options; :class:`Context` is the
state of one call in one thread (the module stack the front ends keep, per-module op
counters, and the flags that let the library's own contractions pass through);
:func:`handle` runs one intercepted op: it finds the issuing module and the first rule
matching its path and kind, records it (:mod:`.recording`), and runs the original or
the recipe's quantized op with the op's key, delayed-scaling state and telemetry.
:mod:`.interception` replaces JAX's contraction functions with ops that call
:func:`handle`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import warnings
from typing import Any, Callable, Iterator

from flax import linen as nn
from flax import nnx

from lowprec.numerics import qdot
from lowprec.numerics import recipes as recipes_lib
from lowprec.models.quantization import recording
from lowprec.models.quantization.rules import OPS, Rule

OVERWRITE = "_overwrite_with_gradient"  # flax.linen.fp8_ops.OVERWRITE_WITH_GRADIENT
NUMERICS = "numerics"
RNG_STREAM = "quant"
UNUSED_RULES = ("warn", "raise", "ignore")


@dataclasses.dataclass(frozen=True)
class Config:
  """How a quantized model runs: its rules and options (see ``quantize_model``).

  ``caught`` collects the ids of the rules that matched an op in any call so far (the
  unused-rule check reads it); it is the one mutable part, and per model.
  """

  rules: tuple[Rule, ...]
  telemetry: bool
  rng_stream: str
  unused_rules: str = "warn"  # one of UNUSED_RULES
  caught: set = dataclasses.field(default_factory=set, compare=False, repr=False)


class Context:
  """The interception state of one call of a quantized model (one thread)."""

  def __init__(self, config: Config, top: Any, top_path: tuple[str, ...], kind: str):
    self.config = config
    self.kind = kind  # "linen" or "nnx"
    self.top_path = top_path
    self.stack: list[tuple[Any, str]] = [(top, "")]
    # id(scope or module) -> (that object, op kind -> ops issued so far)
    self.counts: dict[int, tuple[Any, dict[str, int]]] = {}
    self.busy = False  # inside a handler: the library's own matmuls pass through
    self.attention = False  # inside a decomposed jax.nn.dot_product_attention

  def path_of_linen(self, module: nn.Module) -> str:
    path = tuple(module.path)
    return "/".join(str(p) for p in path[len(self.top_path):])

  def next_op_id(self, module: Any, op: str) -> str:
    owner = module.scope if self.kind == "linen" else module
    # The owner is held with its counts: were it freed during the call (flax frees
    # scopes at garbage collection), a new one could get its id() and count on from it.
    _, counts = self.counts.setdefault(id(owner), (owner, {}))
    n = counts.get(op, 0)
    counts[op] = n + 1
    return f"{op}_{n}"


_local = threading.local()


def active() -> Context | None:
  return getattr(_local, "context", None)


ROOT = 'the root module (rule path "")'


def where(path: str, op_id: str | None = None) -> str:
  """A module (and op) as messages name it: its rule path, the root spelled out (a
  rule for the root module matches ``""``)."""
  if op_id is None:
    return path or ROOT
  return f"{path}/{op_id}" if path else f"{op_id} of {ROOT}"


def describe(config: Config, rule: Rule) -> str:
  """``rules[i] 'path'`` (and its ops when it has not all of them): two rules with the
  same path regex read apart in plans and messages."""
  ops = "" if set(rule.ops) == set(OPS) else f" (ops: {', '.join(rule.ops)})"
  return f"rules[{_index(config, rule)}] {rule.module_path!r}{ops}"


def _index(config: Config, rule: Rule) -> int:
  return next(i for i, r in enumerate(config.rules) if r is rule)


def check_unused(config: Config) -> None:
  unused = [r for r in config.rules if r.required and id(r) not in config.caught]
  if not unused or config.unused_rules == "ignore":
    return
  names = ", ".join(f"rules[{_index(config, r)}] = Rule({r.module_path!r}, "
                    f"{r.recipe_name!r}, ops={r.ops})" for r in unused)
  message = (f"quantize_model: {names} matched no op of the model in its calls so far "
             f"(a typo in a module path? lowprec.models.quantization.recording() lists "
             f"the paths and op kinds the model issues)")
  if config.unused_rules == "raise":
    raise ValueError(message)
  warnings.warn(message, stacklevel=4)


@contextlib.contextmanager
def passthrough(ctx: Context) -> Iterator[None]:
  busy, ctx.busy = ctx.busy, True
  try:
    yield
  finally:
    ctx.busy = busy


def current(ctx: Context) -> tuple[Any, str]:
  module, path = ctx.stack[-1]
  if ctx.kind == "linen" and module is not ctx.stack[0][0]:
    path = ctx.path_of_linen(module)
  return module, path


def rule_for(ctx: Context, path: str, kind: str) -> Rule | None:
  for rule in ctx.config.rules:
    if rule.matches(path, kind):
      return rule
  return None


def _make_key(ctx: Context, module: Any, rule: Rule, path: str, op_id: str):
  stream = ctx.config.rng_stream
  if ctx.kind == "linen":
    try:
      return module.make_rng(stream)
    except Exception as e:  # flax raises InvalidRngError (its message names the stream)
      raise ValueError(
          f"{where(path, op_id)}: {describe(ctx.config, rule)} uses recipe "
          f"{rule.recipe_name!r}, which draws random numbers; pass rngs={{'{stream}': key}}"
          f" to init and apply ({type(e).__name__}: {e})") from None
  rngs = getattr(ctx.stack[0][0], "quant_rngs", None)
  if rngs is None or stream not in rngs:
    raise ValueError(f"{where(path, op_id)}: recipe {rule.recipe_name!r} draws "
                     f"random numbers; give quantize_model rngs=nnx.Rngs({stream}=...)")
  return rngs[stream]()


def _state(ctx: Context, module: Any, path: str, op_id: str, recipe: recipes_lib.Recipe
           ) -> qdot.State:
  """The op's qdot state: delayed-scaling histories and backward telemetry probes."""
  telemetry = ctx.config.telemetry and recipe.quantized
  if not (recipe.delayed_operands or telemetry):
    return qdot.State()
  if ctx.kind == "nnx":
    if recipe.delayed_operands:
      raise ValueError(f"{where(path, op_id)}: recipe {recipe.name!r} uses delayed "
                       f"scaling, whose state needs a linen model (collection "
                       f"{OVERWRITE!r}) or lowprec.numerics.qdot."
                       f"quantized_dot_general_with_state")
    return qdot.init_state(recipe, telemetry=True)
  scope = module.scope
  if scope.has_variable(OVERWRITE, op_id):
    return scope.get_variable(OVERWRITE, op_id)
  state = qdot.init_state(recipe, telemetry=telemetry)
  if scope.is_mutable_collection(OVERWRITE):
    scope.put_variable(OVERWRITE, op_id, state)
  elif recipe.delayed_operands:
    raise ValueError(f"{where(path, op_id)}: the delayed-scaling state of recipe "
                     f"{recipe.name!r} is missing: pass the {OVERWRITE!r} collection "
                     f"that init created to apply")
  return state


def _sow(ctx: Context, module: Any, op_id: str, telemetry: dict) -> None:
  if not telemetry:
    return
  stats = {slot.replace("/", "_"): t._asdict() for slot, t in telemetry.items()}
  if ctx.kind == "linen":
    if module.is_mutable_collection(NUMERICS):
      module.sow(NUMERICS, op_id, stats)
  else:
    module.sow(nnx.Intermediate, f"numerics_{op_id}", stats)


def reason(config: Config, rule: Rule | None) -> str:
  if rule is None:
    return "as written: no rule matched"
  if rule.recipe is None:
    return f"as written: {describe(config, rule)} keeps it"
  return f"{rule.recipe_name}: {describe(config, rule)}"


def _decide(ctx: Context, op: str, kind: str) -> tuple[Any, str, str, Rule | None]:
  """The op's module, path, id and rule (marked as having matched an op)."""
  module, path = current(ctx)
  op_id = ctx.next_op_id(module, op)
  rule = rule_for(ctx, path, kind)
  if rule is not None:
    ctx.config.caught.add(id(rule))
  return module, path, op_id, rule


def handle(op: str, kind: str, lhs_shape, rhs_shape, call_original: Callable[[], Any],
           call_quantized: Callable[..., tuple[Any, dict]], key=None,
           check: Callable[[str, str], None] | None = None):
  """Runs one intercepted op per its rule (see the module docstring). ``check(rule,
  where)`` may refuse the op under a quantizing rule (both are named as messages
  name them)."""
  ctx = active()
  module, path, op_id, rule = _decide(ctx, op, kind)
  recording.record(recording.OpRecord(path, op_id, rule, tuple(lhs_shape),
                                      tuple(rhs_shape), kind, reason(ctx.config, rule)))
  if rule is None or rule.recipe is None:
    with passthrough(ctx):
      return call_original()
  if check is not None:
    check(describe(ctx.config, rule), where(path, op_id))
  recipe = recipes_lib.get(rule.recipe)
  if key is None and recipe.needs_key:
    key = _make_key(ctx, module, rule, path, op_id)
  state = _state(ctx, module, path, op_id, recipe)
  with passthrough(ctx):
    out, telemetry = call_quantized(recipe, state, key)
  _sow(ctx, module, op_id, telemetry)
  return out


def as_written(op: str, kind: str, lhs_shape, rhs_shape, call_original: Callable[[], Any],
               why: str, stacklevel: int = 2):
  """Runs an intercepted op that has no contraction to quantize (``jnp.outer``, a
  product with a scalar) as written, recorded with ``why``; a rule that asks for a
  recipe warns (the op is not silently left out of the plan)."""
  ctx = active()
  _, path, op_id, rule = _decide(ctx, op, kind)
  text = reason(ctx.config, rule)
  if rule is not None and rule.recipe is not None:
    text = f"as written: {why} ({describe(ctx.config, rule)} asks for {rule.recipe_name})"
    warnings.warn(f"{where(path, op_id)}: {why}, so it runs as written, not in "
                  f"{rule.recipe_name} as {describe(ctx.config, rule)} asks (a rule with "
                  f"recipe=None for its module says so and silences this)",
                  stacklevel=stacklevel + 1)
  recording.record(recording.OpRecord(path, op_id, rule, tuple(lhs_shape),
                                      tuple(rhs_shape), kind, text))
  with passthrough(ctx):
    return call_original()


def set_active(context: Context | None) -> Context | None:
  """Makes ``context`` this thread's (None: none); returns the one it replaces."""
  previous = active()
  _local.context = context
  return previous
