"""numerics.optim.schedules: SGDR warm restarts with 1:2:4:8 cycles."""

import numpy as np
import pytest

from lowprec.numerics import optim


def test_cycle_lengths_are_1_2_4_8_of_the_horizon():
  lengths = optim.cycle_lengths(150, 4, 2.0)
  np.testing.assert_allclose(lengths, np.array([1, 2, 4, 8]) * 10.0)
  with pytest.raises(ValueError):
    optim.cycle_lengths(0, 4, 2.0)
  with pytest.raises(ValueError):
    optim.cycle_lengths(10, 0, 2.0)


def test_warm_restarts_values():
  f = optim.warm_restarts_schedule(1.0, 150, n_cycles=4, t_mult=2.0)
  # restarts at 0, 10, 30, 70: peak value there, half-way down mid-cycle
  for start, length in ((0, 10), (10, 20), (30, 40), (70, 80)):
    assert float(f(start)) == pytest.approx(1.0)
    assert float(f(start + length / 2)) == pytest.approx(0.5, abs=1e-6)
    assert float(f(start + length - 1)) < 0.05
  assert float(f(150)) == pytest.approx(0.0, abs=1e-7)
  assert float(f(10_000)) == pytest.approx(0.0, abs=1e-7)


def test_warmup_and_single_cosine():
  f = optim.warm_restarts_schedule(2.0, 100, n_cycles=4, warmup_steps=10)
  assert float(f(0)) == pytest.approx(0.1 * 2.0 * 0.5 * (1 + np.cos(0)), rel=1e-5)
  c = optim.cosine_schedule(1.0, 100, end_value=0.1)
  assert float(c(0)) == pytest.approx(1.0)
  assert float(c(50)) == pytest.approx(0.55)
  assert float(c(100)) == pytest.approx(0.1)
  values = np.array([float(c(t)) for t in range(101)])
  assert np.all(np.diff(values) <= 1e-7)  # one cycle: no restart
  with pytest.raises(ValueError):
    optim.cosine_schedule(1.0, 10, warmup_steps=-1)
