"""ALTO's synthetic GEMM operand: Gaussian values with rare, very large outliers.

The distribution ALTO measures its operator-level SNR on (N(0, 1) plus, with
probability ``rate``, an N(0, 1e4) outlier), which separates per-tensor scaling from
block scaling. Used by :mod:`numerics.operator_snr`, the demos and the tests.
"""

from __future__ import annotations

import jax


def outlier_data(key: jax.Array, shape: tuple[int, ...], rate: float = 0.005
                 ) -> jax.Array:
  """ALTO's synthetic operand: N(0, 1) + Bernoulli(rate) * N(0, 1e4), float32."""
  k1, k2, k3 = jax.random.split(key, 3)
  return (jax.random.normal(k1, shape) + jax.random.bernoulli(k2, rate, shape)
          * 100.0 * jax.random.normal(k3, shape))
