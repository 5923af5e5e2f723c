"""Which implementation a kernel entry point runs."""

from __future__ import annotations

import jax

ACCELERATORS = ("gpu", "tpu")


def use_pallas(interpret: bool, use_kernel: bool | None) -> bool:
  """Pallas when asked to interpret, when forced, or by default on an accelerator."""
  if interpret:
    return True
  if use_kernel is None:
    return jax.default_backend() in ACCELERATORS
  return use_kernel


def default_block(n: int, preferred: int) -> int:
  """The largest power of two <= ``preferred`` dividing ``n`` (at least 1)."""
  b = preferred
  while b > 1 and n % b:
    b //= 2
  return b
