"""Autoregressive sampling from a causal LM, recording the behaviour log-probabilities.

The sampler of an RL run draws each token from a *processed* distribution -- logits
divided by a temperature, then truncated to the top-k tokens and to the top-p nucleus
-- and the importance weights of the learner must use the log-probability of the token
under exactly that distribution. :func:`processed_log_probs` is that distribution and
:func:`sample` records it for every sampled token.

:func:`sample` has no KV cache: each step re-runs the model over a fixed-length buffer
(the model is causal, so positions past the current one do not affect its logits).
:func:`sample_cached` decodes through a :class:`CachedModel` instead (a prefill of the
prompt, then one token per step into the model's cache) and returns the same
:class:`Samples`, with the same keys and draws; :func:`cached_sequence_log_probs`
replays that decoding teacher-forced, which is how a learner reproduces a rollout
engine's log-probs exactly (same calls, same shapes, same keys).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

# apply_fn(params, tokens int32[B, L], key) -> logits float32[B, L, V]
ApplyFn = Callable[[Any, jax.Array, jax.Array], jax.Array]


class CachedModel(NamedTuple):
  """A decoder with a cache, as :func:`sample_cached` drives it.

  Attributes:
    init_cache: ``(batch, length) -> cache``, an empty cache for ``length`` positions.
    apply: ``(params, tokens int32[B, T], cache, key) -> (logits float32[B, T, V],
      cache)``: the logits of T new positions appended after those in the cache.
  """

  init_cache: Callable[[int, int], Any]
  apply: Callable[[Any, jax.Array, Any, jax.Array], tuple[jax.Array, Any]]


class Samples(NamedTuple):
  """``tokens`` int32[B, P + N] (prompt then completion), ``logp`` float32[B, N]: the
  log-probability of each completion token under the processed distribution it was
  drawn from."""

  tokens: jax.Array
  logp: jax.Array


def processed_log_probs(logits: jax.Array, temperature: float = 1.0, top_k: int = 0,
                        top_p: float = 1.0) -> jax.Array:
  """Log-probabilities of the sampling distribution: float32[..., V] -> float32[..., V].

  ``softmax(logits / temperature)`` restricted to the ``top_k`` largest logits
  (0: all) and then to the smallest set of tokens whose probability sums to at least
  ``top_p`` (the token that crosses ``top_p`` is kept; the top token always is),
  renormalised; excluded tokens get ``-inf``. Ties at the top-k boundary keep every
  tied token.
  """
  if not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature}")
  if top_k < 0:
    raise ValueError(f"top_k must be >= 0, got {top_k}")
  if not 0 < top_p <= 1:
    raise ValueError(f"top_p must be in (0, 1], got {top_p}")
  z = logits.astype(jnp.float32) / jnp.float32(temperature)
  if top_k and top_k < z.shape[-1]:
    kth = jax.lax.top_k(z, top_k)[0][..., -1:]
    z = jnp.where(z >= kth, z, -jnp.inf)
  if top_p < 1:
    logp = jax.nn.log_softmax(z, axis=-1)
    order = jnp.argsort(-z, axis=-1)
    sorted_p = jnp.take_along_axis(jnp.exp(logp), order, axis=-1)
    before = jnp.cumsum(sorted_p, axis=-1) - sorted_p  # mass of strictly better tokens
    keep_sorted = before < jnp.float32(top_p)
    keep = jnp.zeros_like(keep_sorted).at[
        tuple(jnp.indices(order.shape)[:-1]) + (order,)].set(keep_sorted)
    z = jnp.where(keep, z, -jnp.inf)
  return jax.nn.log_softmax(z, axis=-1)


def sample(apply_fn: ApplyFn, params: Any, prompts: jax.Array, num_new: int,
           key: jax.Array, *, temperature: float = 1.0, top_k: int = 0,
           top_p: float = 1.0) -> Samples:
  """Samples ``num_new`` tokens after each prompt.

  Args:
    apply_fn: the model, ``(params, tokens[B, L], key) -> logits[B, L, V]``; called on
      a buffer of length ``L = P + num_new`` (the model's ``max_len`` must allow it).
    params: the sampler's own weights (any precision the apply_fn uses).
    prompts: int32[B, P], all of length P.
    num_new: completion length N >= 1 (no early stop: mask after an end token later).
    key: PRNG key; step t uses ``fold_in(key, t)`` split into the model's and the draw's.

  Returns:
    :class:`Samples` with the behaviour log-probs of the processed distribution.
  """
  if prompts.ndim != 2 or not jnp.issubdtype(prompts.dtype, jnp.integer):
    raise ValueError(f"prompts must be int[B, P], got {prompts.dtype}{prompts.shape}")
  if num_new < 1:
    raise ValueError(f"num_new must be >= 1, got {num_new}")
  processed_log_probs(jnp.zeros((1,)), temperature, top_k, top_p)  # validate early
  b, p = prompts.shape
  buffer = jnp.concatenate([prompts.astype(jnp.int32),
                            jnp.zeros((b, num_new), jnp.int32)], axis=1)

  def step(t, carry):
    tokens, logps = carry
    model_key, draw_key = jax.random.split(jax.random.fold_in(key, t))
    logits = apply_fn(params, tokens, model_key)
    pos = p + t - 1  # the logits at position pos predict token pos + 1
    logp_BxV = processed_log_probs(jax.lax.dynamic_index_in_dim(logits, pos, 1, False),
                                   temperature, top_k, top_p)
    token_B = jax.random.categorical(draw_key, logp_BxV, axis=-1).astype(jnp.int32)
    chosen = jnp.take_along_axis(logp_BxV, token_B[:, None], axis=-1)[:, 0]
    tokens = jax.lax.dynamic_update_index_in_dim(tokens, token_B, p + t, 1)
    logps = jax.lax.dynamic_update_index_in_dim(logps, chosen, t, 1)
    return tokens, logps

  tokens, logps = jax.lax.fori_loop(0, num_new, step,
                                    (buffer, jnp.zeros((b, num_new), jnp.float32)))
  return Samples(tokens, logps)


def sequence_log_probs(apply_fn: ApplyFn, params: Any, tokens: jax.Array,
                       prompt_len: int, key: jax.Array, *, temperature: float = 1.0,
                       top_k: int = 0, top_p: float = 1.0) -> jax.Array:
  """float32[B, N]: log-probs of the completion ``tokens[:, prompt_len:]`` under
  ``params`` (one teacher-forced forward pass), with the same processing as
  :func:`sample` -- the learner's recomputation of the sampler's ``logp``. Pass
  ``temperature=1`` for the learner's own (untempered) policy."""
  logits = apply_fn(params, tokens, key)
  logp = processed_log_probs(logits[:, prompt_len - 1:-1], temperature, top_k, top_p)
  return jnp.take_along_axis(logp, tokens[:, prompt_len:, None], axis=-1)[..., 0]


def _check_decode_args(prompts: jax.Array, num_new: int, temperature: float, top_k: int,
                       top_p: float) -> None:
  if prompts.ndim != 2 or not jnp.issubdtype(prompts.dtype, jnp.integer):
    raise ValueError(f"prompts must be int[B, P], got {prompts.dtype}{prompts.shape}")
  if prompts.shape[1] < 1:
    raise ValueError("prompts must hold at least one token")
  if num_new < 1:
    raise ValueError(f"num_new must be >= 1, got {num_new}")
  processed_log_probs(jnp.zeros((1,)), temperature, top_k, top_p)  # validate early


def _cached_decode(model: CachedModel, params: Any, prompts: jax.Array, num_new: int,
                   key: jax.Array, cache: Any, forced_BxN: jax.Array | None,
                   temperature: float, top_k: int, top_p: float
                   ) -> tuple[Samples, Any]:
  """The decoding loop shared by sampling and its teacher-forced replay.

  Both draw every token (so both run the same operations); with ``forced_BxN`` the
  forced token replaces the draw.
  """
  b, p = prompts.shape
  if cache is None:
    cache = model.init_cache(b, p + num_new)

  def choose(t, logits_BxV):
    draw_key = jax.random.split(jax.random.fold_in(key, t))[1]
    logp_BxV = processed_log_probs(logits_BxV, temperature, top_k, top_p)
    token_B = jax.random.categorical(draw_key, logp_BxV, axis=-1).astype(jnp.int32)
    if forced_BxN is not None:
      token_B = jax.lax.dynamic_index_in_dim(forced_BxN, t, 1, False)
    chosen_B = jnp.take_along_axis(logp_BxV, token_B[:, None], axis=-1)[:, 0]
    return token_B, chosen_B

  model_key = lambda t: jax.random.split(jax.random.fold_in(key, t))[0]
  logits, cache = model.apply(params, prompts.astype(jnp.int32), cache, model_key(0))
  token_B, chosen_B = choose(0, logits[:, -1])
  new_BxN = jnp.zeros((b, num_new), jnp.int32).at[:, 0].set(token_B)
  logps_BxN = jnp.zeros((b, num_new), jnp.float32).at[:, 0].set(chosen_B)

  def step(t, carry):
    new_BxN, logps_BxN, cache = carry
    fed_Bx1 = jax.lax.dynamic_slice_in_dim(new_BxN, t - 1, 1, 1)
    logits, cache = model.apply(params, fed_Bx1, cache, model_key(t))
    token_B, chosen_B = choose(t, logits[:, 0])
    new_BxN = jax.lax.dynamic_update_index_in_dim(new_BxN, token_B, t, 1)
    logps_BxN = jax.lax.dynamic_update_index_in_dim(logps_BxN, chosen_B, t, 1)
    return new_BxN, logps_BxN, cache

  new_BxN, logps_BxN, cache = jax.lax.fori_loop(1, num_new, step,
                                                 (new_BxN, logps_BxN, cache))
  tokens = jnp.concatenate([prompts.astype(jnp.int32), new_BxN], axis=1)
  return Samples(tokens, logps_BxN), cache


def sample_cached(model: CachedModel, params: Any, prompts: jax.Array, num_new: int,
                  key: jax.Array, *, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0, cache: Any = None) -> Samples:
  """:func:`sample` through a KV cache: a prefill of the prompt, then one token a step.

  Same arguments, keys and draws as :func:`sample` (step t's model key is
  ``split(fold_in(key, t))[0]``, its draw key ``[1]``; the prefill is step 0), so
  with equal logits the two return equal :class:`Samples` (the logits are equal
  where every GEMM's rows come out the same whatever the row count; see
  :mod:`models.kv_cache`). ``cache``: the empty cache to decode into (e.g. with
  calibrated static scales); ``None`` makes ``model.init_cache(B, P + num_new)``. Jit
  the call: its prefill runs outside the decoding loop, and eager and compiled
  XLA:CPU arithmetic can differ.
  """
  return decode_cached(model, params, prompts, num_new, key, temperature=temperature,
                       top_k=top_k, top_p=top_p, cache=cache)[0]


def decode_cached(model: CachedModel, params: Any, prompts: jax.Array, num_new: int,
                  key: jax.Array, *, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0, cache: Any = None) -> tuple[Samples, Any]:
  """:func:`sample_cached`, also returning the final cache (which holds every
  position but the last sampled token, never fed back)."""
  _check_decode_args(prompts, num_new, temperature, top_k, top_p)
  return _cached_decode(model, params, prompts, num_new, key, cache, None,
                        temperature, top_k, top_p)


def cached_sequence_log_probs(model: CachedModel, params: Any, tokens: jax.Array,
                              prompt_len: int, key: jax.Array, *,
                              temperature: float = 1.0, top_k: int = 0,
                              top_p: float = 1.0, cache: Any = None) -> jax.Array:
  """float32[B, N]: the completion's log-probs by replaying :func:`sample_cached`'s
  decoding teacher-forced (the prefill, then ``N - 1`` one-token steps with the same
  keys), so with the rollout's ``key`` and ``params`` it recomputes the rollout's
  ``logp`` with the same operations on the same shapes. ``cache``: the empty cache
  (``None``: ``model.init_cache(B, L)``; a looped model's carries the depths to
  replay). Differentiable in ``params`` through the model; a quantized cache passes
  no gradient through the stored keys and values (:mod:`numerics.kv_quant`)."""
  if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f"tokens must be int[B, L], got {tokens.dtype}{tokens.shape}")
  if not 1 <= prompt_len < tokens.shape[1]:
    raise ValueError(f"prompt_len must be in [1, {tokens.shape[1] - 1}], got {prompt_len}")
  prompts, completion = tokens[:, :prompt_len], tokens[:, prompt_len:].astype(jnp.int32)
  _check_decode_args(prompts, completion.shape[1], temperature, top_k, top_p)
  samples, _ = _cached_decode(model, params, prompts, completion.shape[1], key, cache,
                              completion, temperature, top_k, top_p)
  return samples.logp
