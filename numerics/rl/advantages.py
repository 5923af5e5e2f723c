"""GRPO group-relative advantages.

GRPO (Shao et al., 2024) samples ``G`` completions per prompt and scores each against
its own group::

    A_i = (R_i - mean_g R) / (std_g R + eps)      (normalize_std=True)
    A_i =  R_i - mean_g R                         (normalize_std=False, Dr. GRPO)

``std_g`` is the population standard deviation (ddof = 0). A group whose rewards are
all equal gets advantage 0 for every member (no signal, no NaN).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def group_advantages(rewards: jax.Array, group_size: int, normalize_std: bool = True,
                     eps: float = 1e-6) -> jax.Array:
  """float32 ``[N]`` group-relative advantages of ``rewards`` ``[N]``.

  Args:
    rewards: ``[N]`` with ``N = num_groups * group_size``, laid out group-major
      (entries ``g*group_size .. (g+1)*group_size - 1`` are one prompt's group).
    group_size: completions per prompt (a static positive int dividing ``N``).
    normalize_std: divide by ``std_group + eps`` (GRPO); False gives the centred
      reward only (Dr. GRPO).
    eps: added to the group std (> 0 keeps constant groups finite).
  """
  if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
    raise ValueError(f"group_size must be a positive int, got {group_size!r}")
  if isinstance(eps, (int, float)) and eps < 0:
    raise ValueError(f"eps must be >= 0, got {eps}")
  rewards = jnp.asarray(rewards).astype(jnp.float32)
  if rewards.ndim != 1:
    raise ValueError(f"rewards must be 1-D [N], got shape {rewards.shape}")
  n = rewards.shape[0]
  if n % group_size:
    raise ValueError(f"number of rewards {n} is not divisible by group_size {group_size}")
  r = rewards.reshape(n // group_size, group_size)
  centred = r - jnp.mean(r, axis=1, keepdims=True)
  if normalize_std:
    centred = centred / (jnp.std(r, axis=1, keepdims=True) + eps)
  return centred.reshape(n)
