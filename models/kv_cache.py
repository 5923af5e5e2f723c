"""KV-cached decoding of :class:`models.transformer.DecoderLM`, quantized or not.

:func:`cached_lm` wraps a ``DecoderLM`` (its params unchanged; one wrapped by
``models.quantize_model`` keeps its rules, so a recipe-quantized model decodes with the
cache as well) as a :class:`models.sampling.CachedModel` for
:func:`models.sampling.sample_cached`. The cache is a
:class:`numerics.kv_quant.KVCache`: per layer, keys and values stored as a
:class:`numerics.kv_quant.KVQuantSpec` says (fp32, bf16, e4m3/e5m2/int8 with
tensor/head/token/block scales, NVFP4). :func:`calibrate_scales` measures static
per-tensor or per-head scales from calibration tokens; :func:`bytes_per_token` is
the cache's memory per decoded token, measured from the cache pytree.

Equality with the full recomputation (:func:`models.sampling.sample`): with an fp32
cache of ``P + N`` positions (what ``sample_cached`` makes) the attention runs on
the same lengths as ``sample``'s buffer, so only the number of query rows differs
between the two. On XLA:CPU a float32 GEMM's result depends on its row count (the
blocking of the dot changes its summation order), so fp32 logits differ in the last
bits (about 1e-6 relative, measured in the tests); bf16 and MX
recipes (per-row blocks) come out bit for bit equal there (tested).
"""

from __future__ import annotations

from typing import Any

import jax

from lowprec.models import sampling
from lowprec.models.transformer import DecoderLM, TransformerConfig
from lowprec.numerics import kv_quant


def init_cache(config: TransformerConfig, batch: int, length: int,
               key_spec: kv_quant.KVQuantSpec = kv_quant.KVQuantSpec(),
               value_spec: kv_quant.KVQuantSpec | None = None, *,
               key_scales: Any = None, value_scales: Any = None,
               num_layers: int | None = None) -> kv_quant.KVCache:
  """An empty cache for ``length`` positions of a ``config`` model.

  ``value_spec=None`` stores values like keys; ``key_scales``/``value_scales``: one
  static scale per layer (see :func:`calibrate_scales`) or ``None`` (scale 1, the
  naive choice, for the static granularities). ``num_layers``: the number of
  attention layers (default ``config.num_layers``; a looped model has more).
  """
  if not 1 <= length <= config.max_len:
    raise ValueError(f"length must be in [1, max_len={config.max_len}], got {length}")
  layers = config.num_layers if num_layers is None else num_layers
  shape = (batch, config.num_heads, length, config.d_model // config.num_heads)
  return kv_quant.init_cache(layers, shape, key_spec, value_spec,
                             key_scales=key_scales, value_scales=value_scales)


def cached_lm(model: DecoderLM, key_spec: kv_quant.KVQuantSpec = kv_quant.KVQuantSpec(),
              value_spec: kv_quant.KVQuantSpec | None = None, *, key_scales: Any = None,
              value_scales: Any = None) -> sampling.CachedModel:
  """``model`` as a :class:`models.sampling.CachedModel` whose ``params`` are the
  model's ``params`` collection (what ``model.init(...)["params"]`` returns).

  Caches are made by :func:`init_cache` with these specs and scales.
  """
  if not isinstance(model, DecoderLM):
    raise TypeError(f"model must be a DecoderLM, got {type(model).__name__}")
  if model.config.num_experts:
    raise ValueError("cached decoding supports the dense feed-forward only (num_experts=0)")

  def make(batch: int, length: int) -> kv_quant.KVCache:
    return init_cache(model.config, batch, length, key_spec, value_spec,
                      key_scales=key_scales, value_scales=value_scales)

  def apply(params, tokens, cache, key):
    return model.apply({"params": params}, tokens, key, cache=cache)

  return sampling.CachedModel(init_cache=make, apply=apply)


def calibrate_scales(model: DecoderLM, params: Any, tokens_BxL: jax.Array, key: jax.Array,
                     key_spec: kv_quant.KVQuantSpec,
                     value_spec: kv_quant.KVQuantSpec | None = None
                     ) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]:
  """Static scales ``amax / fmt.max`` per layer from one pass over calibration tokens.

  Runs ``tokens`` through the model into an fp32 cache and applies
  :func:`numerics.kv_quant.calibrated_scale` to each layer's keys (with
  ``key_spec``) and values (``value_spec``, default ``key_spec``), which must have a
  static granularity (``tensor`` or ``head``). Returns ``(key_scales,
  value_scales)``, one array per layer, for :func:`cached_lm` / :func:`init_cache`.
  """
  value_spec = key_spec if value_spec is None else value_spec
  for name, spec in (("key_spec", key_spec), ("value_spec", value_spec)):
    if not spec.is_static:
      raise ValueError(f"{name} has granularity {spec.granularity!r}; calibration is for "
                       f"{kv_quant.STATIC_GRANULARITIES}")
  b, length = tokens_BxL.shape
  cache = init_cache(model.config, b, length)
  _, cache = model.apply({"params": params}, tokens_BxL, key, cache=cache)
  ks = tuple(kv_quant.calibrated_scale(key_spec, kv_quant.read(c)) for c in cache.keys)
  vs = tuple(kv_quant.calibrated_scale(value_spec, kv_quant.read(c)) for c in cache.values)
  return ks, vs


def bytes_per_token(config: TransformerConfig,
                    key_spec: kv_quant.KVQuantSpec = kv_quant.KVQuantSpec(),
                    value_spec: kv_quant.KVQuantSpec | None = None, *,
                    num_layers: int | None = None) -> float:
  """Cache bytes per decoded token of one sequence, all layers, keys and values.

  Measured from the cache pytree: :func:`numerics.kv_quant.tree_nbytes` of a
  batch-1 cache of 2 positions minus that of 1 position (static scales and the
  length counter do not grow with the cache and cancel).
  """
  def size(length):
    tree = jax.eval_shape(lambda: init_cache(config, 1, length, key_spec, value_spec,
                                             num_layers=num_layers))
    return kv_quant.tree_nbytes(tree)

  if config.max_len < 2:
    raise ValueError("bytes_per_token needs max_len >= 2")
  return float(size(2) - size(1))
