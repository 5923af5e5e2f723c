"""Adam(W) whose two moments are stored quantized between steps (8-bit, 4-bit, FP8, MX).

One step, per leaf, with ``g`` the gradient upcast to float32 and ``m``, ``v`` the
moments decoded from the state:

    m' = (1 - b1) g + b1 m          v' = (1 - b2) g^2 + b2 v
    update = (m' / (1 - b1^t)) / (sqrt(v' / (1 - b2^t) + eps_root) + eps)
    state  = encode(m'), encode(v')

The arithmetic is optax's ``scale_by_adam``: the moment updates and bias corrections
are optax's own ``optax.tree`` calls on the whole tree, so with the lossless ``fp32``
state format the transformation equals ``optax.scale_by_adam``, and
:func:`quantized_adamw` equals ``optax.adamw``, bit for bit, eager and under
``jax.jit`` (tested). A hand-written copy of those expressions is not enough: XLA
rewrites a division by a broadcast scalar into a reciprocal multiply depending on how
the surrounding computation is compiled (a jitted call on a tree, on a single leaf, or
eager ops), which moves results by an ulp. As in
bitsandbytes' and torchao's 8-bit and 4-bit optimizers, the update of step ``t`` uses
the fresh float32 ``m'``, ``v'``; quantization error enters through the stored state
at step ``t + 1``. Hence the first step of every format equals optax's first step.

Storage is set by a :class:`~numerics.optim.moment_codecs.StateFormat` (or its name,
see :func:`numerics.optim.moment_codecs.state_format`). Leaves with fewer than the
format's ``min_size`` elements (default 4096, bitsandbytes' and torchao's threshold)
keep float32 moments: their block scales would cost more than they save.

The second moment is non-negative by construction: its codec is unsigned (every
stored code decodes to a value >= 0; see :mod:`numerics.optim.moment_codecs`). The
variant ``state_format(name, sqrt_nu=True)`` stores ``sqrt(v')`` with the same
unsigned codec and squares it on decoding: a block then spans the square root of
``v``'s dynamic range, so fewer small second moments round to zero (a zero ``v`` under
a non-zero ``m`` is the large-update failure of low-bit second moments).

Stochastic rounding of the moments (a format built with ``rounding=Stochastic()``):
the leaf named ``p`` at step ``t`` (``t`` = the new count, from 1) rounds ``m'`` with
``fold_in(leaf_key, 0)`` and ``v'`` with ``fold_in(leaf_key, 1)``, where ``leaf_key =
fold_in(fold_in(key, t), crc32(p))`` (:mod:`numerics.optim.step_keys`). The state holds
``t``, so a run resumed from a saved state draws the same bits (tested).

Measure the state with :func:`numerics.memory.bytes_per_param`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lowprec.numerics import tree_paths
from lowprec.numerics.optim import moment_codecs
from lowprec.numerics.optim import step_keys

_MU_TAG, _NU_TAG = 0, 1


class QuantizedAdamState(NamedTuple):
  """``count`` int32[] (steps taken); ``mu``, ``nu`` pytrees of ``EncodedMoment``."""

  count: jax.Array
  mu: Any
  nu: Any


def _as_state_format(state_format) -> moment_codecs.StateFormat:
  if isinstance(state_format, moment_codecs.StateFormat):
    return state_format
  if isinstance(state_format, str):
    return moment_codecs.state_format(state_format)
  raise TypeError(f"state_format must be a name or a StateFormat, got "
                  f"{type(state_format).__name__}")


def scale_by_quantized_adam(
    b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, eps_root: float = 0.0, *,
    state_format: str | moment_codecs.StateFormat = "dynamic8",
    key: jax.Array | int | None = None) -> optax.GradientTransformation:
  """Adam's scaling with moments stored per ``state_format`` (see the module docstring).

  Args:
    b1, b2, eps, eps_root: as ``optax.scale_by_adam``.
    state_format: a :class:`StateFormat` or a name (``fp32``, ``dynamic8``, ...).
    key: PRNG key (or int seed) for stochastic rounding of the moments; required when
      the format rounds stochastically, refused otherwise.

  Returns:
    An optax ``GradientTransformation`` with a :class:`QuantizedAdamState`; updates
    are float32.
  """
  fmt = _as_state_format(state_format)
  if fmt.is_stochastic:
    if key is None:
      raise ValueError(f"state format {fmt.name!r} rounds stochastically: pass key")
    base_key = step_keys.as_key(key)
  else:
    if key is not None:
      raise ValueError(f"state format {fmt.name!r} rounds to nearest; key would be "
                       f"ignored")
    base_key = None

  def init_fn(params):
    def init_leaf(p):
      if not jnp.issubdtype(jnp.result_type(p), jnp.floating):
        raise TypeError(f"quantized Adam needs floating params, got {jnp.result_type(p)}")
      mu_c, nu_c = fmt.codecs_for(int(np.prod(jnp.shape(p), dtype=np.int64)))
      return mu_c.init(jnp.shape(p)), nu_c.init(jnp.shape(p))

    pairs = jax.tree.map(init_leaf, params)
    is_pair = lambda t: isinstance(t, tuple) and len(t) == 2 and all(
        isinstance(e, moment_codecs.EncodedMoment) for e in t)
    mu = jax.tree.map(lambda t: t[0], pairs, is_leaf=is_pair)
    nu = jax.tree.map(lambda t: t[1], pairs, is_leaf=is_pair)
    return QuantizedAdamState(count=jnp.zeros([], jnp.int32), mu=mu, nu=nu)

  def update_fn(updates, state, params=None):
    del params
    is_enc = lambda e: isinstance(e, moment_codecs.EncodedMoment)
    with_path, treedef = jax.tree_util.tree_flatten_with_path(updates)
    try:
      mu_leaves = treedef.flatten_up_to(state.mu)
      nu_leaves = treedef.flatten_up_to(state.nu)
    except (ValueError, TypeError) as e:
      raise ValueError(f"state does not match the updates' structure: {e}") from None
    names = [tree_paths.path_name(path, "root") for path, _ in with_path]
    for name, mu_e, nu_e in zip(names, mu_leaves, nu_leaves):
      if not (is_enc(mu_e) and is_enc(nu_e)):
        raise ValueError(f"state leaf at {name!r} is not an EncodedMoment")
    unflat = lambda leaves: jax.tree_util.tree_unflatten(treedef, leaves)
    g = unflat([jnp.asarray(leaf).astype(jnp.float32) for _, leaf in with_path])
    m = unflat([moment_codecs.decode(e) for e in mu_leaves])
    v = unflat([moment_codecs.decode(e) for e in nu_leaves])
    # optax.scale_by_adam's own calls on the whole tree: XLA compiles optax's jitted
    # bias correction differently for a tree than for one leaf (it rewrites the
    # division into a reciprocal multiply), so the calls must be the same to be equal.
    count_inc = optax.safe_increment(state.count)
    mu = optax.tree.update_moment(g, m, b1, 1)
    nu = optax.tree.update_moment_per_elem_norm(g, v, b2, 2)
    mu_hat = optax.tree.bias_correction(mu, b1, count_inc)
    nu_hat = optax.tree.bias_correction(nu, b2, count_inc)
    new_updates = jax.tree.map(lambda a, b: a / (jnp.sqrt(b + eps_root) + eps), mu_hat,
                               nu_hat)
    new_mu, new_nu = [], []
    for name, mu_e, nu_e, mu_l, nu_l in zip(names, mu_leaves, nu_leaves,
                                            treedef.flatten_up_to(mu),
                                            treedef.flatten_up_to(nu)):
      mu_key = nu_key = None
      if base_key is not None:
        k = step_keys.leaf_key(base_key, count_inc, name)
        mu_key = jax.random.fold_in(k, _MU_TAG) if mu_e.codec.rounding.needs_key else None
        nu_key = jax.random.fold_in(k, _NU_TAG) if nu_e.codec.rounding.needs_key else None
      new_mu.append(mu_e.codec.encode(mu_l, mu_key))
      new_nu.append(nu_e.codec.encode(nu_l, nu_key))
    return new_updates, QuantizedAdamState(count_inc, unflat(new_mu), unflat(new_nu))

  return optax.GradientTransformation(init_fn, update_fn)


def quantized_adamw(
    learning_rate: optax.ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
    eps: float = 1e-8, eps_root: float = 0.0, weight_decay: float = 1e-4,
    mask: Any = None, *, state_format: str | moment_codecs.StateFormat = "dynamic8",
    key: jax.Array | int | None = None) -> optax.GradientTransformation:
  """AdamW with quantized moments: ``optax.adamw``'s chain around
  :func:`scale_by_quantized_adam` (decoupled weight decay ``weight_decay * params``
  masked by ``mask``, then ``-learning_rate``). Arguments as ``optax.adamw`` plus those
  of :func:`scale_by_quantized_adam`."""
  return optax.chain(
      scale_by_quantized_adam(b1, b2, eps, eps_root, state_format=state_format, key=key),
      optax.add_decayed_weights(weight_decay, mask),
      optax.scale_by_learning_rate(learning_rate),
  )


def decoded_moments(state: QuantizedAdamState) -> tuple[Any, Any]:
  """(mu, nu) of a :class:`QuantizedAdamState` as float32 pytrees (``nu`` is Adam's
  ``v`` whether it was stored as ``v`` or ``sqrt(v)``)."""
  if not isinstance(state, QuantizedAdamState):
    raise TypeError(f"expected a QuantizedAdamState, got {type(state).__name__}")
  return moment_codecs.tree_decode(state.mu), moment_codecs.tree_decode(state.nu)
