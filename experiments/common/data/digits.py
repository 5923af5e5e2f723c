"""scikit-learn's bundled 8x8 digits (``load_digits``, no download) for image experiments."""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments.common.harness.optional_imports import require


@dataclasses.dataclass(frozen=True)
class DigitsSplits:
  """Images float32[N, 8, 8, 1] in [0, 1]; labels int32[N] in 0..9."""

  train_images: np.ndarray
  train_labels: np.ndarray
  test_images: np.ndarray
  test_labels: np.ndarray


def load_digits_splits(seed: int = 0, test_fraction: float = 0.2) -> DigitsSplits:
  """The 1797 digits, shuffled with ``seed`` and split (deterministic given the seed)."""
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
  datasets = require("sklearn.datasets", "scikit-learn", "the digits dataset")
  data = datasets.load_digits()
  images = (data.images / 16.0).astype(np.float32)[..., None]
  labels = data.target.astype(np.int32)
  order = np.random.default_rng(seed).permutation(len(labels))
  n_test = int(round(len(labels) * test_fraction))
  test, train = order[:n_test], order[n_test:]
  return DigitsSplits(images[train], labels[train], images[test], labels[test])


def train_batch(images: np.ndarray, labels: np.ndarray, *, seed: int, position: int,
                batch_size: int) -> dict[str, np.ndarray]:
  """Batch ``position`` of epoch-wise shuffled data (a fresh permutation per epoch).

  Returns ``{"images": float32[B, 8, 8, 1], "labels": int32[B]}``; an epoch's remainder
  that does not fill a batch is dropped.
  """
  n = labels.shape[0]
  if not 1 <= batch_size <= n:
    raise ValueError(f"batch_size must be in [1, {n}], got {batch_size}")
  per_epoch = n // batch_size
  epoch, index = divmod(position, per_epoch)
  order = np.random.default_rng([seed, epoch]).permutation(n)
  rows = order[index * batch_size:(index + 1) * batch_size]
  return {"images": images[rows], "labels": labels[rows]}
