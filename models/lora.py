"""LoRA (and QLoRA) for an unmodified :class:`models.transformer.DecoderLM`.

Adapters are injected by intercepting the chosen ``Linear`` projections at apply time
(``flax.linen.intercept_methods``, the mechanism qwix uses), so a pretrained model's
params load as they are. For a target projection with frozen kernel ``W [in, out]``:

    y = fp32_dot_general(x, dequantize(W_stored), x.ndim-1 . 0, key) + (alpha / r) (x A) B

where ``fp32_dot_general`` is the projection's own matmul (on a model wrapped by
``models.quantize_model`` the rule matching the projection quantizes this base GEMM)
and the adapter product is float32 at HIGHEST precision. ``A [in, r]`` starts as
N(0, 1/in) (Kaiming-like: unit output variance for unit inputs; the LoRA paper's
Gaussian A) and ``B [r, out]`` as zeros, so the adapted model starts equal to the base
model.

Targets are fnmatch patterns on the module path (``block_0/qkv``); a pattern without
``/`` matches the last path component, so the default ``("qkv", "attn_out", "ff_in",
"ff_out")`` adapts those projections in every block. Only 2-D Linear kernels can be
targets (not the mixture-of-experts GEMMs, whose kernels are 3-D).

The frozen base (:class:`FrozenBase`) holds the float params of everything else and
the target kernels stored per ``base_format``:

* ``"fp32"``: as they are; ``"bf16"``: cast to bfloat16 (round to nearest even);
* ``"nf4"``: :func:`numerics.nf4.quantize_nf4` with blocks of ``nf4_block_size``
  along the ``in`` (contraction) axis (zero-padded when it does not divide ``in``;
  the padding is stored), double-quantized scales by default (QLoRA);
* a :class:`numerics.quantizer.QuantSpec` for block formats (e.g. MXINT8
  ``QuantSpec("int8", block_shape=32, axis=0)``, MXFP8, MXFP4, NVFP4), deterministic
  rounding only. (:class:`numerics.blockscale.QuantizedArray` keeps one FP4 code per
  byte, so MXFP4/NVFP4 bases measure about 1 byte per weight, not 0.5.)

Dequantization (``dequantize``): ``"per_gemm"`` dequantizes inside each projection,
under ``jax.checkpoint`` so that the backward pass recomputes it instead of keeping
the float weight alive (QLoRA's on-the-fly dequantization); ``"materialize"``
dequantizes every target kernel once at the start of :func:`apply` into float32
arrays that live for the whole step. The two compute the same values; they differ in
what XLA keeps and fuses (an experiment can time them).

Training: the trainable parameters are the adapters only (a separate pytree; pass it
to the optimizer alone). :func:`apply` wraps the whole base in ``stop_gradient``, so
a gradient taken with respect to it is zero (tested).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
from typing import Any, NamedTuple

import flax.linen as nn
from flax.core import frozen_dict
import jax
import jax.numpy as jnp
from jax import lax

from lowprec.models import transformer
from lowprec.models.quantization import context as quantization_context
from lowprec.numerics import blockscale
from lowprec.numerics import nf4 as nf4_lib
from lowprec.numerics import quantizer as quantizer_lib
from lowprec.numerics import tree_paths
from lowprec.numerics.optim import step_keys

BASE_FORMATS = ("fp32", "bf16", "nf4")
DEQUANTIZE_MODES = ("per_gemm", "materialize")
DEFAULT_TARGETS = ("qkv", "attn_out", "ff_in", "ff_out")


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
  """LoRA hyperparameters and the storage of the frozen base (hashable).

  Attributes:
    rank: adapter rank ``r`` (>= 1).
    alpha: the adapter output is scaled by ``alpha / rank``.
    targets: fnmatch patterns of the Linear module paths to adapt.
    base_format: ``fp32``, ``bf16``, ``nf4`` or a QuantSpec (module docstring).
    nf4_block_size: NF4 block size along the ``in`` axis (QLoRA: 64).
    double_quant: NF4 double quantization of the block scales (QLoRA: on).
    dequantize: ``per_gemm`` or ``materialize``.
  """

  rank: int = 8
  alpha: float = 16.0
  targets: tuple[str, ...] = DEFAULT_TARGETS
  base_format: Any = "nf4"
  nf4_block_size: int = nf4_lib.BLOCK
  double_quant: bool = True
  dequantize: str = "per_gemm"

  def __post_init__(self):
    if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
      raise ValueError(f"rank must be an int >= 1, got {self.rank!r}")
    if isinstance(self.targets, str):
      raise TypeError("targets must be a sequence of patterns, not a string")
    object.__setattr__(self, "targets", tuple(self.targets))
    if not self.targets:
      raise ValueError("targets is empty: nothing to adapt")
    if self.dequantize not in DEQUANTIZE_MODES:
      raise ValueError(f"unknown dequantize {self.dequantize!r}; known: "
                       f"{', '.join(DEQUANTIZE_MODES)}")
    bf = self.base_format
    if isinstance(bf, quantizer_lib.QuantSpec):
      if bf.is_cast:
        raise ValueError("base_format QuantSpec must be a block format (MX, nvfp4); "
                         "use 'bf16' for a cast")
      if bf.rounding.needs_key:
        raise ValueError(f"the frozen base is quantized once, deterministically: "
                         f"QuantSpec rounding must not be stochastic, got {bf.rounding}")
    elif bf not in BASE_FORMATS:
      raise ValueError(f"unknown base_format {bf!r}; use one of {BASE_FORMATS} or a "
                       f"lowprec.numerics.quantizer.QuantSpec")
    if bf != "nf4" and (self.nf4_block_size != nf4_lib.BLOCK or not self.double_quant):
      raise ValueError("nf4_block_size and double_quant apply to base_format='nf4' only")

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


class Adapter(NamedTuple):
  """``a`` float32[in, r], ``b`` float32[r, out]."""

  a: jax.Array
  b: jax.Array


class FrozenBase(NamedTuple):
  """The frozen base model: ``params`` (float, target kernels removed) and
  ``kernels`` {module path: stored kernel}."""

  params: Any
  kernels: dict[str, Any]


def _module_path(param_path: str) -> str:
  return param_path.rsplit("/", 1)[0] if "/" in param_path else ""


def _matches(module_path: str, pattern: str) -> bool:
  if "/" in pattern:
    return fnmatch.fnmatchcase(module_path, pattern)
  return fnmatch.fnmatchcase(module_path.rsplit("/", 1)[-1], pattern)


def target_paths(params: Any, config: LoRAConfig) -> tuple[str, ...]:
  """Module paths (``block_0/qkv``) of the kernels ``config.targets`` selects.

  Raises:
    ValueError: a pattern matches no kernel, or matches a kernel that is not 2-D or
      that carries a low-rank compensation branch.
  """
  leaves = tree_paths.named_leaves(frozen_dict.unfreeze(params))
  kernels = {_module_path(name): leaf for name, leaf in leaves.items()
             if name.rsplit("/", 1)[-1] == "kernel"}
  compensated = {_module_path(name) for name in leaves if name.endswith("/comp_v")}
  chosen = []
  for pattern in config.targets:
    hits = [m for m in kernels if _matches(m, pattern)]
    if not hits:
      raise ValueError(f"LoRA target {pattern!r} matches no Linear kernel; kernels: "
                       f"{', '.join(sorted(kernels))}")
    for m in hits:
      if jnp.ndim(kernels[m]) != 2:
        raise ValueError(f"LoRA target {m!r} has a {jnp.ndim(kernels[m])}-d kernel; "
                         f"only 2-D Linear kernels [in, out] can be adapted")
      if m in compensated:
        raise ValueError(f"LoRA target {m!r} has a low-rank compensation branch "
                         f"(TransformerConfig.compensation_rank > 0), which the adapter "
                         f"would drop; adapt a model built with compensation_rank=0")
      if m not in chosen:
        chosen.append(m)
  return tuple(sorted(chosen))


def _get(tree: dict, path: str):
  for k in path.split("/"):
    tree = tree[k]
  return tree


def _quantize_kernel(w: jax.Array, config: LoRAConfig):
  bf = config.base_format
  w = jnp.asarray(w, jnp.float32)
  if bf == "fp32":
    return w
  if bf == "bf16":
    return w.astype(jnp.bfloat16)
  if bf == "nf4":
    return nf4_lib.quantize_nf4(w, block_size=config.nf4_block_size, axis=0,
                                double_quant=config.double_quant, pad=True)
  return quantizer_lib.quantize(w, bf)


def dequantize_kernel(stored: Any) -> jax.Array:
  """float32 kernel from its stored form (float array, NF4Array or QuantizedArray)."""
  if isinstance(stored, nf4_lib.NF4Array):
    return nf4_lib.dequantize_nf4(stored)
  if isinstance(stored, blockscale.QuantizedArray):
    return blockscale.dequantize(stored)
  return jnp.asarray(stored).astype(jnp.float32)


def freeze_base(params: Any, config: LoRAConfig) -> FrozenBase:
  """Splits pretrained DecoderLM ``params`` into the frozen base: the target kernels
  stored per ``config.base_format``, everything else unchanged."""
  params = frozen_dict.unfreeze(params)
  paths = target_paths(params, config)
  kernels = {m: _quantize_kernel(_get(params, m)["kernel"], config) for m in paths}
  rest = jax.tree.map(lambda x: x, params)  # a copy we may prune
  for m in paths:
    parts = m.split("/")
    del _get(rest, m)["kernel"]
    for depth in range(len(parts), 0, -1):  # drop modules left without params
      parent = _get(rest, "/".join(parts[:depth - 1])) if depth > 1 else rest
      if parent[parts[depth - 1]]:
        break
      del parent[parts[depth - 1]]
  return FrozenBase(rest, kernels)


def init_adapters(key: jax.Array, params: Any, config: LoRAConfig) -> dict[str, Adapter]:
  """Adapters for the targets of pretrained ``params`` (or a :class:`FrozenBase`):
  ``A ~ N(0, 1/in)`` (key folded per module path name), ``B = 0``."""
  if isinstance(params, FrozenBase):
    shapes = {m: _kernel_shape(k) for m, k in params.kernels.items()}
  else:
    p = frozen_dict.unfreeze(params)
    shapes = {m: tuple(jnp.shape(_get(p, m)["kernel"])) for m in target_paths(p, config)}
  out = {}
  for m, (n_in, n_out) in shapes.items():
    k = jax.random.fold_in(key, step_keys.name_tag(m))
    a = jax.random.normal(k, (n_in, config.rank), jnp.float32) * (n_in ** -0.5)
    out[m] = Adapter(a, jnp.zeros((config.rank, n_out), jnp.float32))
  return out


def _kernel_shape(stored: Any) -> tuple[int, ...]:
  if isinstance(stored, (nf4_lib.NF4Array, blockscale.QuantizedArray)):
    return tuple(stored.shape)
  return tuple(jnp.shape(stored))


def _base_matmul(x, w_stored, key, per_gemm: bool):
  dims = (((x.ndim - 1,), (0,)), ((), ()))
  mm = transformer.fp32_dot_general
  if not per_gemm:
    return mm(x, w_stored, dims, key)
  # Recompute the dequantized weight in the backward pass instead of saving it.
  return jax.checkpoint(lambda x_, w_, k_: mm(x_, dequantize_kernel(w_), dims, k_))(
      x, w_stored, key)


def _adapter_product(x: jax.Array, ad: Adapter) -> jax.Array:
  """``(x A) B`` in float32 at HIGHEST precision. Inside a ``models.quantize_model`` call
  the two products are the adapter's, not the model's: they pass its rules by (a rule
  matching the projection's path would otherwise quantize them as ``matmul`` ops)."""
  ctx = quantization_context.active()
  with (quantization_context.passthrough(ctx) if ctx is not None
        else contextlib.nullcontext()):
    xa = jnp.matmul(x.astype(jnp.float32), ad.a, precision=lax.Precision.HIGHEST)
    return jnp.matmul(xa, ad.b, precision=lax.Precision.HIGHEST)


def apply(model: nn.Module, base: FrozenBase, adapters: dict[str, Adapter],
          tokens_BxL: jax.Array, key: jax.Array, config: LoRAConfig) -> jax.Array:
  """Logits float32[B, L, V] of ``model`` with the frozen base and the adapters.

  ``model`` is a ``DecoderLM``, or one wrapped by ``models.quantize_model``: its rules
  then quantize the base GEMMs and pass the adapter products by. ``adapters`` must hold
  exactly the base's target kernels. Differentiate with respect to ``adapters``; the
  base is under ``stop_gradient``.
  """
  if not isinstance(base, FrozenBase):
    raise TypeError(f"base must be a FrozenBase, got {type(base).__name__}")
  if set(adapters) != set(base.kernels):
    raise ValueError(f"adapters {sorted(adapters)} do not match the base's targets "
                     f"{sorted(base.kernels)}")
  base = jax.tree.map(lax.stop_gradient, base)
  per_gemm = config.dequantize == "per_gemm"
  weights = (base.kernels if per_gemm else
             {m: dequantize_kernel(k) for m, k in base.kernels.items()})
  scale = jnp.float32(config.scale)

  def interceptor(next_fun, args, kwargs, context):
    module = context.module
    if context.method_name != "__call__" or not isinstance(module, transformer.Linear):
      return next_fun(*args, **kwargs)
    path = "/".join(module.path)
    if path not in weights:
      return next_fun(*args, **kwargs)
    x, k = args
    ad = adapters[path]
    y = _base_matmul(x, weights[path], k, per_gemm)
    return y + scale * _adapter_product(x, ad)

  with nn.intercept_methods(interceptor):
    return model.apply({"params": base.params}, tokens_BxL, key)


def merged_params(base: FrozenBase, adapters: dict[str, Adapter],
                  config: LoRAConfig) -> Any:
  """Plain DecoderLM params with ``dequantize(W) + (alpha/r) A B`` at each target (for
  evaluation or export; equal to :func:`apply` up to float32 reassociation)."""
  params = jax.tree.map(lambda x: x, frozen_dict.unfreeze(base.params))
  for m, stored in base.kernels.items():
    ad = adapters[m]
    w = dequantize_kernel(stored) + config.scale * jnp.matmul(
        ad.a, ad.b, precision=lax.Precision.HIGHEST)
    node = params
    for part in m.split("/"):
      node = node.setdefault(part, {})
    node["kernel"] = w
  return params


def adapter_count(adapters: dict[str, Adapter]) -> int:
  """Number of trainable scalars in ``adapters``."""
  return sum(int(x.size) for x in jax.tree.leaves(adapters))
