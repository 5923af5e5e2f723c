"""The interception: JAX's contraction functions, replaced while a quantized model runs.

While a quantized model's call is active in a thread, these functions are replaced
(process-wide, counted; the replacements act only in threads with an active
:class:`Context`, and call the originals elsewhere):

* ``jax.lax.dot_general``  -> :func:`dot_general`  (kind ``dot_general``), and
  ``lax.dot`` and ``lax.batch_matmul`` as the dot_general they issue; ``lax.ragged_dot``
  and ``ragged_dot_general`` (grouped GEMMs) recorded, run as written, and a warning
  under a quantizing rule
* ``jax.numpy.einsum``     -> :func:`einsum`       (``einsum``; ``attention`` when issued by
  Flax's attention functions)
* ``jax.numpy.matmul``, ``jax.numpy.dot`` and the ``@`` operator of JAX arrays and
  tracers, ``jax.numpy.tensordot``, ``inner``, ``vdot``, ``vecdot``, ``matvec``,
  ``vecmat`` and ``jax.numpy.linalg``'s ``tensordot`` and ``vecdot`` -> :mod:`.products`'
  :func:`matmul`, :func:`dot`, ... (``matmul``: each is one dot_general);
  ``jax.numpy.outer``, ``linalg.outer`` and products with a scalar have no contraction,
  ``linalg.multi_dot`` is a chain: recorded, run as written, and a warning under a
  quantizing rule
* ``jax.lax.conv_general_dilated`` -> :func:`conv_general_dilated` (``conv``)
* ``jax.nn.dot_product_attention`` -> :func:`dot_product_attention` (``attention``): under
  a quantizing rule it runs JAX's own XLA attention with its two einsums quantized.

Each op hands itself to :func:`.context.handle`, which looks up the module that issued
it (the front ends, :mod:`.linen_front` and :mod:`.nnx_front`, keep the module stack)
and the first rule matching its path and kind, records what it did (:mod:`.recording`),
and runs the original or the recipe's quantized op (:mod:`lowprec.numerics.qdot`,
:mod:`lowprec.numerics.qconv`). The library's own contractions inside a quantized op pass
through (``Context.busy``).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Iterator

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
from lowprec.models.quantization import context as context_lib
from lowprec.models.quantization import recording
from lowprec.models.quantization.context import Context, active
from lowprec.models.quantization import products
from lowprec.models.quantization.products import JNP_MATMUL, _intercepted_matmul

# The functions the model would have called (captured before any interception; the
# jnp products' originals are captured in .products).
LAX_DOT_GENERAL = lax.dot_general
LAX_DOT = lax.dot
LAX_BATCH_MATMUL = lax.batch_matmul
LAX_RAGGED_DOT = lax.ragged_dot
LAX_RAGGED_DOT_GENERAL = lax.ragged_dot_general
JNP_EINSUM = jnp.einsum
LAX_CONV = lax.conv_general_dilated
FUSED_ATTENTION = jax.nn.dot_product_attention

# Flax's attention functions: the einsums they issue are attention products.
_ATTENTION_CODE = frozenset(
    f.__code__ for f in (linen_attention.dot_product_attention_weights,
                         linen_attention.dot_product_attention,
                         nnx_attention.dot_product_attention_weights,
                         nnx_attention.dot_product_attention))

_patch_lock = threading.Lock()
_patch_count = 0


def _install(intercepting: bool) -> None:
  if intercepting:
    jax.lax.dot_general = _intercepted_dot_general
    jax.lax.dot = _intercepted_lax_dot
    jax.lax.batch_matmul = _intercepted_batch_matmul
    jax.lax.ragged_dot = _intercepted_ragged_dot
    jax.lax.ragged_dot_general = _intercepted_ragged_dot_general
    jax.numpy.einsum = _intercepted_einsum
    for name, module, _, interceptor in products.INSTALLED:
      setattr(module, name, interceptor)
    tensor_contractions.matmul = _intercepted_matmul  # the @ operator
    jax.lax.conv_general_dilated = _intercepted_conv
    jax.nn.dot_product_attention = _intercepted_attention
  else:
    jax.lax.dot_general = LAX_DOT_GENERAL
    jax.lax.dot = LAX_DOT
    jax.lax.batch_matmul = LAX_BATCH_MATMUL
    jax.lax.ragged_dot = LAX_RAGGED_DOT
    jax.lax.ragged_dot_general = LAX_RAGGED_DOT_GENERAL
    jax.numpy.einsum = JNP_EINSUM
    for name, module, original, _ in products.INSTALLED:
      setattr(module, name, original)
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
  previous = context_lib.set_active(context)
  try:
    yield
  finally:
    context_lib.set_active(previous)
    with _patch_lock:
      _patch_count -= 1
      if _patch_count == 0:
        _install(False)
  context_lib.check_unused(context.config)


# ---------------------------------------------------------------------- dot_general


def dot_general(lhs: jax.Array, rhs: jax.Array, dimension_numbers, precision=None,
                preferred_element_type=None, *, key: jax.Array | None = None,
                **kwargs) -> jax.Array:
  """``lax.dot_general`` that a quantized model intercepts, with the caller's key.

  Outside a quantized model it is ``lax.dot_general`` (``key`` unused). Inside one,
  the op follows its module's rule, and a recipe that draws random numbers uses ``key``
  (when given) instead of the ``quant`` rng stream: models that derive a key per matmul
  (``lowprec.models.transformer.DecoderLM``) keep their key scheme under quantization.
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

  return context_lib.handle("dot_general", "attention" if ctx.attention else "dot_general",
                 jnp.shape(lhs), jnp.shape(rhs), original, quantized, key)


def _intercepted_dot_general(lhs, rhs, dimension_numbers, precision=None,
                             preferred_element_type=None, **kwargs):
  return dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type,
                     **kwargs)


def _intercepted_lax_dot(lhs, rhs, *, dimension_numbers=None, precision=None,
                         preferred_element_type=None, out_sharding=None):
  """``lax.dot``: the dot_general it issues, intercepted as one (kind ``dot_general``)."""
  dn = dimension_numbers
  if (dn is None and 1 <= jnp.ndim(lhs) <= 2 and 1 <= jnp.ndim(rhs) <= 2
      and jnp.shape(lhs)[-1] == jnp.shape(rhs)[0]):
    dn = (((jnp.ndim(lhs) - 1,), (0,)), ((), ()))
  if dn is None:
    return LAX_DOT(lhs, rhs, dimension_numbers=dimension_numbers, precision=precision,
                   preferred_element_type=preferred_element_type,
                   out_sharding=out_sharding)  # its own error
  return dot_general(lhs, rhs, dn, precision, preferred_element_type,
                     out_sharding=out_sharding)


def _intercepted_batch_matmul(lhs, rhs, precision=None):
  """``lax.batch_matmul``: the dot_general it issues, intercepted as one."""
  n = jnp.ndim(lhs)
  if min(n, jnp.ndim(rhs)) < 2 or n != jnp.ndim(rhs):
    return LAX_BATCH_MATMUL(lhs, rhs, precision)  # its own error
  batch = tuple(range(n - 2))
  return dot_general(lhs, rhs, (((n - 1,), (n - 2,)), (batch, batch)), precision)


def _ragged(op, original, lhs, rhs):
  ctx = active()
  if ctx is None or ctx.busy:
    return original()
  return context_lib.as_written(op, "dot_general", jnp.shape(lhs), jnp.shape(rhs), original,
                                f"lax.{op} is a grouped GEMM (one per group of rows), "
                                f"which quantize_model does not quantize", stacklevel=3)


def _intercepted_ragged_dot(lhs, rhs, *args, **kwargs):
  """``lax.ragged_dot`` (MoE experts): recorded, run as written, and a warning under a
  quantizing rule."""
  return _ragged("ragged_dot", lambda: LAX_RAGGED_DOT(lhs, rhs, *args, **kwargs), lhs, rhs)


def _intercepted_ragged_dot_general(lhs, rhs, *args, **kwargs):
  return _ragged("ragged_dot_general",
                 lambda: LAX_RAGGED_DOT_GENERAL(lhs, rhs, *args, **kwargs), lhs, rhs)


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
    del rule  # the remedy is the same whichever rule asked
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
  return context_lib.handle("einsum", kind, shapes[0], shapes[1], original, quantized, check=check)


def _intercepted_einsum(subscripts, *operands, **kwargs):
  return einsum(subscripts, *operands, **kwargs)


# ---------------------------------------------------------------------- conv


def conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None,
                         rhs_dilation=None, dimension_numbers=None,
                         feature_group_count=1, batch_group_count=1, precision=None,
                         preferred_element_type=None, **kwargs):
  """``lax.conv_general_dilated`` that a quantized model intercepts (kind ``conv``):
  under a quantizing rule, :func:`lowprec.numerics.qconv.quantized_conv_general_dilated`."""
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
                       f"not one GEMM and cannot be quantized under {rule}: give its "
                       f"module a rule with recipe=None")

  return context_lib.handle("conv", "conv", jnp.shape(lhs), jnp.shape(rhs), original, quantized,
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
  _, path = context_lib.current(ctx)
  rule = context_lib.rule_for(ctx, path, "attention")
  if rule is None or rule.recipe is None:
    module, _ = context_lib.current(ctx)
    op_id = ctx.next_op_id(module, "dot_product_attention")
    if rule is not None:
      ctx.config.caught.add(id(rule))
    recording.record(recording.OpRecord(path, op_id, rule, tuple(jnp.shape(query)),
                                        tuple(jnp.shape(key)), "attention",
                                        context_lib.reason(ctx.config, rule)))
    with context_lib.passthrough(ctx):
      return FUSED_ATTENTION(query, key, value, *args, **kwargs)
  if kwargs.get("implementation") not in (None, "xla"):
    raise ValueError(f"{context_lib.where(path)}: jax.nn.dot_product_attention("
                     f"implementation={kwargs['implementation']!r}) cannot be quantized "
                     f"under {context_lib.describe(ctx.config, rule)}: give its module a "
                     f"rule with recipe=None")
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
