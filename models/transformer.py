"""A small decoder-only transformer LM (Flax linen) whose every matmul is interceptable.

Quantization is never hard-wired and comes in one way: wrap the model with
:func:`models.quantize_model`. Each matmul -- the q/k/v/output projections, the two
attention products (q.k and p.v), the feed-forward layers (dense, or the grouped expert
GEMMs and the router of a mixture-of-experts layer) and the LM head -- is
:func:`fp32_dot_general` (plain float32), which the rules intercept per module path
(``block_<i>/qkv``, ``block_<i>/attn_out``, ``block_<i>/ff_in``, ``block_<i>/ff_out``,
``block_<i>/moe`` for the expert GEMMs, ``block_<i>/moe/router``, ``head``; the two
attention products run in ``block_<i>`` itself). Each matmul gets its own PRNG key
(derived from the step key by ``fold_in`` per layer and per matmul), which the
interception hands to a recipe that draws random numbers, so stochastic rounding is
independent everywhere; deterministic recipes ignore it. Parameters, norms and softmax
stay in float32.

With ``compensation_rank > 0`` each block projection (q/k/v, output, and the dense
feed-forward layers; not the expert GEMMs, router or LM head) carries ALTO's trainable
low-rank compensation branch (:class:`Linear`), whose two GEMMs run under the
projection's rule.

With ``num_experts > 0`` every block's feed-forward is a top-k mixture of experts
(:class:`MoEFeedForward`): capacity-limited dispatch into per-expert buffers, two grouped
GEMMs with the experts as the dot_general batch dimension (so a recipe's blocks and
tiles are per expert, as in a grouped GEMM), and a Switch-style load-balancing loss
sown into the ``losses`` collection (apply with ``mutable=["losses", "metrics"]`` to
collect it; without ``mutable`` it is not computed into anything).

Cached decoding: ``DecoderLM`` and ``Block`` also take a KV cache
(:mod:`numerics.kv_quant`, fp32 or quantized) and then process a few new positions
against it (see :mod:`models.kv_cache`); the parameters are the same.

Shapes: B batch, L sequence, S cached positions, D d_model, H heads, K head dim, F d_ff,
V vocab, T tokens (B*L), E experts, C expert capacity.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from lowprec.models import quantization
from lowprec.numerics import kv_quant

DimensionNumbers = Tuple[Tuple[Sequence[int], Sequence[int]], Tuple[Sequence[int], Sequence[int]]]
DotGeneral = Callable[[jax.Array, jax.Array, DimensionNumbers, jax.Array], jax.Array]

# Stable per-matmul tags: a layer's key is fold_in(step_key, layer), a matmul's key is
# fold_in(layer_key, tag), so adding a layer never reshuffles another layer's randomness.
(_QKV, _SCORES, _VALUES, _ATTN_OUT, _FF_IN, _FF_OUT, _ROUTER, _EXPERT_IN, _EXPERT_OUT,
 _KV_KEYS, _KV_VALUES) = range(11)


def fp32_dot_general(lhs: jax.Array, rhs: jax.Array, dimension_numbers: DimensionNumbers,
                     key: jax.Array | None) -> jax.Array:
  """Plain float32 dot_general (HIGHEST precision, float32 out): every matmul of
  :class:`DecoderLM`. Gradients are autodiff's.

  Under :func:`models.quantize_model` the op follows its module's rule and a recipe that
  draws random numbers uses ``key`` (this model's per-matmul key scheme); otherwise
  ``key`` is unused.
  """
  return quantization.dot_general(lhs.astype(jnp.float32), rhs.astype(jnp.float32),
                                  dimension_numbers, precision=lax.Precision.HIGHEST,
                                  preferred_element_type=jnp.float32, key=key)


def bf16_dot_general(lhs: jax.Array, rhs: jax.Array, dimension_numbers: DimensionNumbers,
                     key: jax.Array | None) -> jax.Array:
  """bf16 operands (round to nearest even), float32 accumulation and output, with the
  ``(lhs, rhs, dimension_numbers, key)`` signature (``key`` unused). Gradients are
  autodiff's (the transposed GEMMs in bf16 x bf16 -> float32)."""
  del key
  return lax.dot_general(lhs.astype(jnp.bfloat16), rhs.astype(jnp.bfloat16),
                         dimension_numbers, preferred_element_type=jnp.float32)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Model hyperparameters (all static)."""

  vocab_size: int
  d_model: int = 128
  num_layers: int = 4
  num_heads: int = 4
  d_ff: int = 512  # the hidden width of each expert when num_experts > 0
  max_len: int = 256
  num_experts: int = 0  # 0: dense feed-forward
  experts_per_token: int = 2
  moe_capacity_factor: float = 1.25
  moe_balance_coef: float = 0.01
  compensation_rank: int = 0  # ALTO's low-rank branch on the block projections; 0: none

  def __post_init__(self):
    if self.compensation_rank < 0:
      raise ValueError(f"compensation_rank must be >= 0, got {self.compensation_rank}")
    for name in ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "max_len"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
    if self.d_model % self.num_heads:
      raise ValueError(f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}")
    if self.num_experts < 0:
      raise ValueError(f"num_experts must be >= 0, got {self.num_experts}")
    if self.num_experts and not 1 <= self.experts_per_token <= self.num_experts:
      raise ValueError(f"experts_per_token must be in [1, num_experts={self.num_experts}], "
                       f"got {self.experts_per_token}")
    if self.moe_capacity_factor <= 0 or self.moe_balance_coef < 0:
      raise ValueError("moe_capacity_factor must be > 0 and moe_balance_coef >= 0")


class Linear(nn.Module):
  """``x[..., in] @ kernel[in, out]`` through :func:`fp32_dot_general` (no bias).

  With ``rank > 0`` it adds ALTO's low-rank compensation branch (its report §3.8,
  ``alto.nn.DecomposedLinear``), trained with the layer:

      y = x @ kernel + ((x @ comp_v) * comp_sigma) @ comp_u

  ``comp_v [in, r]`` starts at zeros, ``comp_u [r, out]`` at N(0, 0.02^2) and
  ``comp_sigma [r]`` at ones (ALTO's initialization), so the branch starts at zero
  output. Its two GEMMs are :func:`fp32_dot_general` in this module, so a quantized
  model's rule for the projection quantizes them as it does the main GEMM (ALTO:
  ``comp_u`` and ``comp_v`` are MXFP4 weights, ``comp_sigma`` stays float32); their
  keys are ``fold_in(key, 1)`` and ``fold_in(key, 2)``, the main GEMM keeps ``key``.
  """

  features: int
  init_scale: float = 1.0
  rank: int = 0

  @nn.compact
  def __call__(self, x: jax.Array, key: jax.Array) -> jax.Array:
    fan_in = x.shape[-1]
    kernel = self.param("kernel", nn.initializers.normal(self.init_scale / fan_in**0.5),
                        (fan_in, self.features), jnp.float32)
    contract_last = (((x.ndim - 1,), (0,)), ((), ()))
    y = fp32_dot_general(x, kernel, contract_last, key)
    if not self.rank:
      return y
    comp_v = self.param("comp_v", nn.initializers.zeros, (fan_in, self.rank), jnp.float32)
    comp_sigma = self.param("comp_sigma", nn.initializers.ones, (self.rank,), jnp.float32)
    comp_u = self.param("comp_u", nn.initializers.normal(0.02), (self.rank, self.features),
                        jnp.float32)
    xv = fp32_dot_general(x, comp_v, contract_last, jax.random.fold_in(key, 1)) * comp_sigma
    return y + fp32_dot_general(xv, comp_u, contract_last, jax.random.fold_in(key, 2))


def expert_capacity(num_tokens: int, config: TransformerConfig) -> int:
  """Slots per expert: ``ceil(capacity_factor * tokens * k / experts)``."""
  return max(1, math.ceil(config.moe_capacity_factor * num_tokens * config.experts_per_token
                          / config.num_experts))


class MoEFeedForward(nn.Module):
  """Top-k mixture-of-experts GELU MLP: float32[T, D] -> float32[T, D].

  Routing: ``softmax(x W_router)`` over E experts, the top k kept and renormalised to
  sum to 1 (the gates). Dispatch is choice-major (every token's first choice is placed
  before any second choice), first come first served into C slots per expert; an
  assignment past capacity is dropped (its token gets no output from that expert, the
  residual carries it). The expert GEMMs are ``[E, C, D] x [E, D, F]`` and
  ``[E, C, F] x [E, F, D]`` dot_generals batched over E. Sown: ``losses/moe_balance``
  = coef * E * sum_e f_e P_e (f_e: fraction of assignments to e, P_e: mean router
  probability), ``metrics/moe_dropped`` (fraction of assignments dropped).
  """

  config: TransformerConfig
  residual_scale: float

  @nn.compact
  def __call__(self, x_TxD: jax.Array, key: jax.Array) -> jax.Array:
    cfg = self.config
    e, k, f = cfg.num_experts, cfg.experts_per_token, cfg.d_ff
    t, d = x_TxD.shape
    c = expert_capacity(t, cfg)
    sub = lambda tag: jax.random.fold_in(key, tag)

    logits_TxE = Linear(e, name="router")(x_TxD, sub(_ROUTER))
    probs_TxE = jax.nn.softmax(logits_TxE.astype(jnp.float32), axis=-1)
    top_p_TxK, top_e_TxK = lax.top_k(probs_TxE, k)
    gates_TxK = top_p_TxK / jnp.sum(top_p_TxK, axis=-1, keepdims=True)

    expert_A = top_e_TxK.T.reshape(-1)  # A = k*T assignments, choice-major
    onehot_AxE = jax.nn.one_hot(expert_A, e, dtype=jnp.int32)
    position_A = jnp.sum((jnp.cumsum(onehot_AxE, axis=0) - 1) * onehot_AxE, axis=-1)
    kept_A = position_A < c
    overflow = e * c  # one spare row takes every dropped assignment
    slot_A = jnp.where(kept_A, expert_A * c + position_A, overflow)
    token_A = jnp.tile(jnp.arange(t), k)
    buffer = jnp.zeros((e * c + 1, d), x_TxD.dtype).at[slot_A].set(x_TxD[token_A])
    x_ExCxD = buffer[:overflow].reshape(e, c, d)

    w_in = self.param("w_in", nn.initializers.normal(d**-0.5), (e, d, f), jnp.float32)
    w_out = self.param("w_out", nn.initializers.normal(self.residual_scale * f**-0.5),
                       (e, f, d), jnp.float32)
    grouped = (((2,), (1,)), ((0,), (0,)))
    h_ExCxF = jax.nn.gelu(fp32_dot_general(x_ExCxD, w_in, grouped, sub(_EXPERT_IN)))
    y_ExCxD = fp32_dot_general(h_ExCxF, w_out, grouped, sub(_EXPERT_OUT))

    y_rows = jnp.concatenate([y_ExCxD.reshape(overflow, d), jnp.zeros((1, d), y_ExCxD.dtype)])
    weight_A = gates_TxK.T.reshape(-1) * kept_A
    out_TxD = (y_rows[slot_A] * weight_A[:, None]).reshape(k, t, d).sum(axis=0)

    fraction_E = jnp.mean(onehot_AxE.astype(jnp.float32), axis=0)
    balance = e * jnp.sum(fraction_E * jnp.mean(probs_TxE, axis=0))
    self.sow("losses", "moe_balance", cfg.moe_balance_coef * balance)
    # The dropped ones counted, not 1 - mean(kept): under jit XLA:CPU contracted that
    # into an FMA, which logged -1.5e-8 for a step that dropped nothing.
    self.sow("metrics", "moe_dropped", jnp.mean(jnp.logical_not(kept_A).astype(jnp.float32)))
    return out_TxD


class Block(nn.Module):
  """Pre-norm causal self-attention + GELU MLP (dense or MoE), both residual.

  Called as ``block(x, key)``: full causal self-attention over the L positions of x,
  returns x. Called as ``block(x, key, kv=(keys, values), start=start)`` with this
  layer's cache (:class:`numerics.kv_quant.QuantizedKV`, logically [B, H, S, K]): x
  holds positions ``start .. start + L - 1``; their keys and values are written into
  the cache (rounded as its spec says, with keys ``fold_in(key, 9)`` and
  ``fold_in(key, 10)``) and each query attends over all S cached positions read back
  in float32, those after it masked as in the full path; returns ``(x, (keys,
  values))``. With an fp32 cache and ``S`` equal to the full path's length, both
  paths run the same attention arithmetic on the same lengths (only the number of
  query rows differs). Dense feed-forward only (MoE capacity depends on L).
  """

  config: TransformerConfig
  residual_scale: float

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, key: jax.Array,
               kv: tuple[kv_quant.QuantizedKV, kv_quant.QuantizedKV] | None = None,
               start: jax.Array | None = None):
    cfg = self.config
    b, length, d = x_BxLxD.shape
    h, k = cfg.num_heads, d // cfg.num_heads
    sub = lambda tag: jax.random.fold_in(key, tag)
    if (kv is None) != (start is None):
      raise ValueError("kv and start go together: give both or neither")
    if kv is not None and cfg.num_experts:
      raise ValueError("cached decoding supports the dense feed-forward only: an MoE "
                       "layer's expert capacity depends on the number of tokens per call")

    y = nn.RMSNorm(name="attn_norm")(x_BxLxD)
    rank = cfg.compensation_rank
    qkv = Linear(3 * d, rank=rank, name="qkv")(y, sub(_QKV))
    q, kk, v = jnp.split(qkv.reshape(b, length, 3, h, k), 3, axis=2)
    q_BxHxLxK, k_BxHxLxK, v_BxHxLxK = (t[:, :, 0].transpose(0, 2, 1, 3) for t in (q, kk, v))
    if kv is None:
      keys_BxHxSxK, values_BxHxSxK = k_BxHxLxK, v_BxHxLxK
      causal = jnp.tril(jnp.ones((length, length), bool))
    else:
      cached_k = kv_quant.write(kv[0], k_BxHxLxK, start, sub(_KV_KEYS))
      cached_v = kv_quant.write(kv[1], v_BxHxLxK, start, sub(_KV_VALUES))
      keys_BxHxSxK, values_BxHxSxK = kv_quant.read(cached_k), kv_quant.read(cached_v)
      query_pos = start + jnp.arange(length)
      causal = jnp.arange(keys_BxHxSxK.shape[2])[None, :] <= query_pos[:, None]
    scores_BxHxLxS = fp32_dot_general(q_BxHxLxK, keys_BxHxSxK,
                                      (((3,), (3,)), ((0, 1), (0, 1))),
                                      sub(_SCORES)) / jnp.sqrt(jnp.float32(k))
    scores_BxHxLxS = jnp.where(causal, scores_BxHxLxS, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores_BxHxLxS, axis=-1)
    attn_BxHxLxK = fp32_dot_general(probs, values_BxHxSxK, (((3,), (2,)), ((0, 1), (0, 1))),
                                    sub(_VALUES))
    attn_BxLxD = attn_BxHxLxK.transpose(0, 2, 1, 3).reshape(b, length, d)
    x_BxLxD = x_BxLxD + Linear(d, self.residual_scale, rank, name="attn_out")(
        attn_BxLxD, sub(_ATTN_OUT))

    y = nn.RMSNorm(name="mlp_norm")(x_BxLxD)
    if cfg.num_experts:
      moe = MoEFeedForward(cfg, self.residual_scale, name="moe")
      return x_BxLxD + moe(y.reshape(b * length, d), key).reshape(b, length, d)
    y = jax.nn.gelu(Linear(cfg.d_ff, rank=rank, name="ff_in")(y, sub(_FF_IN)))
    x_BxLxD = x_BxLxD + Linear(d, self.residual_scale, rank, name="ff_out")(y, sub(_FF_OUT))
    return x_BxLxD if kv is None else (x_BxLxD, (cached_k, cached_v))


class DecoderLM(nn.Module):
  """Token ids int32[B, L] -> next-token logits float32[B, L, V].

  ``model.apply(variables, tokens, key)`` runs the whole sequence.
  ``model.apply(variables, tokens, key, cache=cache)`` with a
  :class:`numerics.kv_quant.KVCache` (one layer per block, S <= ``max_len``) decodes
  incrementally: ``tokens`` are positions ``cache.length .. cache.length + L - 1``
  (a prefill, then one token at a time) and it returns ``(logits, cache)`` with the
  new positions written. The parameters are the same either way. A call that would
  write past the cache's S positions returns NaN logits (``cache.length`` is traced,
  so it cannot raise). Cached decoding needs a dense feed-forward (no MoE).
  """

  config: TransformerConfig

  @nn.compact
  def __call__(self, tokens_BxL: jax.Array, key: jax.Array,
               cache: kv_quant.KVCache | None = None):
    cfg = self.config
    if tokens_BxL.ndim != 2:
      raise ValueError(f"tokens must be [batch, length], got shape {tokens_BxL.shape}")
    length = tokens_BxL.shape[1]
    if length > cfg.max_len:
      raise ValueError(f"sequence length {length} exceeds max_len={cfg.max_len}")
    if cache is not None:
      check_cache(cache, cfg, tokens_BxL.shape[0], cfg.num_layers, length)
    embed = nn.Embed(cfg.vocab_size, cfg.d_model, embedding_init=nn.initializers.normal(1.0),
                     name="embed")
    pos = self.param("pos_embed", nn.initializers.normal(0.02), (cfg.max_len, cfg.d_model))
    if cache is None:
      x_BxLxD = embed(tokens_BxL) + pos[None, :length]
    else:
      x_BxLxD = embed(tokens_BxL) + lax.dynamic_slice_in_dim(pos, cache.length, length)[None]
    # GPT-2 style: scale residual-branch outputs by 1/sqrt(2 * layers) to keep the
    # residual stream's variance from growing with depth.
    residual_scale = (2.0 * cfg.num_layers) ** -0.5
    keys, values = [], []
    for i in range(cfg.num_layers):
      block = Block(cfg, residual_scale, name=f"block_{i}")
      if cache is None:
        x_BxLxD = block(x_BxLxD, jax.random.fold_in(key, i))
      else:
        x_BxLxD, (k_i, v_i) = block(x_BxLxD, jax.random.fold_in(key, i),
                                    (cache.keys[i], cache.values[i]), cache.length)
        keys.append(k_i)
        values.append(v_i)
    x_BxLxD = nn.RMSNorm(name="final_norm")(x_BxLxD)
    logits = Linear(cfg.vocab_size, name="head")(
        x_BxLxD, jax.random.fold_in(key, cfg.num_layers))
    if cache is None:
      return logits
    return (poison_overflow(logits, cache, length),
            kv_quant.KVCache(tuple(keys), tuple(values), cache.length + length))


def check_cache(cache: kv_quant.KVCache, cfg: TransformerConfig, batch: int,
                num_layers: int, length: int) -> None:
  """Raises ValueError unless ``cache`` fits a model of ``cfg`` with ``num_layers``
  attention layers and a call of ``batch`` x ``length`` tokens."""
  if not isinstance(cache, kv_quant.KVCache):
    raise TypeError(f"cache must be a lowprec.numerics.kv_quant.KVCache, got "
                    f"{type(cache).__name__}")
  if len(cache.keys) != num_layers or len(cache.values) != num_layers:
    raise ValueError(f"the cache has {len(cache.keys)} key and {len(cache.values)} value "
                     f"layers; the model has {num_layers}")
  want = (batch, cfg.num_heads, cfg.d_model // cfg.num_heads)
  for c in cache.keys + cache.values:
    b, h, s, k = c.shape
    if (b, h, k) != want or s > cfg.max_len:
      raise ValueError(f"cache layer shape {c.shape} does not fit [B={want[0]}, "
                       f"H={want[1]}, S<={cfg.max_len}, K={want[2]}]")
  if length > cache.capacity:
    raise ValueError(f"{length} tokens do not fit a cache of {cache.capacity} positions")


def poison_overflow(logits: jax.Array, cache: kv_quant.KVCache, length: int) -> jax.Array:
  """``logits``, or NaN where writing ``length`` positions overflowed ``cache``."""
  overflow = cache.length + length > cache.capacity
  return jnp.where(overflow, jnp.float32(jnp.nan), logits)


def next_token_loss(logits_BxLxV: jax.Array, targets_BxL: jax.Array,
                    mask_BxL: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Mean cross-entropy (nats/token) and accuracy over the (masked) positions."""
  logp = jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), axis=-1)
  nll_BxL = -jnp.take_along_axis(logp, targets_BxL[..., None], axis=-1)[..., 0]
  correct_BxL = (jnp.argmax(logits_BxLxV, axis=-1) == targets_BxL).astype(jnp.float32)
  if mask_BxL is None:
    mask_BxL = jnp.ones_like(nll_BxL)
  denom = jnp.maximum(mask_BxL.sum(), 1.0)
  return (nll_BxL * mask_BxL).sum() / denom, (correct_BxL * mask_BxL).sum() / denom
