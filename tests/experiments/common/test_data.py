"""Data loaders: shipped Shakespeare, sklearn digits."""

import gzip
import hashlib
import os

import numpy as np
import pytest

from experiments.common.data import digits, shakespeare

# Recorded by experiments/data/make_shakespeare.py; see experiments/data/README.md.
TEXT_SHA256 = "b3b8e7fa68c8e0239830de97c1b0be22ad3991eb2169c1f57aa5eb5cb9bd8f14"


def test_shipped_corpus_is_the_documented_one():
  with gzip.open(shakespeare.CORPUS_PATH, "rb") as f:
    data = f.read()
  assert hashlib.sha256(data).hexdigest() == TEXT_SHA256
  assert os.path.getsize(shakespeare.CORPUS_PATH) < 2.5e6
  text = data.decode("utf-8")
  assert "Gutenberg" not in text and "*** START OF" not in text
  assert text.startswith("ALL'S WELL THAT ENDS WELL")


def test_splits_vocab_and_roundtrip():
  s = shakespeare.load_splits("char", 0.1, max_chars=50_000)
  assert s.vocab.size == 84  # the whole corpus's alphabet, independent of max_chars
  assert s.train.size + s.validation.size == 50_000
  assert s.validation.size == 5_000
  text = shakespeare.load_text(max_chars=50_000)
  assert s.vocab.decode(np.concatenate([s.train, s.validation])) == text
  b = shakespeare.load_splits("byte", 0.1, max_chars=1000)
  assert b.vocab.size == 256 and b.vocab.decode(b.train[:20]) == text[:20]


def test_train_batches_deterministic_and_shifted():
  s = shakespeare.load_splits("char", 0.1, max_chars=20_000)
  a = shakespeare.train_batch(s.train, seed=3, position=7, batch_size=4, seq_len=16)
  b = shakespeare.train_batch(s.train, seed=3, position=7, batch_size=4, seq_len=16)
  c = shakespeare.train_batch(s.train, seed=3, position=8, batch_size=4, seq_len=16)
  d = shakespeare.train_batch(s.train, seed=4, position=7, batch_size=4, seq_len=16)
  np.testing.assert_array_equal(a["inputs"], b["inputs"])
  assert not np.array_equal(a["inputs"], c["inputs"])
  assert not np.array_equal(a["inputs"], d["inputs"])
  assert a["inputs"].shape == (4, 16) and a["inputs"].dtype == np.int32
  np.testing.assert_array_equal(a["inputs"][:, 1:], a["targets"][:, :-1])
  ev = shakespeare.eval_batches(s.validation, num_batches=3, batch_size=2, seq_len=16)
  assert len(ev) == 3 and ev[0]["inputs"].shape == (2, 16)


def test_loader_errors():
  with pytest.raises(ValueError, match="tokenization"):
    shakespeare.load_splits("word")
  with pytest.raises(ValueError, match="validation_fraction"):
    shakespeare.load_splits("char", 1.5)
  with pytest.raises(FileNotFoundError, match="make_shakespeare"):
    shakespeare.load_text("/nonexistent/shakespeare.txt.gz")
  s = shakespeare.load_splits("char", 0.5, max_chars=40)
  with pytest.raises(ValueError, match="fewer than"):
    shakespeare.train_batch(s.train, seed=0, position=0, batch_size=1, seq_len=64)


def test_digits():
  pytest.importorskip("sklearn")
  d = digits.load_digits_splits(seed=0)
  assert d.train_images.shape[1:] == (8, 8, 1) and d.train_images.dtype == np.float32
  assert len(d.train_labels) + len(d.test_labels) == 1797
  assert 0.0 <= d.train_images.min() and d.train_images.max() <= 1.0
  again = digits.load_digits_splits(seed=0)
  np.testing.assert_array_equal(d.test_labels, again.test_labels)
  b = digits.train_batch(d.train_images, d.train_labels, seed=0, position=3, batch_size=32)
  assert b["images"].shape == (32, 8, 8, 1) and b["labels"].shape == (32,)
  # one epoch visits each example once
  per_epoch = len(d.train_labels) // 32
  seen = np.concatenate([digits.train_batch(np.arange(len(d.train_labels)), d.train_labels,
                                            seed=0, position=p, batch_size=32)["images"]
                         for p in range(per_epoch)])
  assert len(set(seen.tolist())) == per_epoch * 32


def test_missing_package_message():
  from experiments.common.harness.optional_imports import require
  with pytest.raises(ImportError, match="pip install not-a-real-pkg"):
    require("not_a_real_module_xyz", "not-a-real-pkg", "a test")
