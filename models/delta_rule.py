"""Delta-rule fast weights: a plain jnp reference and a chunked (WY / triangular-solve) form.

The recurrence (Schlag, Irie & Schmidhuber 2021), with the memory ``S`` a ``[d_v, d_k]``
matrix, keys ``k_t`` already feature-mapped (and, in Memoir, L2-normalised) and
write strengths ``beta_t`` in (0, 1)::

    S_t = S_{t-1} + beta_t (v_t - S_{t-1} k_t) k_t^T        (write)
    y_t = S_t q_t                                          (read, after the write)

:func:`delta_rule_reference` runs it one step at a time with ``lax.scan`` (obviously
correct). :func:`delta_rule_chunked` processes ``chunk`` steps at once: writing
``u_t = beta_t (v_t - S_{t-1} k_t)`` gives ``S_t = S_0 + sum_{i<=t} u_i k_i^T`` inside a
chunk, so the pseudo-values ``U`` solve the unit lower-triangular system
``(I + diag(beta) tril(K K^T, -1)) U = diag(beta) (V - K S_0^T)`` and the chunk's reads
are ``Y = Q S_0^T + tril(Q K^T) U`` (Yang et al. 2024, "Parallelizing linear transformers
with the delta rule over sequence length"). The two agree to float32 rounding, not bit
for bit (the triangular solve reassociates sums); tests hold them within 1e-5.

A Pallas kernel was not written: at Memoir's sizes (d_k = d_v = 32, a dozen writes per
sample) the chunked jnp form already turns the serial scan into a few small matmuls,
and ``experiments/bench_delta_rule.py`` measures that ratio.

All functions take a leading batch axis: q/k ``[B, T, d_k]``, v ``[B, T, d_v]``,
beta ``[B, T]``, s0 ``[B, d_v, d_k]``; float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _check(q: jax.Array, k: jax.Array, v: jax.Array, beta: jax.Array, s0: jax.Array) -> None:
  if k.ndim != 3 or v.ndim != 3:
    raise ValueError(f"k and v must be [B, T, d], got k {k.shape}, v {v.shape}")
  b, t, d_k = k.shape
  if q.shape != k.shape:
    raise ValueError(f"q must match k's shape {k.shape}, got {q.shape}")
  if v.shape[:2] != (b, t):
    raise ValueError(f"v must be [{b}, {t}, d_v], got {v.shape}")
  if beta.shape != (b, t):
    raise ValueError(f"beta must be [{b}, {t}], got {beta.shape}")
  if s0.shape != (b, v.shape[2], d_k):
    raise ValueError(f"s0 must be [{b}, {v.shape[2]}, {d_k}], got {s0.shape}")


def delta_write(s: jax.Array, k: jax.Array, v: jax.Array, beta: jax.Array) -> jax.Array:
  """One delta-rule write: ``s + beta (v - s k) k^T``.

  Args: s ``[B, d_v, d_k]``, k ``[B, d_k]``, v ``[B, d_v]``, beta ``[B]``.
  Returns the new ``[B, d_v, d_k]`` memory.
  """
  if s.ndim != 3 or k.shape != (s.shape[0], s.shape[2]) or v.shape != s.shape[:2] \
      or beta.shape != (s.shape[0],):
    raise ValueError(f"delta_write shapes: s {s.shape}, k {k.shape}, v {v.shape}, "
                     f"beta {beta.shape}")
  err = v - jnp.einsum("bvk,bk->bv", s, k)
  return s + beta[:, None, None] * err[:, :, None] * k[:, None, :]


def delta_read(s: jax.Array, q: jax.Array) -> jax.Array:
  """``s q``: s ``[B, d_v, d_k]``, q ``[B, d_k]`` -> ``[B, d_v]``."""
  if s.ndim != 3 or q.shape != (s.shape[0], s.shape[2]):
    raise ValueError(f"delta_read shapes: s {s.shape}, q {q.shape}")
  return jnp.einsum("bvk,bk->bv", s, q)


def delta_rule_reference(q: jax.Array, k: jax.Array, v: jax.Array, beta: jax.Array,
                         s0: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Sequential delta rule. Returns (reads ``[B, T, d_v]``, final memory ``[B, d_v, d_k]``)."""
  _check(q, k, v, beta, s0)

  def step(s, xs):
    q_t, k_t, v_t, b_t = xs
    s = delta_write(s, k_t, v_t, b_t)
    return s, delta_read(s, q_t)

  xs = (jnp.swapaxes(q, 0, 1), jnp.swapaxes(k, 0, 1), jnp.swapaxes(v, 0, 1), beta.T)
  s, y = jax.lax.scan(step, s0, xs)
  return jnp.swapaxes(y, 0, 1), s


def delta_rule_chunked(q: jax.Array, k: jax.Array, v: jax.Array, beta: jax.Array,
                       s0: jax.Array, chunk: int = 16) -> tuple[jax.Array, jax.Array]:
  """Chunked delta rule, equal to :func:`delta_rule_reference` up to float rounding.

  ``T`` need not divide by ``chunk``: the tail is padded with ``beta = 0`` steps, which
  leave the memory unchanged. Returns (reads ``[B, T, d_v]``, final memory).
  """
  _check(q, k, v, beta, s0)
  if chunk < 1:
    raise ValueError(f"chunk must be >= 1, got {chunk}")
  b, t, d_k = k.shape
  d_v = v.shape[2]
  chunk = min(chunk, t)
  n_chunks = -(-t // chunk)
  pad = n_chunks * chunk - t
  if pad:
    widths = ((0, 0), (0, pad), (0, 0))
    q, k, v = jnp.pad(q, widths), jnp.pad(k, widths), jnp.pad(v, widths)
    beta = jnp.pad(beta, ((0, 0), (0, pad)))

  def split(x):  # [B, T, ...] -> [n_chunks, B, chunk, ...]
    return jnp.swapaxes(x.reshape(b, n_chunks, chunk, *x.shape[2:]), 0, 1)

  strict = jnp.tril(jnp.ones((chunk, chunk), bool), -1)
  causal = jnp.tril(jnp.ones((chunk, chunk), bool))
  eye = jnp.eye(chunk, dtype=k.dtype)

  def step(s, xs):
    qc, kc, vc, bc = xs  # [B, C, d_k], [B, C, d_k], [B, C, d_v], [B, C]
    gram = jnp.where(strict, jnp.einsum("bik,bjk->bij", kc, kc), 0.0)
    lower = eye + bc[:, :, None] * gram
    rhs = bc[:, :, None] * (vc - jnp.einsum("bck,bvk->bcv", kc, s))
    u = jax.scipy.linalg.solve_triangular(lower, rhs, lower=True, unit_diagonal=True)
    attn = jnp.where(causal, jnp.einsum("bik,bjk->bij", qc, kc), 0.0)
    y = jnp.einsum("bck,bvk->bcv", qc, s) + jnp.einsum("bij,bjv->biv", attn, u)
    s = s + jnp.einsum("bcv,bck->bvk", u, kc)
    return s, y

  s, y = jax.lax.scan(step, s0, (split(q), split(k), split(v), split(beta)))
  y = jnp.swapaxes(y, 0, 1).reshape(b, n_chunks * chunk, d_v)[:, :t]
  return y, s


def delta_rule_macs(seq_len: int, d_k: int, d_v: int, with_reads: bool = True) -> int:
  """Declared forward multiply-accumulates of the reference recurrence, per sample.

  A write is ``s k`` plus the rank-1 update (``2 d_v d_k``); a read is ``d_v d_k``.
  """
  per_step = 2 * d_v * d_k + (d_v * d_k if with_reads else 0)
  return seq_len * per_step
