"""Learning-rate schedules: SGDR cosine warm restarts (cycle lengths 1:2:4:8, ...).

A schedule is ``count -> value`` (an optax ``Schedule``), evaluated on the count of the
transform that owns it, so a schedule inside :func:`numerics.optim.handoff` starts at 0
when its phase starts.
"""

from __future__ import annotations

import numpy as np
import jax.numpy as jnp
import optax


def cycle_lengths(horizon: int, n_cycles: int, t_mult: float) -> np.ndarray:
  """Float lengths of ``n_cycles`` cycles in ratio 1 : t_mult : t_mult^2 ... summing to
  ``horizon`` (Temperon's 4 cycles with t_mult 2 are 1:2:4:8 of the horizon)."""
  if horizon < 1:
    raise ValueError(f"horizon must be >= 1, got {horizon}")
  if n_cycles < 1:
    raise ValueError(f"n_cycles must be >= 1, got {n_cycles}")
  if t_mult <= 0:
    raise ValueError(f"t_mult must be > 0, got {t_mult}")
  weights = np.asarray([float(t_mult) ** i for i in range(n_cycles)])
  return horizon * weights / weights.sum()


def warm_restarts_schedule(peak_value: float, horizon: int, *, n_cycles: int = 4,
                           t_mult: float = 2.0, warmup_steps: int = 0,
                           end_value: float = 0.0) -> optax.Schedule:
  """Cosine annealing with warm restarts (SGDR) over ``horizon`` steps.

  In cycle ``i`` (start ``s_i``, length ``L_i`` from :func:`cycle_lengths`) the value is
  ``end + 0.5 (peak - end) (1 + cos(pi (t - s_i) / L_i))``; past the horizon it stays at
  ``end_value``. A linear warm-up multiplies the value by ``min(1, (t + 1) / warmup)``
  over the first ``warmup_steps`` steps (counted from 1, so step 0 already moves).
  ``n_cycles=1`` is a single cosine anneal. Returns float32 scalars.
  """
  if warmup_steps < 0:
    raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
  lengths = cycle_lengths(horizon, n_cycles, t_mult)
  starts = np.concatenate([[0.0], np.cumsum(lengths)[:-1]])
  starts_j = jnp.asarray(starts, jnp.float32)
  lengths_j = jnp.asarray(lengths, jnp.float32)

  def schedule(count):
    t = jnp.asarray(count, jnp.float32)
    index = jnp.sum(t >= starts_j[1:]).astype(jnp.int32)
    frac = jnp.clip((t - starts_j[index]) / lengths_j[index], 0.0, 1.0)
    value = end_value + 0.5 * (peak_value - end_value) * (1.0 + jnp.cos(jnp.pi * frac))
    if warmup_steps > 0:
      value = value * jnp.minimum(1.0, (t + 1.0) / warmup_steps)
    return value

  return schedule


def cosine_schedule(peak_value: float, horizon: int, *, warmup_steps: int = 0,
                    end_value: float = 0.0) -> optax.Schedule:
  """One cosine anneal from ``peak_value`` to ``end_value`` over ``horizon`` steps, with
  the same linear warm-up as :func:`warm_restarts_schedule` (it is its 1-cycle case)."""
  return warm_restarts_schedule(peak_value, horizon, n_cycles=1, warmup_steps=warmup_steps,
                                end_value=end_value)
