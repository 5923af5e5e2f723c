"""A looped decoder LM (Ouro-style) with deferred and dense log-probs, and their replay.

Model (:class:`LoopedLM`): a prelude embedding (token + learned position), then one
shared stack of ``config.num_layers`` :class:`models.transformer.Block` s applied up
to ``R = loop.max_loops`` times, then a final RMSNorm and the LM head. Each position
``t`` has a depth ``d_t`` in [1, R]: loop ``r`` (0-based) updates its residual state
only while ``r < d_t``; after that its state is frozen. Deeper loops still attend to
an exited position: its keys and values at loop ``r`` are what the shared stack
computes from the frozen state (a masked dense pass computes exactly these, and so
does a decoder that keeps running the exited token through the loop with its
output discarded).

Halting rule (:class:`LoopConfig` ``halting``):

* ``fixed``: ``d_t = R``.
* ``threshold`` (Ouro's exit gate): after loop ``r`` the gate gives
  ``lambda_r = sigmoid(exit_gate(final_norm(h_r)))`` and the exit CDF
  ``F_r = 1 - prod_{j<=r} (1 - lambda_j)`` (the product accumulated in float32);
  ``d_t`` is the first ``r + 1`` with ``F_r >= threshold``, else ``R``. Each
  ``lambda_r`` (float32[B, L]) is sown as ``intermediates/exit_probability``. The
  decision depends on the computed state, so two computations of the same sequence
  can decide differently: the schedule is recorded by the rollout and replayed.

A depth array given to the model (``depth_BxL``, or preset in a
:class:`LoopedCache`) forces ``d_t`` where it is > 0; 0 lets the rule decide.

Two ways to get a sequence's log-probs:

* **deferred** (a rollout engine's): a prefill of the prompt, then one token per
  step, every (loop, layer) with its own KV cache (``R * num_layers`` caches of
  :mod:`numerics.kv_quant`, quantized or not). :func:`rollout` samples this way and
  records each position's depth; :func:`deferred_log_probs` replays it teacher-forced
  with the recorded depths and the rollout's key (same calls, shapes and keys).
* **dense** (a learner's): :func:`dense_log_probs`, the whole sequence in one pass
  with the recorded depths.

With an fp32 cache the two are equal in exact arithmetic and differ in the last bits
(GEMM row counts, log-softmax shapes); a quantized or bf16 cache adds its rounding. :func:`replay_log_probs` is
``sg(deferred) + (dense - sg(dense))``: its value is the deferred value exactly
(``dense - sg(dense)`` is exactly 0 for finite ``dense``, and ``x + 0 == x``) and its
gradient is the dense path's. The depths are data: no gradient reaches the exit gate
through them.

Keys: loop ``r``, layer ``i`` uses ``fold_in(key, r * num_layers + i)``; the head
``fold_in(key, R * num_layers)``; the exit gate after loop ``r``
``fold_in(key, R * num_layers + 1 + r)``. Every matmul is the transformer's
:func:`models.transformer.fp32_dot_general`; quantize with :func:`models.quantize_model`
(the gate's path is ``exit_gate``, the head's ``head``).

Shapes: B batch, L sequence, S cache positions, P prompt, N completion, D d_model.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.models import kv_cache as kv_cache_lib
from lowprec.models import sampling
from lowprec.models.transformer import (Block, Linear, TransformerConfig, poison_overflow,
                                        check_cache)
from lowprec.numerics import kv_quant

HALTING_RULES = ("fixed", "threshold")


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """The loop: ``max_loops`` (R >= 1) applications of the shared stack, and the exit
  rule: ``fixed`` (always R) or ``threshold`` (Ouro's gate; exit once the exit CDF
  reaches ``threshold``, required and in (0, 1], for this rule only)."""

  max_loops: int = 4
  halting: str = "fixed"
  threshold: float | None = None

  def __post_init__(self):
    if isinstance(self.max_loops, bool) or not isinstance(self.max_loops, int) or \
        self.max_loops < 1:
      raise ValueError(f"max_loops must be an int >= 1, got {self.max_loops!r}")
    if self.halting not in HALTING_RULES:
      raise ValueError(f"unknown halting rule {self.halting!r}; known: "
                       f"{', '.join(HALTING_RULES)}")
    if self.halting == "fixed" and self.threshold is not None:
      raise ValueError("threshold applies to halting='threshold' only")
    if self.halting == "threshold" and (self.threshold is None
                                        or not 0 < self.threshold <= 1):
      raise ValueError(f"halting='threshold' needs a threshold in (0, 1], got "
                       f"{self.threshold!r}")


class LoopedCache(NamedTuple):
  """The deferred path's state (a pytree).

  Attributes:
    kv: a :class:`numerics.kv_quant.KVCache` of ``R * num_layers`` layers: loop
      ``r``, layer ``i`` at index ``r * num_layers + i``.
    depth: int32[B, S]: the depth each decoded position used; a value > 0 preset
      before decoding forces that position's depth (a replay), 0 lets the rule decide.
  """

  kv: kv_quant.KVCache
  depth: jax.Array


class LoopedRollout(NamedTuple):
  """``tokens`` int32[B, P + N], ``logp`` float32[B, N] (the behaviour log-probs),
  ``depth`` int32[B, P + N]: the depth each position was decoded at (0 for the last
  token, which is never fed back; it affects no log-prob)."""

  tokens: jax.Array
  logp: jax.Array
  depth: jax.Array


def _check_depth(depth: jax.Array, shape: tuple[int, ...], max_loops: int) -> jax.Array:
  depth = jnp.asarray(depth)
  if depth.shape != tuple(shape) or not jnp.issubdtype(depth.dtype, jnp.integer):
    raise ValueError(f"depth must be int[{', '.join(map(str, shape))}], got "
                     f"{depth.dtype}{list(depth.shape)}")
  if not isinstance(depth, jax.core.Tracer):
    d = np.asarray(depth)
    if d.size and (d.min() < 0 or d.max() > max_loops):
      raise ValueError(f"depth values must be in [0, max_loops={max_loops}], got "
                       f"[{d.min()}, {d.max()}]")
  return depth.astype(jnp.int32)


class LoopedLM(nn.Module):
  """Token ids int32[B, L] -> next-token logits float32[B, L, V] with per-token depth.

  ``apply(v, tokens, key, depth_BxL=None)`` (dense) returns ``(logits, depth)``: the
  depths used (``depth_BxL`` where > 0, else the rule's).
  ``apply(v, tokens, key, cache=looped_cache)`` (deferred) returns ``(logits,
  cache)``: ``tokens`` are the positions after ``cache.kv.length``; the cache's preset
  depths force, and the depths used are recorded. Logits are NaN if the write
  overflows the cache.
  """

  config: TransformerConfig
  loop: LoopConfig = LoopConfig()

  @nn.compact
  def __call__(self, tokens_BxL: jax.Array, key: jax.Array,
               depth_BxL: jax.Array | None = None, cache: LoopedCache | None = None):
    cfg, rmax, nl = self.config, self.loop.max_loops, self.config.num_layers
    if cfg.num_experts:
      raise ValueError("LoopedLM uses a dense feed-forward (num_experts=0)")
    if tokens_BxL.ndim != 2:
      raise ValueError(f"tokens must be [batch, length], got shape {tokens_BxL.shape}")
    b, length = tokens_BxL.shape
    if length > cfg.max_len:
      raise ValueError(f"sequence length {length} exceeds max_len={cfg.max_len}")
    if cache is not None and depth_BxL is not None:
      raise ValueError("give depth_BxL (dense) or a cache with preset depths, not both")
    if cache is not None:
      if not isinstance(cache, LoopedCache):
        raise TypeError(f"cache must be a LoopedCache, got {type(cache).__name__}")
      check_cache(cache.kv, cfg, b, rmax * nl, length)
      start = cache.kv.length
      forced_BxL = lax.dynamic_slice(cache.depth, (0, start), (b, length))
    else:
      start = None
      forced_BxL = (jnp.zeros((b, length), jnp.int32) if depth_BxL is None
                    else _check_depth(depth_BxL, (b, length), rmax))

    embed = nn.Embed(cfg.vocab_size, cfg.d_model, embedding_init=nn.initializers.normal(1.0),
                     name="embed")
    pos = self.param("pos_embed", nn.initializers.normal(0.02), (cfg.max_len, cfg.d_model))
    pos_LxD = pos[:length] if cache is None else lax.dynamic_slice_in_dim(pos, start, length)
    h_BxLxD = embed(tokens_BxL) + pos_LxD[None]
    residual_scale = (2.0 * nl * rmax) ** -0.5
    stack = [Block(cfg, residual_scale, name=f"block_{i}") for i in range(nl)]
    final_norm = nn.RMSNorm(name="final_norm")
    gate = (Linear(1, name="exit_gate")
            if self.loop.halting == "threshold" else None)

    forced = forced_BxL > 0
    running = jnp.ones((b, length), bool)
    survive = jnp.ones((b, length), jnp.float32)
    depth_used = jnp.zeros((b, length), jnp.int32)
    keys, values = [], []
    for r in range(rmax):
      active = jnp.where(forced, r < forced_BxL, running)
      x_BxLxD = h_BxLxD
      for i, block in enumerate(stack):
        layer_key = jax.random.fold_in(key, r * nl + i)
        if cache is None:
          x_BxLxD = block(x_BxLxD, layer_key)
        else:
          j = r * nl + i
          x_BxLxD, (k_j, v_j) = block(x_BxLxD, layer_key,
                                      (cache.kv.keys[j], cache.kv.values[j]), start)
          keys.append(k_j)
          values.append(v_j)
      h_BxLxD = jnp.where(active[..., None], x_BxLxD, h_BxLxD)
      depth_used = depth_used + active.astype(jnp.int32)
      if gate is not None:
        gate_key = jax.random.fold_in(key, rmax * nl + 1 + r)
        lam = jax.nn.sigmoid(gate(final_norm(h_BxLxD), gate_key)[..., 0])
        self.sow("intermediates", "exit_probability", lam)
        survive = survive * (1.0 - lam)
        running = running & ~(1.0 - survive >= jnp.float32(self.loop.threshold))

    logits = Linear(cfg.vocab_size, name="head")(
        final_norm(h_BxLxD), jax.random.fold_in(key, rmax * nl))
    if cache is None:
      return logits, depth_used
    new_kv = kv_quant.KVCache(tuple(keys), tuple(values), start + length)
    new_depth = lax.dynamic_update_slice(cache.depth, depth_used, (0, start))
    return poison_overflow(logits, cache.kv, length), LoopedCache(new_kv, new_depth)


def init_cache(model: LoopedLM, batch: int, length: int,
               key_spec: kv_quant.KVQuantSpec = kv_quant.KVQuantSpec(),
               value_spec: kv_quant.KVQuantSpec | None = None, *,
               depth_BxS: jax.Array | None = None, key_scales: Any = None,
               value_scales: Any = None) -> LoopedCache:
  """An empty :class:`LoopedCache` of ``length`` positions; ``depth_BxS`` presets
  (forces) depths, default all 0 (the rule decides). Scales: one per (loop, layer),
  as :func:`models.kv_cache.init_cache`."""
  cfg = model.config
  kv = kv_cache_lib.init_cache(cfg, batch, length, key_spec, value_spec,
                               key_scales=key_scales, value_scales=value_scales,
                               num_layers=model.loop.max_loops * cfg.num_layers)
  depth = (jnp.zeros((batch, length), jnp.int32) if depth_BxS is None
           else _check_depth(depth_BxS, (batch, length), model.loop.max_loops))
  return LoopedCache(kv, depth)


def cached_looped(model: LoopedLM, key_spec: kv_quant.KVQuantSpec = kv_quant.KVQuantSpec(),
                  value_spec: kv_quant.KVQuantSpec | None = None, *,
                  key_scales: Any = None, value_scales: Any = None
                  ) -> sampling.CachedModel:
  """``model``'s deferred path as a :class:`models.sampling.CachedModel` (``params``:
  the ``params`` collection); its caches store keys and values per the specs."""
  if not isinstance(model, LoopedLM):
    raise TypeError(f"model must be a LoopedLM, got {type(model).__name__}")

  def make(batch: int, length: int) -> LoopedCache:
    return init_cache(model, batch, length, key_spec, value_spec, key_scales=key_scales,
                      value_scales=value_scales)

  def apply(params, tokens, cache, key):
    return model.apply({"params": params}, tokens, key, cache=cache)

  return sampling.CachedModel(init_cache=make, apply=apply)


def rollout(model: LoopedLM, params: Any, prompts: jax.Array, num_new: int,
            key: jax.Array, *, key_spec: kv_quant.KVQuantSpec = kv_quant.KVQuantSpec(),
            value_spec: kv_quant.KVQuantSpec | None = None, temperature: float = 1.0,
            top_k: int = 0, top_p: float = 1.0) -> LoopedRollout:
  """Samples ``num_new`` tokens on the deferred path (as
  :func:`models.sampling.sample_cached`), recording every fed position's depth."""
  samples, cache = sampling.decode_cached(
      cached_looped(model, key_spec, value_spec), params, prompts, num_new, key,
      temperature=temperature, top_k=top_k, top_p=top_p)
  return LoopedRollout(samples.tokens, samples.logp, cache.depth)


def deferred_log_probs(model: LoopedLM, params: Any, tokens: jax.Array, prompt_len: int,
                       depth: jax.Array, key: jax.Array, *,
                       key_spec: kv_quant.KVQuantSpec = kv_quant.KVQuantSpec(),
                       value_spec: kv_quant.KVQuantSpec | None = None,
                       temperature: float = 1.0, top_k: int = 0,
                       top_p: float = 1.0) -> jax.Array:
  """float32[B, N]: the completion's log-probs on the deferred path, replayed
  teacher-forced with the recorded ``depth`` (int32[B, L]) and the rollout's ``key``
  and cache specs: the rollout's ``logp`` recomputed by the same operations."""
  b, length = tokens.shape
  cm = cached_looped(model, key_spec, value_spec)
  cache = init_cache(model, b, length, key_spec, value_spec, depth_BxS=depth)
  return sampling.cached_sequence_log_probs(cm, params, tokens, prompt_len, key,
                                            temperature=temperature, top_k=top_k,
                                            top_p=top_p, cache=cache)


def dense_log_probs(model: LoopedLM, params: Any, tokens: jax.Array, prompt_len: int,
                    depth: jax.Array, key: jax.Array, *, temperature: float = 1.0,
                    top_k: int = 0, top_p: float = 1.0) -> jax.Array:
  """float32[B, N]: the completion's log-probs from one dense pass over ``tokens``
  with the recorded ``depth`` (0 entries: the rule decides), processed as
  :func:`models.sampling.sequence_log_probs`. Differentiable in ``params``."""
  if not 1 <= prompt_len < tokens.shape[1]:
    raise ValueError(f"prompt_len must be in [1, {tokens.shape[1] - 1}], got {prompt_len}")
  logits, _ = model.apply({"params": params}, tokens, key, depth_BxL=depth)
  logp = sampling.processed_log_probs(logits[:, prompt_len - 1:-1], temperature, top_k,
                                      top_p)
  return jnp.take_along_axis(logp, tokens[:, prompt_len:, None], axis=-1)[..., 0]


def hybrid(replay: jax.Array, dense: jax.Array) -> jax.Array:
  """``sg(replay) + (dense - sg(dense))``: the value of ``replay`` (exactly, where
  ``dense`` is finite) with the gradient of ``dense``. The parentheses matter: in
  floating point ``(sg(replay) + dense) - sg(dense)`` need not equal ``replay``."""
  return lax.stop_gradient(replay) + (dense - lax.stop_gradient(dense))


def replay_log_probs(model: LoopedLM, params: Any, tokens: jax.Array, prompt_len: int,
                     depth: jax.Array, rollout_key: jax.Array, dense_key: jax.Array, *,
                     key_spec: kv_quant.KVQuantSpec = kv_quant.KVQuantSpec(),
                     value_spec: kv_quant.KVQuantSpec | None = None,
                     temperature: float = 1.0, top_k: int = 0,
                     top_p: float = 1.0) -> jax.Array:
  """float32[B, N]: the learner's hybrid log-probs, :func:`hybrid` of the deferred
  replay (no gradient is taken through it) and the dense pass. Equal to the
  rollout's ``logp`` bit for bit (given its ``rollout_key``, specs and processing)
  with the dense path's gradient."""
  proc = dict(temperature=temperature, top_k=top_k, top_p=top_p)
  replay = deferred_log_probs(model, lax.stop_gradient(params), tokens, prompt_len,
                              depth, rollout_key, key_spec=key_spec,
                              value_spec=value_spec, **proc)
  dense = dense_log_probs(model, params, tokens, prompt_len, depth, dense_key, **proc)
  return hybrid(replay, dense)
