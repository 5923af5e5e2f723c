"""Muon: Nesterov momentum, then Newton-Schulz orthogonalisation of each matrix update.

Layout convention: leaves follow Flax, output axis LAST (``Dense`` kernels are
``(in, out)``, ``Conv`` kernels ``(kh, kw, in, out)``). Each leaf is viewed as the matrix
``(out, fan_in)`` (the PyTorch ``(out, -1)`` view of a conv kernel), orthogonalised, and
put back in its own shape.

Momentum is SGD-style, ``buf = mu * buf + g`` with Nesterov ``d = g + mu * buf`` (as in
Temperon and ``optax.trace``), not Keller Jordan's EMA: a momentum-SGD buffer can then be
copied into Muon's unchanged (:func:`numerics.optim.handoff.momentum_transfer`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from lowprec.numerics import tree_paths

NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_DTYPES = {"bf16": jnp.bfloat16, "fp32": jnp.float32}
SCALINGS = ("shape", "rms", "none")
MUON, FALLBACK = "muon", "fallback"
# Path fragments that send a leaf to the fallback by default (Keller Jordan: embeddings,
# classifier heads, gains and biases do better with AdamW/SGD).
DEFAULT_FALLBACK_NAMES = ("embed", "head", "bias", "norm", "scale")


def newton_schulz(x: jax.Array, *, steps: int = 5, coeffs: tuple[float, float, float]
                  = NS_COEFFS, dtype: str = "bf16", eps: float = 1e-7) -> jax.Array:
  """Approximate ``U V^T`` of ``x = U S V^T`` with the quintic Newton-Schulz iteration.

  ``x`` float[m, n]; returns float[m, n] in ``x.dtype``. The iteration runs in ``dtype``
  (``"bf16"`` or ``"fp32"``) on ``x / (||x||_F + eps)``, transposed when ``m > n`` so the
  Gram matrix is the small one: ``A = X X^T; X <- a X + (b A + c A^2) X``. It is a real
  ``lax.fori_loop`` (one loop body in the HLO, not ``steps`` copies).
  """
  if x.ndim != 2:
    raise ValueError(f"newton_schulz needs a matrix, got shape {x.shape}")
  if dtype not in NS_DTYPES:
    raise ValueError(f"dtype must be one of {sorted(NS_DTYPES)}, got {dtype!r}")
  a, b, c = coeffs
  transposed = x.shape[0] > x.shape[1]
  y = x.T if transposed else x
  y = y.astype(jnp.float32)
  y = (y / (jnp.linalg.norm(y) + eps)).astype(NS_DTYPES[dtype])

  def body(_, y):
    gram = y @ y.T
    return a * y + (b * gram + c * (gram @ gram)) @ y

  y = jax.lax.fori_loop(0, steps, body, y)
  y = y.T if transposed else y
  return y.astype(x.dtype)


def as_matrix(x: jax.Array) -> jax.Array:
  """``(..., out) -> (out, prod(...))``: the (out, fan_in) view of a Flax kernel."""
  if x.ndim < 2:
    raise ValueError(f"Muon needs ndim >= 2, got shape {x.shape}")
  return x.reshape(-1, x.shape[-1]).T


def from_matrix(m: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """Inverse of :func:`as_matrix`."""
  return m.T.reshape(shape)


def shape_scale(shape: tuple[int, ...], scaling: str = "shape", rms: float = 0.2) -> float:
  """The update multiplier for a leaf of ``shape`` viewed as (rows=out, cols=fan_in).

  ``"shape"``: ``sqrt(max(1, rows / cols))`` (Keller Jordan / Temperon); ``"rms"``:
  ``rms * sqrt(max(rows, cols))`` (Moonlight: update RMS ~ ``rms``, AdamW-like, so AdamW
  learning rates and weight decay carry over); ``"none"``: 1.
  """
  rows = shape[-1]
  cols = 1
  for d in shape[:-1]:
    cols *= d
  if scaling == "shape":
    return max(1.0, rows / cols) ** 0.5
  if scaling == "rms":
    return rms * max(rows, cols) ** 0.5
  if scaling == "none":
    return 1.0
  raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")


class MuonState(NamedTuple):
  """``count`` int32[]; ``momentum`` the SGD-style buffer, same tree as params."""

  count: jax.Array
  momentum: Any


def scale_by_muon(momentum: float = 0.9, *, nesterov: bool = True, ns_steps: int = 5,
                  ns_dtype: str = "bf16", scaling: str = "shape", rms: float = 0.2,
                  eps: float = 1e-7) -> optax.GradientTransformation:
  """Momentum + Newton-Schulz + shape scaling for every leaf it sees (all ndim >= 2).

  Use it through :func:`muon` (which routes non-matrix leaves elsewhere) or on a tree of
  matrices only. Updates keep each leaf's shape and dtype; the buffer is float32 like the
  gradients it accumulates.
  """
  # inject_hyperparams passes arrays (tracers under jit); only python numbers are checked.
  if isinstance(momentum, (int, float)) and not 0.0 <= momentum < 1.0:
    raise ValueError(f"momentum must be in [0, 1), got {momentum}")
  if scaling not in SCALINGS:
    raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
  if ns_dtype not in NS_DTYPES:
    raise ValueError(f"ns_dtype must be one of {sorted(NS_DTYPES)}, got {ns_dtype!r}")

  def init(params):
    for leaf in jax.tree.leaves(params):
      if leaf.ndim < 2:
        raise ValueError(f"scale_by_muon got a leaf of shape {leaf.shape}; route ndim < 2 "
                         "leaves to a fallback (see muon(label_fn=...))")
    return MuonState(jnp.zeros((), jnp.int32), jax.tree.map(jnp.zeros_like, params))

  def update(updates, state, params=None):
    del params
    buf = jax.tree.map(lambda g, m: g + momentum * m, updates, state.momentum)
    direction = (jax.tree.map(lambda g, m: g + momentum * m, updates, buf) if nesterov
                 else buf)

    def orth(d):
      o = newton_schulz(as_matrix(d), steps=ns_steps, dtype=ns_dtype, eps=eps)
      return (shape_scale(d.shape, scaling, rms) * from_matrix(o, d.shape)).astype(d.dtype)

    return jax.tree.map(orth, direction), MuonState(state.count + 1, buf)

  return optax.GradientTransformation(init, update)


def default_param_labels(params: Any, fallback_names: tuple[str, ...] =
                         DEFAULT_FALLBACK_NAMES) -> Any:
  """``"muon"`` for hidden matrices; ``"fallback"`` for ndim < 2 leaves and any leaf whose
  path contains one of ``fallback_names`` (embeddings, heads, biases, norms)."""
  def label(path, x):
    name = tree_paths.path_name(path).lower()
    if x.ndim < 2 or any(f in name for f in fallback_names):
      return FALLBACK
    return MUON
  return jax.tree_util.tree_map_with_path(label, params)


def all_matrices_labels(params: Any) -> Any:
  """Temperon's routing: EVERY ndim >= 2 leaf (stem and head included) gets Muon."""
  return jax.tree.map(lambda x: MUON if x.ndim >= 2 else FALLBACK, params)


def muon(learning_rate: optax.ScalarOrSchedule, *, momentum: float = 0.9,
         nesterov: bool = True, weight_decay: float = 0.0, ns_steps: int = 5,
         ns_dtype: str = "bf16", scaling: str = "shape", rms: float = 0.2,
         label_fn: Callable[[Any], Any] = default_param_labels, fallback: str = "sgd",
         fallback_learning_rate: optax.ScalarOrSchedule | None = None,
         fallback_weight_decay: float | None = None) -> optax.GradientTransformation:
  """Muon for the leaves ``label_fn`` marks ``"muon"``, a fallback for the rest.

  Muon leaves: ``-lr * (scale * NS(nesterov_momentum(g)) + weight_decay * p)`` (decoupled
  decay, ``p *= 1 - lr * wd``). Fallback leaves (``label_fn`` -> ``"fallback"``):
  ``"sgd"``: the same momentum/Nesterov SGD with the same decoupled decay (Temperon's
  choice for BN weights and biases); ``"adamw"``: ``optax.adamw``. The fallback's learning
  rate and decay default to Muon's.

  Under ``optax.inject_hyperparams`` pass ``static_args=("label_fn",)`` (it is a callable,
  not a schedule).
  """
  if fallback not in ("sgd", "adamw"):
    raise ValueError(f"fallback must be 'sgd' or 'adamw', got {fallback!r}")
  if not callable(label_fn):
    raise TypeError(f"label_fn must be callable, got {type(label_fn).__name__}")
  fb_lr = learning_rate if fallback_learning_rate is None else fallback_learning_rate
  fb_wd = weight_decay if fallback_weight_decay is None else fallback_weight_decay
  matrix = optax.chain(
      scale_by_muon(momentum, nesterov=nesterov, ns_steps=ns_steps, ns_dtype=ns_dtype,
                    scaling=scaling, rms=rms),
      optax.add_decayed_weights(weight_decay),
      optax.scale_by_learning_rate(learning_rate))
  if fallback == "sgd":
    rest = optax.chain(optax.trace(momentum, nesterov=nesterov),
                       optax.add_decayed_weights(fb_wd),
                       optax.scale_by_learning_rate(fb_lr))
  else:
    rest = optax.adamw(fb_lr, weight_decay=fb_wd)

  def labels(params):
    out = label_fn(params)
    bad = {v for v in jax.tree.leaves(out)} - {MUON, FALLBACK}
    if bad:
      raise ValueError(f"label_fn returned labels {sorted(map(str, bad))}; "
                       f"expected {MUON!r} or {FALLBACK!r}")
    return out

  return optax.partition({MUON: matrix, FALLBACK: rest}, labels)
