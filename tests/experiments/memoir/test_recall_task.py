"""The associative-recall generator: determinism, shapes, interference, recall metric."""

import numpy as np
import pytest

from experiments.memoir import recall_task

SPEC = recall_task.RecallTaskSpec(num_pairs=6, key_dim=16, num_values=5, num_groups=2,
                                  shared=0.6, query_noise=0.2)


def test_pure_function_of_seed_and_position():
  a = recall_task.recall_batch(seed=3, position=7, batch_size=4, spec=SPEC)
  b = recall_task.recall_batch(seed=3, position=7, batch_size=4, spec=SPEC)
  c = recall_task.recall_batch(seed=3, position=8, batch_size=4, spec=SPEC)
  for name in a:
    np.testing.assert_array_equal(a[name], b[name])
  assert not np.array_equal(a["keys"], c["keys"])


def test_shapes_dtypes_and_target():
  batch = recall_task.recall_batch(seed=0, position=0, batch_size=5, spec=SPEC)
  assert batch["keys"].shape == (5, 6, 16) and batch["keys"].dtype == np.float32
  assert batch["values"].shape == (5, 6) and batch["values"].dtype == np.int32
  assert batch["query"].shape == (5, 16) and batch["target"].shape == (5,)
  np.testing.assert_allclose(np.linalg.norm(batch["keys"], axis=-1), 1.0, atol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(batch["query"], axis=-1), 1.0, atol=1e-5)
  rows = np.arange(5)
  np.testing.assert_array_equal(batch["target"], batch["values"][rows, batch["query_index"]])
  assert batch["values"].min() >= 0 and batch["values"].max() < 5


def test_keys_interfere_and_query_is_noisy():
  spec = recall_task.RecallTaskSpec(num_pairs=8, key_dim=64, num_groups=1, shared=0.5,
                                    query_noise=0.3)
  batch = recall_task.recall_batch(seed=1, position=0, batch_size=256, spec=spec)
  gram = np.einsum("bid,bjd->bij", batch["keys"], batch["keys"])
  off = gram[:, ~np.eye(8, dtype=bool)]
  assert 0.4 < off.mean() < 0.6  # one shared group: cosine about `shared`
  own = np.sum(batch["query"] * batch["keys"][np.arange(256), batch["query_index"]], -1)
  assert 0.9 < own.mean() < 0.99  # noisy, yet nearest to its own key on average
  clean = recall_task.recall_batch(
      seed=1, position=0, batch_size=8,
      spec=recall_task.RecallTaskSpec(num_pairs=8, key_dim=64, shared=0.0, query_noise=0.0))
  gram0 = np.einsum("bid,bjd->bij", clean["keys"], clean["keys"])
  assert np.abs(gram0[:, ~np.eye(8, dtype=bool)]).mean() < 0.2


def test_eval_set_is_fixed_and_disjoint_from_training():
  ev = recall_task.eval_batches(seed=0, num_batches=2, batch_size=4, spec=SPEC)
  assert len(ev) == 2
  first = recall_task.recall_batch(seed=0, position=0, batch_size=4, spec=SPEC)
  assert not np.array_equal(ev[0]["keys"], first["keys"])
  again = recall_task.eval_batches(seed=0, num_batches=2, batch_size=4, spec=SPEC)
  np.testing.assert_array_equal(ev[1]["query"], again[1]["query"])


def test_recall_metric_and_validation():
  assert recall_task.recall(np.array([1, 2, 3, 4]), np.array([1, 0, 3, 0])) == 0.5
  with pytest.raises(ValueError, match="predicted"):
    recall_task.recall(np.array([1, 2]), np.array([1]))
  with pytest.raises(ValueError, match="shared"):
    recall_task.RecallTaskSpec(shared=1.0)
  with pytest.raises(ValueError, match="num_values"):
    recall_task.RecallTaskSpec(num_values=1)
  with pytest.raises(ValueError, match="batch_size"):
    recall_task.recall_batch(seed=0, position=0, batch_size=0, spec=SPEC)
