"""Procedural associative recall with key interference (the Memoir task, our construction).

Each sample is a stream of ``num_pairs`` (key, value) pairs and one query. Keys
interfere in two ways:

* **shared components**: every key is ``sqrt(shared) * p_g + sqrt(1 - shared) * u_i``
  (then unit-normalised), where ``p_g`` is one of ``num_groups`` per-sample prototype
  directions and ``u_i`` the key's own direction, so keys in one group have cosine
  about ``shared`` with each other;
* **noise**: the query is the stored key plus Gaussian noise of norm about
  ``query_noise`` (then unit-normalised), so recall cannot be exact key matching.

Values are class ids in ``[0, num_values)``; the target is the value stored with the
queried key, and recall is the fraction of queries whose value is predicted exactly
(chance ``1 / num_values``). Everything is a pure function of ``(seed, position)``, like
the project's other loaders, so training resumes exactly and evaluation sets are fixed.
"""

from __future__ import annotations

import dataclasses

import numpy as np

# Evaluation batches draw from positions the training stream never reaches.
_EVAL_OFFSET = 1 << 40


@dataclasses.dataclass(frozen=True)
class RecallTaskSpec:
  """The task's shape and difficulty."""

  num_pairs: int = 12
  key_dim: int = 32
  num_values: int = 16
  num_groups: int = 3
  shared: float = 0.5
  query_noise: float = 0.3

  def __post_init__(self):
    for name in ("num_pairs", "key_dim", "num_groups"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
    if self.num_values < 2:
      raise ValueError(f"num_values must be >= 2, got {self.num_values}")
    if not 0.0 <= self.shared < 1.0:
      raise ValueError(f"shared must be in [0, 1), got {self.shared}")
    if self.query_noise < 0.0:
      raise ValueError(f"query_noise must be >= 0, got {self.query_noise}")


def _unit(x: np.ndarray) -> np.ndarray:
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def recall_batch(*, seed: int, position: int, batch_size: int,
                 spec: RecallTaskSpec) -> dict[str, np.ndarray]:
  """One batch, a pure function of ``(seed, position)``.

  Returns ``keys`` float32 ``[B, K, D]`` (unit rows), ``values`` int32 ``[B, K]``,
  ``query`` float32 ``[B, D]`` (unit), ``target`` int32 ``[B]`` and ``query_index``
  int32 ``[B]`` (which pair was queried).
  """
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  if position < 0:
    raise ValueError(f"position must be >= 0, got {position}")
  b, k, d = batch_size, spec.num_pairs, spec.key_dim
  rng = np.random.default_rng([seed, position])
  prototypes = _unit(rng.standard_normal((b, spec.num_groups, d)))
  group = rng.integers(0, spec.num_groups, size=(b, k))
  own = _unit(rng.standard_normal((b, k, d)))
  shared_part = np.take_along_axis(prototypes, group[:, :, None], axis=1)
  keys = _unit(np.sqrt(spec.shared) * shared_part + np.sqrt(1.0 - spec.shared) * own)
  values = rng.integers(0, spec.num_values, size=(b, k))
  index = rng.integers(0, k, size=b)
  noise = rng.standard_normal((b, d)) * (spec.query_noise / np.sqrt(d))
  query = _unit(keys[np.arange(b), index] + noise)
  return {"keys": keys.astype(np.float32), "values": values.astype(np.int32),
          "query": query.astype(np.float32),
          "target": values[np.arange(b), index].astype(np.int32),
          "query_index": index.astype(np.int32)}


def eval_batches(*, seed: int, num_batches: int, batch_size: int,
                 spec: RecallTaskSpec) -> list[dict[str, np.ndarray]]:
  """A fixed evaluation set, disjoint in position from every training batch."""
  if num_batches < 1:
    raise ValueError(f"num_batches must be >= 1, got {num_batches}")
  return [recall_batch(seed=seed, position=_EVAL_OFFSET + i, batch_size=batch_size, spec=spec)
          for i in range(num_batches)]


def recall(predicted: np.ndarray, target: np.ndarray) -> float:
  """Fraction of queries whose predicted value id equals the target (int arrays ``[B]``)."""
  predicted, target = np.asarray(predicted), np.asarray(target)
  if predicted.shape != target.shape or predicted.ndim != 1:
    raise ValueError(f"predicted and target must be equal 1-D shapes, got "
                     f"{predicted.shape}, {target.shape}")
  return float(np.mean(predicted == target))
