"""Outlier key channels injected into a trained ``DecoderLM`` without changing its function.

Real LLM keys carry a few channels far larger than the rest (Qwen2.5's come from its
QKV bias), which is what saturates a KV cache stored in FP8 with scale 1. The small
arithmetic model has none (its keys stay below 10 in magnitude), so
:func:`scale_key_channels` makes them: key channel ``c`` of every head in every block
is multiplied by ``2^gain_log2`` and the matching query channel by ``2^-gain_log2``
(columns of the fused ``qkv`` kernel). The model has no rotary embedding, so each
score term ``q_c k_c`` is unchanged; with a power-of-two gain every product and
partial sum of the projection is scaled exactly, so in float32 the model's logits are
*bit for bit* those of the original (tested) while the keys it writes into a cache
are ``2^gain_log2`` times larger in those channels (as long as nothing overflows or
underflows float32).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np


def scale_key_channels(params: Any, num_heads: int, gain_log2: int,
                       channels: int = 0) -> Any:
  """``params`` of a ``DecoderLM`` with its key channels scaled by ``2^gain_log2``.

  Args:
    params: the ``params`` collection (blocks named ``block_<i>`` with a ``qkv``
      kernel float32[D, 3D], output columns ordered (q|k|v, head, channel)).
    num_heads: the model's heads H (head dim K = D / H).
    gain_log2: the power of two (an int; 0 returns ``params`` unchanged).
    channels: how many channels per head, the first ones (0: all K).

  Returns:
    New params; the queries' matching columns are scaled by ``2^-gain_log2``.
  """
  if isinstance(gain_log2, bool) or not isinstance(gain_log2, (int, np.integer)):
    raise TypeError(f"gain_log2 must be an int (a power-of-two gain keeps the model "
                    f"exact), got {gain_log2!r}")
  if not -60 <= gain_log2 <= 60:
    raise ValueError(f"gain_log2 must be in [-60, 60] (float32 range), got {gain_log2}")
  blocks = [k for k in params if k.startswith("block_")]
  if not blocks:
    raise ValueError("params hold no block_<i> (not a DecoderLM's params collection)")
  d = params[blocks[0]]["qkv"]["kernel"].shape[0]
  if d % num_heads:
    raise ValueError(f"d_model {d} is not divisible by num_heads {num_heads}")
  k = d // num_heads
  if not 0 <= channels <= k:
    raise ValueError(f"channels must be in [0, head dim {k}], got {channels}")
  if gain_log2 == 0:
    return params
  n = k if channels == 0 else channels
  chosen = np.zeros((num_heads, k), bool)
  chosen[:, :n] = True
  gain = np.float32(2.0) ** np.float32(gain_log2)
  col = np.ones((3, num_heads, k), np.float32)
  col[0][chosen] = np.float32(1.0) / gain  # queries (exact: a power of two)
  col[1][chosen] = gain  # keys
  col = jnp.asarray(col.reshape(3 * d))
  out = dict(params)
  for name in blocks:
    block = dict(params[name])
    block["qkv"] = {**block["qkv"], "kernel": block["qkv"]["kernel"] * col[None, :]}
    out[name] = block
  return out
