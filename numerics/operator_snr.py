"""Operator-level SNR of a recipe's three GEMMs (ALTO's table): forward O, dgrad dX and
wgrad dW, each against the unquantized float32 computation.

    numerics.operator_snr.snr("mxfp4")   # {'forward': dB, 'dgrad': dB, 'wgrad': dB}
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.numerics import qdot
from lowprec.numerics import recipes as recipes_lib
from lowprec.numerics.outlier_data import outlier_data


def snr_db(ref: jax.Array, approx: jax.Array) -> float:
  """10 log10(||ref||^2 / ||ref - approx||^2) in float64."""
  ref = np.asarray(ref, np.float64)
  err = np.asarray(approx, np.float64) - ref
  return float(10 * np.log10(np.sum(ref ** 2) / max(np.sum(err ** 2), 1e-300)))


def snr(recipe: str | recipes_lib.Recipe, *, tokens: int = 2048, k: int = 1024,
        n: int = 1024, key: jax.Array | None = None, outlier_rate: float = 0.005,
        repeats: int = 1, experts: int = 0) -> dict[str, float]:
  """Operator-level SNR (dB) of forward O, dgrad dX and wgrad dW under ``recipe``.

  X (tokens, K), W (K, N) and dO (tokens, N) are drawn from
  :func:`numerics.outlier_data.outlier_data` (as ALTO's operator table); the reference is the float32
  computation without quantization. With ``experts = E > 0`` the GEMM is a grouped
  expert GEMM: X (E, tokens, K), W (E, K, N), batched over E (an MoE layer's
  ``dot_general``). With ``repeats > 1`` the SNRs are averaged over independent draws
  (and keys).

  Returns:
    ``{"forward": dB, "dgrad": dB, "wgrad": dB}``.
  """
  if experts < 0:
    raise ValueError(f"experts must be >= 0, got {experts}")
  key = jax.random.key(0) if key is None else key
  r = recipes_lib.get(recipe)
  lead = (experts,) if experts else ()
  dn = (((2,), (1,)), ((0,), (0,))) if experts else (((1,), (0,)), ((), ()))

  @jax.jit
  def one(kk):
    kx, kw, kg, kq = jax.random.split(kk, 4)
    x = outlier_data(kx, lead + (tokens, k), outlier_rate)
    w = outlier_data(kw, lead + (k, n), outlier_rate)
    g = outlier_data(kg, lead + (tokens, n), outlier_rate)
    f = lambda x, w: qdot.quantized_dot_general(x, w, dn, r, key=kq,
                                           preferred_element_type=jnp.float32)
    out, vjp = jax.vjp(f, x, w)
    dx, dw = vjp(g)
    hi = lax.Precision.HIGHEST
    mm = lambda spec, a, b: jnp.einsum(spec, a, b, precision=hi)
    ref = (mm("...tk,...kn->...tn", x, w), mm("...tn,...kn->...tk", g, w),
           mm("...tk,...tn->...kn", x, g))
    return (out, dx, dw), ref

  totals = {"forward": 0.0, "dgrad": 0.0, "wgrad": 0.0}
  for i in range(repeats):
    got, ref = one(jax.random.fold_in(key, i))
    for name, a, b in zip(totals, ref, got):
      totals[name] += snr_db(a, b) / repeats
  return totals
