"""The interception: JAX's contraction functions, replaced while a quantized model runs.

While a quantized model's call is active in a thread, these functions are replaced
(process-wide, counted; the replacements act only in threads with an active
:class:`Context`, and call the originals elsewhere):

* ``jax.lax.dot_general``  -> :func:`dot_general`  (kind ``dot_general``)
* ``jax.numpy.einsum``     -> :func:`einsum`       (``einsum``; ``attention`` when issued by
  Flax's attention functions)
* ``jax.numpy.matmul``, ``jax.numpy.dot`` and the ``@`` operator of JAX arrays and
  tracers -> :func:`matmul` / :func:`dot`          (``matmul``)
* ``jax.lax.conv_general_dilated`` -> :func:`conv_general_dilated` (``conv``)
* ``jax.nn.dot_product_attention`` -> :func:`dot_product_attention` (``attention``): under
  a quantizing rule it runs JAX's own XLA attention with its two einsums quantized.

Each op looks up the module that issued it (the front ends, :mod:`.linen_front` and
:mod:`.nnx_front`, keep the module stack) and the first rule matching its path and kind,
records what it did (:mod:`.recording`), and runs the original or the recipe's
quantized op (:mod:`numerics.qdot`, :mod:`numerics.qconv`). The library's own
contractions inside a quantized op pass through (``Context.busy``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import warnings
from typing import Any, Callable, Iterator

from flax import linen as nn
from flax import nnx
import flax.linen.attention as linen_attention
import flax.nnx.nn.attention as nnx_attention
import jax
from jax._src.nn import functions as jax_nn_functions
from jax._src.numpy import einsum as jnp_einsum_module
from jax._src.numpy import tensor_contractions
import jax.numpy as jnp
from jax import lax

from lowprec.numerics import qconv
from lowprec.numerics import qdot
from lowprec.numerics import recipes as recipes_lib
from lowprec.models.quantization import recording
from lowprec.models.quantization.rules import Rule

OVERWRITE = "_overwrite_with_gradient"  # flax.linen.fp8_ops.OVERWRITE_WITH_GRADIENT
NUMERICS = "numerics"
RNG_STREAM = "quant"
UNUSED_RULES = ("warn", "raise", "ignore")

# The functions the model would have called (captured before any interception).
LAX_DOT_GENERAL = lax.dot_general
JNP_EINSUM = jnp.einsum
JNP_MATMUL = jnp.matmul
JNP_DOT = jnp.dot
LAX_CONV = lax.conv_general_dilated
FUSED_ATTENTION = jax.nn.dot_product_attention

# Flax's attention functions: the einsums they issue are attention products.
_ATTENTION_CODE = frozenset(
    f.__code__ for f in (linen_attention.dot_product_attention_weights,
                         linen_attention.dot_product_attention,
                         nnx_attention.dot_product_attention_weights,
                         nnx_attention.dot_product_attention))


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
    self.counts: dict[int, dict[str, int]] = {}
    self.busy = False  # inside a handler: the library's own matmuls pass through
    self.attention = False  # inside a decomposed jax.nn.dot_product_attention

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


def active() -> Context | None:
  return getattr(_local, "context", None)


def _install(intercepting: bool) -> None:
  if intercepting:
    jax.lax.dot_general = _intercepted_dot_general
    jax.numpy.einsum = _intercepted_einsum
    jax.numpy.matmul = _intercepted_matmul
    jax.numpy.dot = _intercepted_dot
    tensor_contractions.matmul = _intercepted_matmul  # the @ operator
    jax.lax.conv_general_dilated = _intercepted_conv
    jax.nn.dot_product_attention = _intercepted_attention
  else:
    jax.lax.dot_general = LAX_DOT_GENERAL
    jax.numpy.einsum = JNP_EINSUM
    jax.numpy.matmul = JNP_MATMUL
    jax.numpy.dot = JNP_DOT
    tensor_contractions.matmul = JNP_MATMUL
    jax.lax.conv_general_dilated = LAX_CONV
    jax.nn.dot_product_attention = FUSED_ATTENTION


@contextlib.contextmanager
def activate(context: Context) -> Iterator[None]:
  """Installs the interceptors (process-wide, counted) and makes ``context`` this
  thread's; other threads see the original functions. When the outermost call ends,
  rules that matched no op warn (or raise, or pass: ``unused_rules``)."""
  global _patch_count
  with _patch_lock:
    if _patch_count == 0:
      _install(True)
    _patch_count += 1
  previous = active()
  _local.context = context
  try:
    yield
  finally:
    _local.context = previous
    with _patch_lock:
      _patch_count -= 1
      if _patch_count == 0:
        _install(False)
  _check_unused(context.config)


def _check_unused(config: Config) -> None:
  unused = [r for r in config.rules if r.required and id(r) not in config.caught]
  if not unused or config.unused_rules == "ignore":
    return
  names = ", ".join(f"Rule({r.module_path!r}, {r.recipe_name!r}, ops={r.ops})"
                    for r in unused)
  message = (f"quantize_model: {names} matched no op of the model in its calls so far "
             f"(a typo in a module path? models.quantization.recording() lists the paths "
             f"and op kinds the model issues)")
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


def _rule_for(ctx: Context, path: str, kind: str) -> Rule | None:
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
          f"{path or '<model>'}/{op_id}: rule {rule.module_path!r} uses recipe "
          f"{rule.recipe_name!r}, which draws random numbers; pass rngs={{'{stream}': key}}"
          f" to init and apply ({type(e).__name__}: {e})") from None
  rngs = getattr(ctx.stack[0][0], "quant_rngs", None)
  if rngs is None or stream not in rngs:
    raise ValueError(f"{path or '<model>'}/{op_id}: recipe {rule.recipe_name!r} draws "
                     f"random numbers; give quantize_model rngs=nnx.Rngs({stream}=...)")
  return rngs[stream]()


def _state(ctx: Context, module: Any, path: str, op_id: str, recipe: recipes_lib.Recipe
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


def _sow(ctx: Context, module: Any, op_id: str, telemetry: dict) -> None:
  if not telemetry:
    return
  stats = {slot.replace("/", "_"): t._asdict() for slot, t in telemetry.items()}
  if ctx.kind == "linen":
    if module.is_mutable_collection(NUMERICS):
      module.sow(NUMERICS, op_id, stats)
  else:
    module.sow(nnx.Intermediate, f"numerics_{op_id}", stats)


def _reason(rule: Rule | None) -> str:
  if rule is None:
    return "as written: no rule matched"
  if rule.recipe is None:
    return f"as written: rule {rule.module_path!r} keeps it"
  return f"{rule.recipe_name}: rule {rule.module_path!r}"


def _handle(op: str, kind: str, lhs_shape, rhs_shape, call_original: Callable[[], Any],
            call_quantized: Callable[..., tuple[Any, dict]], key=None,
            check: Callable[[Rule], None] | None = None):
  """Runs one intercepted op per its rule (see the module docstring)."""
  ctx = active()
  module, path = current(ctx)
  op_id = ctx.next_op_id(module, op)
  rule = _rule_for(ctx, path, kind)
  if rule is not None:
    ctx.config.caught.add(id(rule))
  recording.record(recording.OpRecord(path, op_id, rule, tuple(lhs_shape),
                                      tuple(rhs_shape), kind, _reason(rule)))
  if rule is None or rule.recipe is None:
    with passthrough(ctx):
      return call_original()
  if check is not None:
    check(rule, f"{path or '<model>'}/{op_id}")
  recipe = recipes_lib.get(rule.recipe)
  if key is None and recipe.needs_key:
    key = _make_key(ctx, module, rule, path, op_id)
  state = _state(ctx, module, path, op_id, recipe)
  with passthrough(ctx):
    out, telemetry = call_quantized(recipe, state, key)
  _sow(ctx, module, op_id, telemetry)
  return out


# ---------------------------------------------------------------------- dot_general


def dot_general(lhs: jax.Array, rhs: jax.Array, dimension_numbers, precision=None,
                preferred_element_type=None, *, key: jax.Array | None = None,
                **kwargs) -> jax.Array:
  """``lax.dot_general`` that a quantized model intercepts, with the caller's key.

  Outside a quantized model it is ``lax.dot_general`` (``key`` unused). Inside one,
  the op follows its module's rule, and a recipe that draws random numbers uses ``key``
  (when given) instead of the ``quant`` rng stream: models that derive a key per matmul
  (``models.transformer.DecoderLM``) keep their key scheme under quantization.
  """
  def original():
    return LAX_DOT_GENERAL(lhs, rhs, dimension_numbers, precision=precision,
                           preferred_element_type=preferred_element_type, **kwargs)

  ctx = active()
  if ctx is None or ctx.busy:
    return original()

  def quantized(recipe, state, key):
    return qdot.quantized_dot_general_with_state(
        lhs, rhs, dimension_numbers, recipe, state, key=key, precision=precision,
        preferred_element_type=preferred_element_type)

  return _handle("dot_general", "attention" if ctx.attention else "dot_general",
                 jnp.shape(lhs), jnp.shape(rhs), original, quantized, key)


def _intercepted_dot_general(lhs, rhs, dimension_numbers, precision=None,
                             preferred_element_type=None, **kwargs):
  return dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type,
                     **kwargs)


# ---------------------------------------------------------------------- einsum


def _in_flax_attention() -> bool:
  """Whether the calling einsum was issued by one of Flax's attention functions."""
  frame = sys._getframe(2)  # pylint: disable=protected-access
  for _ in range(8):
    if frame is None:
      return False
    if frame.f_code in _ATTENTION_CODE:
      return True
    frame = frame.f_back
  return False


def einsum(subscripts, *operands, _dot_general=None, **kwargs):
  """``jnp.einsum`` that a quantized model intercepts (two-operand contractions)."""
  ctx = active()
  default_dg = _dot_general in (None, LAX_DOT_GENERAL, _intercepted_dot_general)

  def original():
    return JNP_EINSUM(subscripts, *operands,
                      _dot_general=LAX_DOT_GENERAL if default_dg else _dot_general,
                      **kwargs)

  if ctx is None or ctx.busy:
    return original()

  def quantized(recipe, state, key):
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
      out = JNP_EINSUM(subscripts, *operands, _dot_general=dg, **kwargs)
    return out, telemetry

  def check(rule, where):
    if not isinstance(subscripts, str) or len(operands) != 2:
      raise ValueError(f"{where}: quantize_model quantizes two-operand einsums; this one "
                       f"is {subscripts!r} with {len(operands)} operands: give its module "
                       f"a rule with recipe=None")
    if not default_dg:
      raise ValueError(f"{where}: einsum {subscripts!r} already has a custom _dot_general;"
                       f" a quantizing rule would replace it: give its module a rule with "
                       f"recipe=None")

  kind = "attention" if (ctx.attention or _in_flax_attention()) else "einsum"
  shapes = [jnp.shape(o) for o in operands[:2]] + [()] * (2 - min(len(operands), 2))
  return _handle("einsum", kind, shapes[0], shapes[1], original, quantized, check=check)


def _intercepted_einsum(subscripts, *operands, **kwargs):
  return einsum(subscripts, *operands, **kwargs)


# ---------------------------------------------------------------------- matmul, dot


def _matmul_operands(a, b):
  """(a, b, dimension_numbers) of ``jnp.matmul(a, b)`` as one dot_general, or None
  for a product with a scalar (no contraction)."""
  na, nb = jnp.ndim(a), jnp.ndim(b)
  if na == 0 or nb == 0:
    return None
  if nb == 1:
    return a, b, (((na - 1,), (0,)), ((), ()))
  if na == 1:
    return a, b, (((0,), (nb - 2,)), ((), ()))
  if nb == 2:
    return a, b, (((na - 1,), (0,)), ((), ()))
  batch = jnp.broadcast_shapes(jnp.shape(a)[:-2], jnp.shape(b)[:-2])
  a = jnp.broadcast_to(a, batch + jnp.shape(a)[-2:])
  b = jnp.broadcast_to(b, batch + jnp.shape(b)[-2:])
  n = len(batch)
  return a, b, (((n + 1,), (n,)), (tuple(range(n)), tuple(range(n))))


def _dot_operands(a, b):
  """(a, b, dimension_numbers) of ``jnp.dot(a, b)`` as one dot_general, or None."""
  na, nb = jnp.ndim(a), jnp.ndim(b)
  if na == 0 or nb == 0:
    return None
  return a, b, (((na - 1,), (max(nb - 2, 0),)), ((), ()))


def _contraction(op, original_fn, operands_fn, a, b, precision, preferred_element_type,
                 kwargs):
  def original():
    return original_fn(a, b, precision=precision,
                       preferred_element_type=preferred_element_type, **kwargs)

  ctx = active()
  parts = None if ctx is None or ctx.busy else operands_fn(a, b)
  if parts is None:
    return original()
  lhs, rhs, dn = parts

  def quantized(recipe, state, key):
    return qdot.quantized_dot_general_with_state(
        lhs, rhs, dn, recipe, state, key=key, precision=precision,
        preferred_element_type=preferred_element_type)

  return _handle(op, "matmul", jnp.shape(a), jnp.shape(b), original, quantized)


def matmul(a, b, *, precision=None, preferred_element_type=None, **kwargs):
  """``jnp.matmul`` (and ``a @ b``) that a quantized model intercepts (kind ``matmul``)."""
  return _contraction("matmul", JNP_MATMUL, _matmul_operands, a, b, precision,
                      preferred_element_type, kwargs)


def dot(a, b, *, precision=None, preferred_element_type=None, **kwargs):
  """``jnp.dot`` that a quantized model intercepts (kind ``matmul``)."""
  return _contraction("dot", JNP_DOT, _dot_operands, a, b, precision,
                      preferred_element_type, kwargs)


def _intercepted_matmul(a, b, **kwargs):
  return matmul(a, b, **kwargs)


def _intercepted_dot(a, b, **kwargs):
  return dot(a, b, **kwargs)


# ---------------------------------------------------------------------- conv


def conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None,
                         rhs_dilation=None, dimension_numbers=None,
                         feature_group_count=1, batch_group_count=1, precision=None,
                         preferred_element_type=None, **kwargs):
  """``lax.conv_general_dilated`` that a quantized model intercepts (kind ``conv``):
  under a quantizing rule, :func:`numerics.qconv.quantized_conv_general_dilated`."""
  def original():
    return LAX_CONV(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                    dimension_numbers, feature_group_count, batch_group_count,
                    precision=precision, preferred_element_type=preferred_element_type,
                    **kwargs)

  ctx = active()
  if ctx is None or ctx.busy:
    return original()

  def quantized(recipe, state, key):
    return qconv.quantized_conv_general_dilated_with_state(
        lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
        dimension_numbers, precision=precision,
        preferred_element_type=preferred_element_type, recipe=recipe, state=state,
        key=key)

  def check(rule, where):
    if feature_group_count != 1 or batch_group_count != 1:
      raise ValueError(f"{where}: a grouped convolution (feature_group_count="
                       f"{feature_group_count}, batch_group_count={batch_group_count}) is "
                       f"not one GEMM and cannot be quantized under rule "
                       f"{rule.module_path!r}: give its module a rule with recipe=None")

  return _handle("conv", "conv", jnp.shape(lhs), jnp.shape(rhs), original, quantized,
                 check=check)


def _intercepted_conv(lhs, rhs, window_strides, padding, lhs_dilation=None,
                      rhs_dilation=None, dimension_numbers=None, feature_group_count=1,
                      batch_group_count=1, precision=None, preferred_element_type=None,
                      **kwargs):
  return conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation,
                              rhs_dilation, dimension_numbers, feature_group_count,
                              batch_group_count, precision, preferred_element_type,
                              **kwargs)


# ---------------------------------------------------------------------- attention


def dot_product_attention(query, key, value, *args, **kwargs):
  """``jax.nn.dot_product_attention`` that a quantized model intercepts.

  A rule whose ops include ``attention`` and that has a recipe runs JAX's own XLA
  attention (``implementation="xla"``) with its two einsums (QK^T, AV) quantized as
  the ``attention`` kind, so linen's einsum attention and NNX's fused call quantize
  alike; otherwise the fused op runs as written.
  """
  ctx = active()
  if ctx is None or ctx.busy:
    return FUSED_ATTENTION(query, key, value, *args, **kwargs)
  _, path = current(ctx)
  rule = _rule_for(ctx, path, "attention")
  if rule is None or rule.recipe is None:
    module, _ = current(ctx)
    op_id = ctx.next_op_id(module, "dot_product_attention")
    if rule is not None:
      ctx.config.caught.add(id(rule))
    recording.record(recording.OpRecord(path, op_id, rule, tuple(jnp.shape(query)),
                                        tuple(jnp.shape(key)), "attention",
                                        _reason(rule)))
    with passthrough(ctx):
      return FUSED_ATTENTION(query, key, value, *args, **kwargs)
  if kwargs.get("implementation") not in (None, "xla"):
    raise ValueError(f"{path or '<model>'}: jax.nn.dot_product_attention(implementation="
                     f"{kwargs['implementation']!r}) cannot be quantized under rule "
                     f"{rule.module_path!r}: give its module a rule with recipe=None")
  kwargs = dict(kwargs, implementation="xla")
  attention, ctx.attention = ctx.attention, True
  # JAX's XLA attention, its einsums quantized for this call and its heads expanded
  # instead of vmapped over query groups (XLA:CPU cannot run the bf16 x bf16 -> f32
  # dots that a vmapped quantized GEMM's backward becomes).
  jnp_einsum_module.einsum = _intercepted_einsum
  jax_nn_functions._dot_product_attention_xla = _attention_without_vmap  # pylint: disable=protected-access
  try:
    return FUSED_ATTENTION(query, key, value, *args, **kwargs)
  finally:
    jnp_einsum_module.einsum = JNP_EINSUM
    jax_nn_functions._dot_product_attention_xla = _ATTENTION_XLA  # pylint: disable=protected-access
    ctx.attention = attention


_ATTENTION_XLA = jax_nn_functions._dot_product_attention_xla  # pylint: disable=protected-access


def _attention_without_vmap(query, key, value, bias, mask, is_causal, scale, q_seqlen,
                            kv_seqlen, local_window_size, return_residual=False):
  """``jax.nn``'s XLA attention with the key/value heads repeated per query group."""
  groups = query.shape[2] // key.shape[2]
  if groups > 1:
    key, value = jnp.repeat(key, groups, axis=2), jnp.repeat(value, groups, axis=2)
  return jax_nn_functions._dot_product_attention_core(  # pylint: disable=protected-access
      query, key, value, bias, mask, is_causal, scale, q_seqlen, kv_seqlen,
      local_window_size, return_residual)


def _intercepted_attention(query, key, value, *args, **kwargs):
  return dot_product_attention(query, key, value, *args, **kwargs)
