"""An independent NumPy reference for the fixed (deterministic) Hadamard transform:
scipy's Sylvester matrix ``H_b / sqrt(b)`` on every block of ``b`` along an axis, in
float64, rounded once to float32."""

from __future__ import annotations

import numpy as np
import scipy.linalg


def sylvester_blocks(a: np.ndarray, axis: int, size: int) -> np.ndarray:
  """``H_size / sqrt(size)`` applied to every ``size``-long block of ``a`` along ``axis``."""
  h = scipy.linalg.hadamard(size).astype(np.float64) / np.sqrt(size)
  am = np.moveaxis(np.asarray(a, np.float64), axis, 0)
  blocks = am.reshape(am.shape[0] // size, size, -1)
  out = np.einsum("ij,bjk->bik", h, blocks).reshape(am.shape)
  return np.moveaxis(out, 0, axis).astype(np.float32)
