"""Synthetic tasks: tiny, exactly specified problems for numerics ablations.

Each task is a pure function of ``(seed, position)`` like the real loaders, so it plugs
into the same train loop and resumes exactly.
"""

from __future__ import annotations

import numpy as np


def linear_regression_batch(*, seed: int, position: int, batch_size: int, dim: int,
                            noise: float = 0.0) -> dict[str, np.ndarray]:
  """``y = x @ w* + noise`` with a fixed ``w*`` drawn from ``seed``.

  Returns ``{"x": float32[B, dim], "y": float32[B]}``.
  """
  if dim < 1 or batch_size < 1:
    raise ValueError(f"dim and batch_size must be >= 1, got {dim}, {batch_size}")
  w = np.random.default_rng([seed, 0xFFFF]).standard_normal(dim).astype(np.float32)
  rng = np.random.default_rng([seed, position])
  x = rng.standard_normal((batch_size, dim)).astype(np.float32)
  y = x @ w + noise * rng.standard_normal(batch_size).astype(np.float32)
  return {"x": x, "y": y.astype(np.float32)}


def copy_task_batch(*, seed: int, position: int, batch_size: int, length: int,
                    vocab_size: int) -> dict[str, np.ndarray]:
  """Sequence copying for a decoder LM: ``[a_1..a_n, SEP, a_1..a_n]``.

  Token 0 is the separator; symbols are 1..vocab_size-1. Targets are the next token;
  ``mask`` is 1 only where the target is in the copied half (what the model can know).

  Returns int32 ``inputs``/``targets`` and float32 ``mask``, each [B, 2 * length].
  """
  if vocab_size < 2 or length < 1:
    raise ValueError(f"need vocab_size >= 2 and length >= 1, got {vocab_size}, {length}")
  rng = np.random.default_rng([seed, position])
  symbols = rng.integers(1, vocab_size, size=(batch_size, length), dtype=np.int32)
  sep = np.zeros((batch_size, 1), np.int32)
  seq = np.concatenate([symbols, sep, symbols], axis=1)
  mask = np.zeros((batch_size, 2 * length), np.float32)
  mask[:, length:] = 1.0
  return {"inputs": seq[:, :-1], "targets": seq[:, 1:], "mask": mask}
