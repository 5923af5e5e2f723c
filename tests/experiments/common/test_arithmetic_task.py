"""experiments.common.data.arithmetic_task: layout, hand-worked problems, rewards, masks."""

import numpy as np
import pytest

from experiments.common.data import arithmetic_task as at


def test_hand_worked_layout():
  p = at.problems(seed=0, position=0, batch_size=64, digits=3)
  assert p["prompts"].shape == (64, 8) and p["answers"].shape == (64, 5)
  for prompt, answer, a, b in zip(at.decode(p["prompts"]), at.decode(p["answers"]),
                                  p["a"], p["b"]):
    assert prompt == f"{a:03d}+{b:03d}="
    assert answer == f"{a + b:04d}"[::-1] + "."
  # A specific case built by hand from the encoding: 958 + 67 = 1025 -> "5201."
  digits = lambda s: [at.CHARS.index(c) for c in s]
  assert digits("5201.") == [6, 3, 1, 2, 13]
  assert at.decode(np.array([digits("958+067=")])) == ["958+067="]


def test_pure_function_of_seed_and_position():
  a = at.problems(seed=1, position=5, batch_size=8, digits=4)
  b = at.problems(seed=1, position=5, batch_size=8, digits=4)
  c = at.problems(seed=1, position=6, batch_size=8, digits=4)
  d = at.problems(seed=2, position=5, batch_size=8, digits=4)
  np.testing.assert_array_equal(a["prompts"], b["prompts"])
  assert not np.array_equal(a["prompts"], c["prompts"])
  assert not np.array_equal(a["prompts"], d["prompts"])


def test_grouped_prompts_are_group_major():
  g = at.grouped_prompts(seed=0, position=0, num_prompts=3, group_size=4, digits=2)
  assert g["prompts"].shape == (12, 6)
  for i in range(3):
    assert len({tuple(r) for r in g["prompts"][4 * i:4 * i + 4]}) == 1
  assert len({tuple(r) for r in g["prompts"][::4]}) == 3


def test_supervised_batch_masks_the_answer():
  s = at.supervised_batch(seed=0, position=0, batch_size=2, digits=2)
  assert s["inputs"].shape == (2, 9) and s["mask"].shape == (2, 9)
  np.testing.assert_array_equal(s["mask"][0], [0, 0, 0, 0, 0, 1, 1, 1, 1])
  np.testing.assert_array_equal(s["inputs"][:, 1:], s["targets"][:, :-1])
  assert np.all(s["targets"][:, -1] == at.END)


def test_rewards_and_completion_mask():
  answers = np.array([[6, 3, 1, 2, 13]] * 4)
  completions = np.array([[6, 3, 1, 2, 13, 5],    # right, junk after the end: still right
                          [6, 3, 1, 2, 5, 13],    # no end marker in place
                          [6, 3, 1, 3, 13, 13],   # wrong digit
                          [6, 13, 1, 2, 13, 0]])  # ended early
  np.testing.assert_array_equal(at.rewards(completions, answers), [1, 0, 0, 0])
  np.testing.assert_array_equal(at.completion_mask(completions),
                                [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1],
                                 [1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0]])


def test_validation():
  with pytest.raises(ValueError, match="digits"):
    at.problems(seed=0, position=0, batch_size=2, digits=0)
  with pytest.raises(ValueError, match="group_size"):
    at.grouped_prompts(seed=0, position=0, num_prompts=2, group_size=0, digits=2)
  with pytest.raises(ValueError, match="cannot hold"):
    at.rewards(np.zeros((2, 3)), np.zeros((2, 4)))
