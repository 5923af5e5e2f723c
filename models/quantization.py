"""Quantize a Flax model you did not write: rules on module paths, intercepted matmuls.

    qmodel = models.quantize_model(model, [
        models.Rule("head", "bf16"),     # the first matching rule wins
        models.Rule(".*", "mxfp8"),      # every other matmul in MXFP8
    ])

:func:`quantize_model` returns a copy of a Flax linen or NNX model whose ``__call__``
(or the ``methods`` named) runs every ``lax.dot_general`` and ``jnp.einsum`` issued
inside a module whose path matches a :class:`Rule` through
:func:`numerics.qdot.quantized_dot_general` with that rule's recipe. A module's path is
its name path below the quantized model, joined by ``/`` (``"block_0/qkv"``; ``""`` for
the model itself; NNX: the attribute path, list indices included); ``Rule.module_path``
is a regular expression that must match the whole path. Ops that no rule matches, and
ops whose rule has ``recipe=None``, run exactly as the model wrote them. Parameters are
untouched: the quantized model's variables are the plain model's (plus the collections
below).

How: while the quantized model runs, ``jax.lax.dot_general`` and ``jax.numpy.einsum``
are replaced (for the calling thread only) by functions that look up the current module
and its rule. Linen modules are tracked with ``flax.linen.intercept_methods``; NNX
modules of the copy are given a tracked ``__call__``, and NNX layers that hold
``lax.dot_general``/``jnp.einsum`` as attributes (``nnx.Linear``, ``nnx.Einsum``) get
the intercepting functions instead. Limits: ``x @ w``, ``jnp.matmul`` and ``jnp.dot`` are
not intercepted; an einsum of more than two operands under a quantizing rule raises, and
so does the fused ``jax.nn.dot_product_attention`` (``nnx.MultiHeadAttention`` uses it
when it has no dropout): give such modules a ``recipe=None`` rule; a
function compiled with ``jax.jit`` *inside* the model is intercepted as it was first
traced (jit caches do not know about the interception), so keep such functions out of
quantized modules or give them a ``recipe=None`` rule. :func:`recording` lists the ops
each rule caught.

Randomness (stochastic rounding, Hadamard transforms): linen ops draw their key with
``module.make_rng("quant")`` in the module that issues the op, so pass
``rngs={"quant": key}`` to ``init`` and ``apply``; NNX ops draw from the ``quant`` stream
of the ``rngs`` given to :func:`quantize_model`. A model that passes its own per-matmul
keys (``models.transformer.DecoderLM``) calls :func:`dot_general` with ``key=``, and that
key is used instead. ``rng_stream`` renames the stream.

State and telemetry (linen): a recipe with delayed-scaling operands keeps its amax
histories in the collection :data:`OVERWRITE` (Flax's ``_overwrite_with_gradient``,
created by ``init``); pass it to ``apply`` and differentiate w.r.t. it: its gradient is
the next state, which replaces it (Flax's ``TrainState.apply_gradients`` does this; never
feed it to an optimizer). With ``telemetry=True`` each quantized op sows the telemetry of
its forward operands into the collection :data:`NUMERICS` (``apply(...,
mutable=["numerics"])``) and, when the :data:`OVERWRITE` collection is differentiated,
returns its backward operands' telemetry in that gradient; :func:`telemetry_scalars`
flattens both into ``{"numerics/<layer>/<gemm>_<operand>/<stat>": value}``. NNX models
sow forward telemetry as ``nnx.Intermediate`` values named ``numerics_<op>``; delayed
scaling needs a linen model (or :func:`numerics.qdot.quantized_dot_general_with_state`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import threading
from typing import Any, Callable, Iterator, NamedTuple, Sequence

from flax import linen as nn
from flax import nnx
import jax
import jax.numpy as jnp
from jax import lax

from numerics import qdot
from numerics import recipes as recipes_lib
from numerics import telemetry as telemetry_lib

OVERWRITE = "_overwrite_with_gradient"  # flax.linen.fp8_ops.OVERWRITE_WITH_GRADIENT
NUMERICS = "numerics"
RNG_STREAM = "quant"
OPS = ("dot_general", "einsum")

# The functions the model would have called (captured before any interception).
_LAX_DOT_GENERAL = lax.dot_general
_JNP_EINSUM = jnp.einsum
_FUSED_ATTENTION = jax.nn.dot_product_attention


@dataclasses.dataclass(frozen=True)
class Rule:
  """Which recipe the matmuls of the matching modules run with.

  Attributes:
    module_path: a regular expression matched against the whole ``/``-joined module
      path (``""`` is the quantized model itself): ``"head"``, ``"block_\\d+/.*"``.
    recipe: a :mod:`numerics.recipes` name or Recipe; ``None`` keeps the matched ops as
      the model wrote them (for "this layer stays in high precision" overrides).
    ops: the op kinds the rule applies to: ``"dot_general"``, ``"einsum"`` or both.
  """

  module_path: str
  recipe: str | recipes_lib.Recipe | None
  ops: tuple[str, ...] = OPS

  def __post_init__(self):
    if not isinstance(self.module_path, str):
      raise TypeError(f"module_path must be a regular expression string, got "
                      f"{self.module_path!r}")
    try:
      re.compile(self.module_path)
    except re.error as e:
      raise ValueError(f"module_path {self.module_path!r} is not a regular expression: "
                       f"{e}") from None
    if self.recipe is not None:
      recipes_lib.get(self.recipe)  # unknown names raise, listing the known ones
    ops = (self.ops,) if isinstance(self.ops, str) else tuple(self.ops)
    if not ops or set(ops) - set(OPS):
      raise ValueError(f"ops must be a non-empty subset of {OPS}, got {self.ops!r}")
    object.__setattr__(self, "ops", ops)

  def matches(self, path: str, op: str) -> bool:
    return op in self.ops and re.fullmatch(self.module_path, path) is not None

  @property
  def recipe_name(self) -> str | None:
    return None if self.recipe is None else recipes_lib.get(self.recipe).name


class OpRecord(NamedTuple):
  """One intercepted op (see :func:`recording`)."""

  path: str
  op_id: str
  rule: Rule | None  # None: no rule matched
  lhs_shape: tuple[int, ...]
  rhs_shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class _Config:
  rules: tuple[Rule, ...]
  telemetry: bool
  rng_stream: str


def _check_rules(rules: Sequence[Rule]) -> tuple[Rule, ...]:
  if isinstance(rules, Rule):
    rules = (rules,)
  rules = tuple(rules)
  for r in rules:
    if not isinstance(r, Rule):
      raise TypeError(f"rules must be models.Rule objects, got {type(r).__name__}")
  return rules


# ---------------------------------------------------------------------- interception


class _Context:
  """The interception state of one call of a quantized model (one thread)."""

  def __init__(self, config: _Config, top: Any, top_path: tuple[str, ...], kind: str):
    self.config = config
    self.kind = kind  # "linen" or "nnx"
    self.top_path = top_path
    self.stack: list[tuple[Any, str]] = [(top, "")]
    self.counts: dict[int, dict[str, int]] = {}
    self.busy = False  # inside a handler: the library's own matmuls pass through

  def path_of_linen(self, module: nn.Module) -> str:
    path = tuple(module.path)
    return "/".join(str(p) for p in path[len(self.top_path):])

  def next_op_id(self, module: Any, op: str) -> str:
    key = id(module.scope) if self.kind == "linen" else id(module)
    counts = self.counts.setdefault(key, {})
    n = counts.get(op, 0)
    counts[op] = n + 1
    return f"{op}_{n}"


_local = threading.local()
_patch_lock = threading.Lock()
_patch_count = 0
_recorders: list[list[OpRecord]] = []


def _active() -> _Context | None:
  return getattr(_local, "context", None)


@contextlib.contextmanager
def _activate(context: _Context) -> Iterator[None]:
  """Installs the interceptors (process-wide, counted) and makes ``context`` this
  thread's; other threads see the original functions."""
  global _patch_count
  with _patch_lock:
    if _patch_count == 0:
      jax.lax.dot_general = _intercepted_dot_general
      jax.numpy.einsum = _intercepted_einsum
      jax.nn.dot_product_attention = _intercepted_attention
    _patch_count += 1
  previous = _active()
  _local.context = context
  try:
    yield
  finally:
    _local.context = previous
    with _patch_lock:
      _patch_count -= 1
      if _patch_count == 0:
        jax.lax.dot_general = _LAX_DOT_GENERAL
        jax.numpy.einsum = _JNP_EINSUM
        jax.nn.dot_product_attention = _FUSED_ATTENTION


@contextlib.contextmanager
def _passthrough(ctx: _Context) -> Iterator[None]:
  busy, ctx.busy = ctx.busy, True
  try:
    yield
  finally:
    ctx.busy = busy


@contextlib.contextmanager
def recording() -> Iterator[list[OpRecord]]:
  """Collects an :class:`OpRecord` for every op a quantized model intercepts in this
  ``with`` block (trace the model, e.g. with ``jax.eval_shape``, to see its plan)."""
  records: list[OpRecord] = []
  _recorders.append(records)
  try:
    yield records
  finally:
    _recorders.remove(records)


def unused_rules(rules: Sequence[Rule], records: Sequence[OpRecord]) -> tuple[Rule, ...]:
  """The rules that caught no op in ``records`` (a typo in a path, usually)."""
  used = {id(r.rule) for r in records if r.rule is not None}
  return tuple(r for r in _check_rules(rules) if id(r) not in used)


def _current(ctx: _Context) -> tuple[Any, str]:
  module, path = ctx.stack[-1]
  if ctx.kind == "linen" and module is not ctx.stack[0][0]:
    path = ctx.path_of_linen(module)
  return module, path


def _rule_for(ctx: _Context, path: str, op: str) -> Rule | None:
  for rule in ctx.config.rules:
    if rule.matches(path, op):
      return rule
  return None


def _make_key(ctx: _Context, module: Any, rule: Rule, path: str, op_id: str):
  stream = ctx.config.rng_stream
  if ctx.kind == "linen":
    try:
      return module.make_rng(stream)
    except Exception as e:  # flax raises InvalidRngError (its message names the stream)
      raise ValueError(
          f"{path or '<model>'}/{op_id}: rule {rule.module_path!r} uses recipe "
          f"{rule.recipe_name!r}, which draws random numbers; pass rngs={{'{stream}': key}}"
          f" to init and apply ({type(e).__name__}: {e})") from None
  rngs = getattr(ctx.stack[0][0], "quant_rngs", None)
  if rngs is None or stream not in rngs:
    raise ValueError(f"{path or '<model>'}/{op_id}: recipe {rule.recipe_name!r} draws "
                     f"random numbers; give quantize_model rngs=nnx.Rngs({stream}=...)")
  return rngs[stream]()


def _state(ctx: _Context, module: Any, path: str, op_id: str, recipe: recipes_lib.Recipe
           ) -> dict:
  """The op's qdot state: delayed-scaling histories and backward telemetry probes."""
  telemetry = ctx.config.telemetry and recipe.quantized
  if not (recipe.delayed_operands or telemetry):
    return {}
  if ctx.kind == "nnx":
    if recipe.delayed_operands:
      raise ValueError(f"{path or '<model>'}/{op_id}: recipe {recipe.name!r} uses delayed "
                       f"scaling, whose state needs a linen model (collection "
                       f"{OVERWRITE!r}) or numerics.qdot.quantized_dot_general_with_state")
    return qdot.init_state(recipe, telemetry=True)
  scope = module.scope
  if scope.has_variable(OVERWRITE, op_id):
    return scope.get_variable(OVERWRITE, op_id)
  state = qdot.init_state(recipe, telemetry=telemetry)
  if scope.is_mutable_collection(OVERWRITE):
    scope.put_variable(OVERWRITE, op_id, state)
  elif recipe.delayed_operands:
    raise ValueError(f"{path or '<model>'}/{op_id}: the delayed-scaling state of recipe "
                     f"{recipe.name!r} is missing: pass the {OVERWRITE!r} collection "
                     f"that init created to apply")
  return state


def _sow(ctx: _Context, module: Any, op_id: str, telemetry: dict) -> None:
  if not telemetry:
    return
  stats = {slot.replace("/", "_"): t._asdict() for slot, t in telemetry.items()}
  if ctx.kind == "linen":
    if module.is_mutable_collection(NUMERICS):
      module.sow(NUMERICS, op_id, stats)
  else:
    module.sow(nnx.Intermediate, f"numerics_{op_id}", stats)


def _handle(op: str, lhs_shape, rhs_shape, call_original: Callable[[], Any],
            call_quantized: Callable[..., tuple[Any, dict]], key=None):
  """Runs one intercepted op per its rule (see the module docstring)."""
  ctx = _active()
  module, path = _current(ctx)
  op_id = ctx.next_op_id(module, op)
  rule = _rule_for(ctx, path, op)
  for records in _recorders:
    records.append(OpRecord(path, op_id, rule, tuple(lhs_shape), tuple(rhs_shape)))
  if rule is None or rule.recipe is None:
    with _passthrough(ctx):
      return call_original()
  recipe = recipes_lib.get(rule.recipe)
  if key is None and recipe.needs_key:
    key = _make_key(ctx, module, rule, path, op_id)
  state = _state(ctx, module, path, op_id, recipe)
  with _passthrough(ctx):
    out, telemetry = call_quantized(recipe, state, key)
  _sow(ctx, module, op_id, telemetry)
  return out


def dot_general(lhs: jax.Array, rhs: jax.Array, dimension_numbers, precision=None,
                preferred_element_type=None, *, key: jax.Array | None = None,
                **kwargs) -> jax.Array:
  """``lax.dot_general`` that a quantized model intercepts, with the caller's key.

  Outside a quantized model it is ``lax.dot_general`` (``key`` unused). Inside one,
  the op follows its module's rule, and a recipe that draws random numbers uses ``key``
  (when given) instead of the ``quant`` rng stream: models that derive a key per matmul
  (``models.transformer.DecoderLM``) keep their key scheme under quantization.
  """
  ctx = _active()
  if ctx is None or ctx.busy:
    return _LAX_DOT_GENERAL(lhs, rhs, dimension_numbers, precision=precision,
                            preferred_element_type=preferred_element_type, **kwargs)

  def original():
    return _LAX_DOT_GENERAL(lhs, rhs, dimension_numbers, precision=precision,
                            preferred_element_type=preferred_element_type, **kwargs)

  def quantized(recipe, state, key):
    return qdot.quantized_dot_general_with_state(
        lhs, rhs, dimension_numbers, recipe, state, key=key, precision=precision,
        preferred_element_type=preferred_element_type)

  return _handle("dot_general", jnp.shape(lhs), jnp.shape(rhs), original, quantized,
                 key)


def _intercepted_dot_general(lhs, rhs, dimension_numbers, precision=None,
                             preferred_element_type=None, **kwargs):
  return dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type,
                     **kwargs)


def einsum(subscripts, *operands, _dot_general=None, **kwargs):
  """``jnp.einsum`` that a quantized model intercepts (two-operand contractions)."""
  ctx = _active()
  default_dg = _dot_general in (None, _LAX_DOT_GENERAL, _intercepted_dot_general)
  if ctx is None or ctx.busy:
    return _JNP_EINSUM(subscripts, *operands,
                       _dot_general=_LAX_DOT_GENERAL if default_dg else _dot_general,
                       **kwargs)

  def original():
    return _JNP_EINSUM(subscripts, *operands,
                       _dot_general=_LAX_DOT_GENERAL if default_dg else _dot_general,
                       **kwargs)

  def quantized(recipe, state, key):
    if not isinstance(subscripts, str) or len(operands) != 2:
      raise ValueError(f"quantize_model quantizes two-operand einsums; this one is "
                       f"{subscripts!r} with {len(operands)} operands: give its module a "
                       f"rule with recipe=None")
    if not default_dg:
      raise ValueError(f"einsum {subscripts!r} already has a custom _dot_general; a "
                       f"quantizing rule would replace it: give its module a rule with "
                       f"recipe=None")
    telemetry = {}

    def dg(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
           **unused):
      del unused  # out_sharding: a single-device emulation ignores it
      out, tel = qdot.quantized_dot_general_with_state(
          lhs, rhs, dimension_numbers, recipe, state, key=key, precision=precision,
          preferred_element_type=preferred_element_type)
      telemetry.update(tel)
      return out

    # Without jit, einsum runs in the caller's trace, so the telemetry (and any tracer
    # the closure holds) stays in it.
    with jax.disable_jit():
      out = _JNP_EINSUM(subscripts, *operands, _dot_general=dg, **kwargs)
    return out, telemetry

  shapes = [jnp.shape(o) for o in operands[:2]] + [()] * (2 - min(len(operands), 2))
  return _handle("einsum", shapes[0], shapes[1], original, quantized)


def _intercepted_einsum(subscripts, *operands, **kwargs):
  return einsum(subscripts, *operands, **kwargs)


def _intercepted_attention(query, key, value, *args, **kwargs):
  """``jax.nn.dot_product_attention``: a fused op whose matmuls cannot be quantized, so
  a rule with a recipe that matches its module raises instead of being ignored."""
  ctx = _active()
  if ctx is None or ctx.busy:
    return _FUSED_ATTENTION(query, key, value, *args, **kwargs)
  module, path = _current(ctx)
  op_id = ctx.next_op_id(module, "dot_product_attention")
  rule = next((r for r in ctx.config.rules if any(r.matches(path, op) for op in r.ops)),
              None)
  for records in _recorders:
    records.append(OpRecord(path, op_id, rule, tuple(jnp.shape(query)),
                            tuple(jnp.shape(key))))
  if rule is not None and rule.recipe is not None:
    raise ValueError(
        f"{path or '<model>'} calls jax.nn.dot_product_attention, a fused op whose "
        f"matmuls quantize_model cannot quantize, under rule {rule.module_path!r} "
        f"(recipe {rule.recipe_name!r}): add models.Rule({path!r}, None) before it to keep "
        f"the attention as written, or use an attention that issues einsums")
  with _passthrough(ctx):
    return _FUSED_ATTENTION(query, key, value, *args, **kwargs)


# ---------------------------------------------------------------------- linen


def _track_linen(next_fun, args, kwargs, context):
  ctx = _active()
  if ctx is None or ctx.kind != "linen" or context.module.scope is None:
    return next_fun(*args, **kwargs)
  ctx.stack.append((context.module, ""))
  try:
    return next_fun(*args, **kwargs)
  finally:
    ctx.stack.pop()


def _linen_method(fn: Callable[..., Any], config: _Config) -> Callable[..., Any]:

  @functools.wraps(fn)
  def method(self, *args, **kwargs):
    if _active() is not None or self.scope is None:  # nested: the outer model's rules
      return fn(self, *args, **kwargs)
    context = _Context(config, self, tuple(self.path), "linen")
    with _activate(context), nn.intercept_methods(_track_linen):
      return fn(self, *args, **kwargs)

  return method


def _quantize_linen(model: nn.Module, config: _Config, methods: Sequence[str]
                    ) -> nn.Module:
  base = getattr(type(model), "_unquantized_type", type(model))
  namespace = {"_unquantized_type": base, "_quantization_config": config}
  for name in methods:
    fn = getattr(base, name, None)
    if fn is None:
      raise ValueError(f"{base.__name__} has no method {name!r}")
    while hasattr(fn, "method_handler_wrapped"):  # linen's scope wrapper
      fn = fn.__wrapped__
    namespace[name] = _linen_method(fn, config)
  model = model.copy()
  model.__class__ = type(base.__name__, (base,), namespace)
  return model


# ---------------------------------------------------------------------- nnx


_NNX_CLASSES: dict[type, type] = {}


def _has_call(cls: type) -> bool:
  return any("__call__" in vars(k) for k in cls.__mro__ if k is not object)


def _tracked_nnx_class(cls: type) -> type:
  if cls in _NNX_CLASSES:
    return _NNX_CLASSES[cls]
  call = cls.__call__

  def __call__(self, *args, **kwargs):
    ctx = _active()
    config = getattr(self, "_quantization_config", None)
    if ctx is None and config is not None:  # the quantized model itself
      with _activate(_Context(config, self, (), "nnx")):
        return call(self, *args, **kwargs)
    if ctx is None or ctx.kind != "nnx":
      return call(self, *args, **kwargs)
    ctx.stack.append((self, self._quantization_path))
    try:
      return call(self, *args, **kwargs)
    finally:
      ctx.stack.pop()

  tracked = type(cls.__name__, (cls,), {"__call__": __call__, "_unquantized_type": cls})
  _NNX_CLASSES[cls] = tracked
  return tracked


def _quantize_nnx(model: nnx.Module, config: _Config, rngs: nnx.Rngs | None
                  ) -> nnx.Module:
  model = nnx.clone(model)
  if not _has_call(type(model)):
    raise ValueError(f"{type(model).__name__} has no __call__ to quantize")
  for path, module in nnx.iter_modules(model):
    base = getattr(type(module), "_unquantized_type", type(module))
    if _has_call(base):
      module.__class__ = _tracked_nnx_class(base)
    module._quantization_path = "/".join(str(p) for p in path)
    for name, value in list(vars(module).items()):
      if value is _LAX_DOT_GENERAL:
        setattr(module, name, _intercepted_dot_general)
      elif value is _JNP_EINSUM:
        setattr(module, name, _intercepted_einsum)
  model._quantization_config = config
  if rngs is not None:
    model.quant_rngs = rngs
  return model


# ---------------------------------------------------------------------- public


def quantize_model(model: nn.Module | nnx.Module, rules: Sequence[Rule], *,
                   telemetry: bool = False, rng_stream: str = RNG_STREAM,
                   methods: Sequence[str] = ("__call__",),
                   rngs: nnx.Rngs | None = None) -> nn.Module | nnx.Module:
  """A copy of ``model`` whose matmuls follow ``rules`` (see the module docstring).

  Args:
    model: a Flax linen ``nn.Module`` or an ``nnx.Module`` (not modified).
    rules: :class:`Rule` objects; for each op the first whose ``module_path`` matches
      the issuing module's path decides; ops no rule matches are left alone.
    telemetry: report per-operand numerics telemetry (:mod:`numerics.telemetry`) of
      every quantized op (off by default: nothing extra is traced).
    rng_stream: the rng stream (linen) / ``rngs`` stream (NNX) stochastic recipes draw
      from.
    methods: linen: the methods that run quantized (NNX: ``__call__``).
    rngs: NNX only: the ``nnx.Rngs`` stochastic recipes draw from.

  Returns:
    A model of the same type, with the same variables (plus the collections
    :data:`OVERWRITE` and :data:`NUMERICS` when the rules and ``telemetry`` need them).
  """
  config = _Config(_check_rules(rules), bool(telemetry), rng_stream)
  if isinstance(model, nn.Module):
    if rngs is not None:
      raise ValueError("linen models draw keys from rng streams (apply(rngs=...)); "
                       "rngs= is for NNX models")
    return _quantize_linen(model, config, tuple(methods))
  if isinstance(model, nnx.Module):
    if tuple(methods) != ("__call__",):
      raise ValueError("NNX models are quantized through __call__ only")
    return _quantize_nnx(model, config, rngs)
  raise TypeError(f"quantize_model expects a flax.linen or flax.nnx Module, got "
                  f"{type(model).__name__}")


def telemetry_scalars(numerics: Any = None, overwrite: Any = None
                      ) -> dict[str, jax.Array]:
  """``{"numerics/<layer>/<gemm>_<operand>/<stat>": scalar}`` from a quantized linen
  model's sown :data:`NUMERICS` collection (forward operands) and/or the gradient of its
  :data:`OVERWRITE` collection (backward operands). ``<layer>`` is the module path and
  the op (``block_0/qkv/dot_general_0``); values sown more than once are averaged."""
  out: dict[str, jax.Array] = {}

  def walk(tree, prefix):
    if isinstance(tree, dict):
      for k, v in tree.items():
        walk(v, prefix + (str(k),))
    elif isinstance(tree, (tuple, list)):  # sow's tuple of calls
      for slot_stats in tree:
        for slot, stats in slot_stats.items():
          for stat, value in stats.items():
            name = "/".join(("numerics",) + prefix + (slot, stat))
            out.setdefault(name, []).append(value)

  if numerics is not None:
    walk(numerics, ())
  if overwrite is not None:
    for path, leaf in jax.tree_util.tree_flatten_with_path(
        overwrite, is_leaf=lambda x: isinstance(x, telemetry_lib.OperandTelemetry))[0]:
      if not isinstance(leaf, telemetry_lib.OperandTelemetry):
        continue
      keys = [str(getattr(k, "key", k)) for k in path]
      if "telemetry" not in keys:
        continue
      i = keys.index("telemetry")
      layer, slot = keys[:i], keys[i + 1].replace("/", "_")
      for stat, value in leaf._asdict().items():
        out.setdefault("/".join(["numerics"] + layer + [slot, stat]), []).append(value)
  return {k: jnp.mean(jnp.stack([jnp.asarray(v, jnp.float32) for v in vs]))
          for k, vs in out.items()}
