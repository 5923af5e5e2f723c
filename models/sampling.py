"""Autoregressive sampling from a causal LM, recording the behaviour log-probabilities.

The sampler of an RL run draws each token from a *processed* distribution -- logits
divided by a temperature, then truncated to the top-k tokens and to the top-p nucleus
-- and the importance weights of the learner must use the log-probability of the token
under exactly that distribution. :func:`processed_log_probs` is that distribution and
:func:`sample` records it for every sampled token.

No KV cache: each step re-runs the model over a fixed-length buffer (the model is
causal, so positions past the current one do not affect its logits). Meant for the
short sequences of the CPU-scale RL tasks.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

# apply_fn(params, tokens int32[B, L], key) -> logits float32[B, L, V]
ApplyFn = Callable[[Any, jax.Array, jax.Array], jax.Array]


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
