"""Quantize a Flax model you did not write: rules on module paths, intercepted contractions.

    from lowprec import models
    from lowprec.models import quantization

    qmodel = models.quantize_model(model, [
        models.Rule("head", "bf16"),     # the first matching rule wins
        models.Rule(".*", "mxfp8"),      # every other contraction in MXFP8
    ])
    qmodel = models.quantize_model(model, quantization.projections_only("mxfp8"))

:func:`quantize_model` returns a copy of a Flax linen or NNX model whose ``__call__``
(or the ``methods`` named) runs every contraction issued inside a module whose path
matches a :class:`Rule` through :mod:`lowprec.numerics.qdot` (or
:mod:`lowprec.numerics.qconv`) with that rule's recipe. A module's path is its name path
below the quantized model, joined by ``/`` (``"block_0/qkv"``; ``""`` for the model
itself; NNX: the attribute path, list indices included); ``Rule.module_path`` is a
regular expression that must match the whole path. Ops that no rule matches, and ops
whose rule has ``recipe=None``, run exactly as the model wrote them. Parameters are
untouched: the quantized model's variables are the plain model's (plus the collections
below).

What is intercepted (the op kinds a rule's ``ops`` selects; :mod:`.interception`):

| kind | calls | quantized as |
|---|---|---|
| ``dot_general`` | ``jax.lax.dot_general`` (``nn.Dense``, ``nnx.Linear``, ...), ``lax.dot``, ``lax.batch_matmul`` | the GEMM |
| ``einsum`` | ``jnp.einsum`` with two operands (``nn.Einsum``, ``nnx.Einsum``) | the GEMM |
| ``matmul`` | ``x @ w``, ``jnp.matmul``, ``jnp.dot``, ``jnp.tensordot``, ``jnp.inner``, ``jnp.vdot``, ``jnp.vecdot``, ``jnp.matvec``, ``jnp.vecmat``, ``jnp.linalg.matmul`` / ``tensordot`` / ``vecdot`` | the GEMM (batch dimensions broadcast first; ``vdot``'s operands flattened) |
| ``matmul`` | ``jnp.outer``, ``jnp.linalg.outer``, ``jnp.dot`` / ``jnp.inner`` with a scalar, ``jnp.linalg.multi_dot`` | no one GEMM: run as written, recorded; a quantizing rule warns |
| ``dot_general`` | ``lax.ragged_dot``, ``lax.ragged_dot_general`` | a grouped GEMM: run as written, recorded; a quantizing rule warns |
| ``conv`` | ``jax.lax.conv_general_dilated`` (``nn.Conv``, ``nnx.Conv``) | the im2col GEMM, blocks along (window, channel) |
| ``attention`` | the QK^T and AV einsums of Flax's attention functions; ``jax.nn.dot_product_attention`` (NNX's attention without dropout) | both GEMMs (the fused call runs JAX's XLA attention with them quantized) |

So linen's and NNX's attention quantize alike. Not intercepted (they run as written,
and are not listed by :func:`recording`): the rest of ``jnp.linalg`` (solvers,
decompositions), ``jnp.convolve``; ``einsum`` of three or more operands and
grouped convolutions raise under a quantizing rule (give their module a ``recipe=None``
rule), as does a fused attention asked for a non-XLA implementation. A function compiled
with ``jax.jit`` *inside* the model is intercepted as it was first traced (jit caches do
not know about the interception), so keep such functions out of quantized modules or
give them a ``recipe=None`` rule.

:func:`recording` lists every op the model issued, caught or not, with how it ran and
why; a rule that matched no op in the model's calls so far warns when the call returns
(``unused_rules="raise"``: raises; ``"ignore"``: silent). :func:`projections_only` is the common preset: projections in
the recipe, attention products and the output head in bf16.

Randomness (stochastic rounding, Hadamard transforms): linen ops draw their key with
``module.make_rng("quant")`` in the module that issues the op, so pass
``rngs={"quant": key}`` to ``init`` and ``apply``; NNX ops draw from the ``quant`` stream
of the ``rngs`` given to :func:`quantize_model`. A model that passes its own per-matmul
keys (``lowprec.models.transformer.DecoderLM``) calls :func:`dot_general` with
``key=``, and that key is used instead. ``rng_stream`` renames the stream.

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
scaling needs a linen model (or
:func:`lowprec.numerics.qdot.quantized_dot_general_with_state`).

Messages and plans name an op's module by the path a rule matches (the quantized model
itself: ``""``, written ``the root module (rule path "")``, and ``"" (root)`` in
:func:`plan`), and a rule by its index in ``rules`` (``rules[2] '.*'``, with its ``ops``
when it has not all of them).
"""

from __future__ import annotations

from typing import Any, Sequence

from flax import linen as nn
from flax import nnx
import jax
import jax.numpy as jnp

from lowprec.numerics import telemetry as telemetry_lib
from lowprec.models.quantization import context as context_lib
from lowprec.models.quantization import linen_front
from lowprec.models.quantization import nnx_front
from lowprec.models.quantization.context import NUMERICS, OVERWRITE, RNG_STREAM
from lowprec.models.quantization.interception import (conv_general_dilated,
                                                      dot_general, einsum)
from lowprec.models.quantization.products import (dot, inner, matmul, matvec, multi_dot,
                                                  outer, tensordot, vdot, vecdot, vecmat)
from lowprec.models.quantization.recording import OpRecord, plan, recording, unused_rules
from lowprec.models.quantization.rules import (OPS, PROJECTIONS, Rule, check_rules,
                                       projections_only)

__all__ = ["NUMERICS", "OPS", "OVERWRITE", "OpRecord", "PROJECTIONS", "RNG_STREAM", "Rule",
           "conv_general_dilated", "dot", "dot_general", "einsum", "inner", "matmul",
           "matvec", "multi_dot", "outer", "plan", "projections_only", "quantize_model",
           "recording", "telemetry_scalars", "tensordot", "unused_rules", "vdot", "vecdot",
           "vecmat"]


def quantize_model(model: nn.Module | nnx.Module, rules: Sequence[Rule], *,
                   telemetry: bool = False, rng_stream: str = RNG_STREAM,
                   methods: Sequence[str] = ("__call__",),
                   rngs: nnx.Rngs | None = None, unused_rules: str = "warn"
                   ) -> nn.Module | nnx.Module:
  """A copy of ``model`` whose contractions follow ``rules`` (see the module docstring).

  Args:
    model: a Flax linen ``nn.Module`` or an ``nnx.Module`` (not modified).
    rules: :class:`Rule` objects; for each op the first whose ``module_path`` matches
      the issuing module's path and whose ``ops`` include the op's kind decides; ops no
      rule matches are left alone.
    telemetry: report per-operand numerics telemetry (:mod:`lowprec.numerics.telemetry`) of
      every quantized op (off by default: nothing extra is traced).
    rng_stream: the rng stream (linen) / ``rngs`` stream (NNX) stochastic recipes draw
      from.
    methods: linen: the methods that run quantized (NNX: ``__call__``).
    rngs: NNX only: the ``nnx.Rngs`` stochastic recipes draw from.
    unused_rules: what happens when a call returns and a rule has matched no op in the
      model's calls so far: ``"warn"`` (a UserWarning naming it), ``"raise"``
      (ValueError) or ``"ignore"`` (for a rule list written for a family of models,
      e.g. one with a mixture-of-experts router rule applied to a dense model).

  Returns:
    A model of the same type, with the same variables (plus the collections
    :data:`OVERWRITE` and :data:`NUMERICS` when the rules and ``telemetry`` need them).
  """
  if unused_rules not in context_lib.UNUSED_RULES:
    raise ValueError(f"unused_rules must be one of {context_lib.UNUSED_RULES}, got "
                     f"{unused_rules!r}")
  config = context_lib.Config(check_rules(rules), bool(telemetry), rng_stream,
                               unused_rules)
  if isinstance(model, nn.Module):
    if rngs is not None:
      raise ValueError("linen models draw keys from rng streams (apply(rngs=...)); "
                       "rngs= is for NNX models")
    return linen_front.quantize(model, config, tuple(methods))
  if isinstance(model, nnx.Module):
    if tuple(methods) != ("__call__",):
      raise ValueError("NNX models are quantized through __call__ only")
    return nnx_front.quantize(model, config, rngs)
  raise TypeError(f"quantize_model expects a flax.linen or flax.nnx Module, got "
                  f"{type(model).__name__}")


def telemetry_scalars(numerics: Any = None, overwrite: Any = None
                      ) -> dict[str, jax.Array]:
  """``{"numerics/<layer>/<gemm>_<operand>/<stat>": scalar}`` from a quantized linen
  model's sown :data:`NUMERICS` collection (forward operands) and/or the gradient of its
  :data:`OVERWRITE` collection (backward operands). ``<layer>`` is the module path and
  the op (``block_0/qkv/dot_general_0``); values sown more than once are averaged."""
  out: dict[str, list] = {}

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
      # Dict keys (layers) and State's field names (a GetAttrKey's .name).
      keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
      if "telemetry" not in keys:
        continue
      i = keys.index("telemetry")
      layer, slot = keys[:i], keys[i + 1].replace("/", "_")
      for stat, value in leaf._asdict().items():
        out.setdefault("/".join(["numerics"] + layer + [slot, stat]), []).append(value)
  return {k: jnp.mean(jnp.stack([jnp.asarray(v, jnp.float32) for v in vs]))
          for k, vs in out.items()}
