"""Weight de-oscillation (ALTO's simplified OsciReset, after TetraJet-v2) as an optax step.

Low-precision weights can oscillate: an element near a quantization boundary flips its
quantized value back and forth while the master weight barely moves, injecting noise
into every forward pass. Over a window of ``period`` optimizer steps this transform
accumulates, per element,

    d_w = sum_t |w_t - w_{t-1}|        and        d_Q = sum_t |Q(w_t) - Q(w_{t-1})|

with ``Q`` the forward weight quantizer (same grid, 2D tiles and scale rule as the
forward GEMM; :func:`numerics.qdot.forward_weight_quantizer`). At the end of each
window, elements with ``d_w > 0`` and ``d_Q / d_w >= ratio`` are snapped to their
quantized value (``w <- Q(w)``), and both counters restart. Nothing happens before
``start_step`` (the first window then starts there).

Chain it *after* the optimizer (it reads ``params + updates``, the weights the step
would produce, and returns the updates that land on the snapped weights instead):
``optax.chain(optax.adamw(...), deoscillate(Q, ...))``; mask it to the quantized
weights with ``optax.masked``. ALTO: period 200, ratio 4, start 2000 (of ~16k steps).

State: the previous weights, their quantized values and the two counters (one more
tensor than ALTO's three, so ``Q`` runs once per step instead of twice).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax


class DeoscillationState(NamedTuple):
  """``count`` int32[] steps seen; per-leaf ``prev``, ``prev_q``, ``dist_w``, ``dist_q``;
  ``snapped`` int32[] elements snapped at the last window end (a metric)."""

  count: jax.Array
  prev: Any
  prev_q: Any
  dist_w: Any
  dist_q: Any
  snapped: jax.Array


def deoscillate(quantize: Callable[[jax.Array], jax.Array], period: int = 200,
                ratio: float = 4.0, start_step: int = 0
                ) -> optax.GradientTransformation:
  """The de-oscillation transformation (see the module docstring).

  Args:
    quantize: ``Q``, float32 array -> float32 array of the same shape (applied to
      every leaf the transform sees; mask the others out).
    period: window length P in steps (>= 1).
    ratio: threshold tau on ``d_Q / d_w`` (> 0).
    start_step: steps (counted by this transform) before the first window.

  Returns:
    A GradientTransformation whose ``update`` needs ``params``.
  """
  if period < 1:
    raise ValueError(f"period must be >= 1, got {period}")
  if not ratio > 0:
    raise ValueError(f"ratio must be > 0, got {ratio}")
  if start_step < 0:
    raise ValueError(f"start_step must be >= 0, got {start_step}")

  def init(params):
    f32 = lambda p: jnp.asarray(p, jnp.float32)
    zeros = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), jnp.float32), params)
    return DeoscillationState(
        count=jnp.zeros((), jnp.int32), prev=jax.tree.map(f32, params),
        prev_q=jax.tree.map(lambda p: quantize(f32(p)), params), dist_w=zeros,
        dist_q=jax.tree.map(jnp.copy, zeros), snapped=jnp.zeros((), jnp.int32))

  def update(updates, state, params=None):
    if params is None:
      raise ValueError("deoscillate needs params (chain it after the optimizer)")
    active = state.count >= start_step
    window_end = active & ((state.count - start_step + 1) % period == 0)
    new_w = jax.tree.map(lambda p, u: p.astype(jnp.float32) + u.astype(jnp.float32),
                         params, updates)
    new_q = jax.tree.map(quantize, new_w)
    acc = lambda d, a, b: d + jnp.where(active, jnp.abs(a - b), 0.0)
    dist_w = jax.tree.map(acc, state.dist_w, new_w, state.prev)
    dist_q = jax.tree.map(acc, state.dist_q, new_q, state.prev_q)
    snap = jax.tree.map(
        lambda dw, dq: window_end & (dw > 0) & (dq >= ratio * dw), dist_w, dist_q)
    final_w = jax.tree.map(jnp.where, snap, new_q, new_w)
    # Snapping can move a tile's amax, hence its scale: re-quantize only when it did.
    final_q = jax.lax.cond(window_end, lambda: jax.tree.map(quantize, final_w),
                           lambda: new_q)
    reset = lambda d: jnp.where(window_end, 0.0, d)
    new_updates = jax.tree.map(lambda fw, p, u: (fw - p.astype(jnp.float32)).astype(u.dtype),
                               final_w, params, updates)
    snapped = sum((jnp.sum(s) for s in jax.tree.leaves(snap)), jnp.zeros((), jnp.int32))
    new_state = DeoscillationState(
        count=state.count + 1, prev=final_w, prev_q=final_q,
        dist_w=jax.tree.map(reset, dist_w), dist_q=jax.tree.map(reset, dist_q),
        snapped=jnp.where(window_end, snapped.astype(jnp.int32), state.snapped))
    return new_updates, new_state

  return optax.GradientTransformation(init, update)
