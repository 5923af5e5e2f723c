"""A small decoder-only transformer LM (Flax linen) with every matmul injected.

Quantization is never hard-wired: each matmul -- the q/k/v/output projections, the two
attention products (q.k and p.v), the feed-forward layers and the LM head -- calls the
``dot_general(lhs, rhs, dimension_numbers, key) -> float32`` passed in. The ``key`` is the
per-call PRNG key (derived from the step key by ``fold_in`` per layer and per matmul) so
stochastic-rounding recipes get independent randomness everywhere; deterministic recipes
ignore it. Parameters, norms and softmax stay in float32.

Shapes: B batch, L sequence, D d_model, H heads, K head dim, F d_ff, V vocab.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

DimensionNumbers = Tuple[Tuple[Sequence[int], Sequence[int]], Tuple[Sequence[int], Sequence[int]]]
DotGeneral = Callable[[jax.Array, jax.Array, DimensionNumbers, jax.Array], jax.Array]

# Stable per-matmul tags: a layer's key is fold_in(step_key, layer), a matmul's key is
# fold_in(layer_key, tag), so adding a layer never reshuffles another layer's randomness.
_QKV, _SCORES, _VALUES, _ATTN_OUT, _FF_IN, _FF_OUT = range(6)


def fp32_dot_general(lhs: jax.Array, rhs: jax.Array, dimension_numbers: DimensionNumbers,
                     key: jax.Array | None) -> jax.Array:
  """Plain float32 dot_general with the injected signature (``key`` unused)."""
  del key
  return lax.dot_general(lhs.astype(jnp.float32), rhs.astype(jnp.float32), dimension_numbers,
                         precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Model hyperparameters (all static)."""

  vocab_size: int
  d_model: int = 128
  num_layers: int = 4
  num_heads: int = 4
  d_ff: int = 512
  max_len: int = 256

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "max_len"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
    if self.d_model % self.num_heads:
      raise ValueError(f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}")


class Linear(nn.Module):
  """``x[..., in] @ kernel[in, out]`` through the injected dot_general (no bias)."""

  features: int
  dot_general: DotGeneral
  init_scale: float = 1.0

  @nn.compact
  def __call__(self, x: jax.Array, key: jax.Array) -> jax.Array:
    fan_in = x.shape[-1]
    kernel = self.param("kernel", nn.initializers.normal(self.init_scale / fan_in**0.5),
                        (fan_in, self.features), jnp.float32)
    return self.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())), key)


class Block(nn.Module):
  """Pre-norm causal self-attention + GELU MLP, both residual.

  ``dot_general`` serves the four projections; ``attention_dot_general`` the two
  attention products (q.k and p.v), defaulting to ``dot_general``.
  """

  config: TransformerConfig
  dot_general: DotGeneral
  residual_scale: float
  attention_dot_general: DotGeneral | None = None

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, key: jax.Array) -> jax.Array:
    cfg, dg = self.config, self.dot_general
    adg = self.attention_dot_general or dg
    b, length, d = x_BxLxD.shape
    h, k = cfg.num_heads, d // cfg.num_heads
    sub = lambda tag: jax.random.fold_in(key, tag)

    y = nn.RMSNorm(name="attn_norm")(x_BxLxD)
    qkv = Linear(3 * d, dg, name="qkv")(y, sub(_QKV))
    q, kk, v = jnp.split(qkv.reshape(b, length, 3, h, k), 3, axis=2)
    q_BxHxLxK, k_BxHxLxK, v_BxHxLxK = (t[:, :, 0].transpose(0, 2, 1, 3) for t in (q, kk, v))
    scores_BxHxLxL = adg(q_BxHxLxK, k_BxHxLxK, (((3,), (3,)), ((0, 1), (0, 1))),
                        sub(_SCORES)) / jnp.sqrt(jnp.float32(k))
    causal = jnp.tril(jnp.ones((length, length), bool))
    scores_BxHxLxL = jnp.where(causal, scores_BxHxLxL, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores_BxHxLxL, axis=-1)
    attn_BxHxLxK = adg(probs, v_BxHxLxK, (((3,), (2,)), ((0, 1), (0, 1))), sub(_VALUES))
    attn_BxLxD = attn_BxHxLxK.transpose(0, 2, 1, 3).reshape(b, length, d)
    x_BxLxD = x_BxLxD + Linear(d, dg, self.residual_scale, name="attn_out")(
        attn_BxLxD, sub(_ATTN_OUT))

    y = nn.RMSNorm(name="mlp_norm")(x_BxLxD)
    y = jax.nn.gelu(Linear(cfg.d_ff, dg, name="ff_in")(y, sub(_FF_IN)))
    return x_BxLxD + Linear(d, dg, self.residual_scale, name="ff_out")(y, sub(_FF_OUT))


class DecoderLM(nn.Module):
  """Token ids int32[B, L] -> next-token logits float32[B, L, V]."""

  config: TransformerConfig
  dot_general: DotGeneral = fp32_dot_general
  attention_dot_general: DotGeneral | None = None  # None: dot_general
  head_dot_general: DotGeneral | None = None  # None: dot_general

  @nn.compact
  def __call__(self, tokens_BxL: jax.Array, key: jax.Array) -> jax.Array:
    cfg = self.config
    if tokens_BxL.ndim != 2:
      raise ValueError(f"tokens must be [batch, length], got shape {tokens_BxL.shape}")
    length = tokens_BxL.shape[1]
    if length > cfg.max_len:
      raise ValueError(f"sequence length {length} exceeds max_len={cfg.max_len}")
    embed = nn.Embed(cfg.vocab_size, cfg.d_model, embedding_init=nn.initializers.normal(1.0),
                     name="embed")
    pos = self.param("pos_embed", nn.initializers.normal(0.02), (cfg.max_len, cfg.d_model))
    x_BxLxD = embed(tokens_BxL) + pos[None, :length]
    # GPT-2 style: scale residual-branch outputs by 1/sqrt(2 * layers) to keep the
    # residual stream's variance from growing with depth.
    residual_scale = (2.0 * cfg.num_layers) ** -0.5
    for i in range(cfg.num_layers):
      x_BxLxD = Block(cfg, self.dot_general, residual_scale, self.attention_dot_general,
                      name=f"block_{i}")(x_BxLxD, jax.random.fold_in(key, i))
    x_BxLxD = nn.RMSNorm(name="final_norm")(x_BxLxD)
    return Linear(cfg.vocab_size, self.head_dot_general or self.dot_general, name="head")(
        x_BxLxD, jax.random.fold_in(key, cfg.num_layers))


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
