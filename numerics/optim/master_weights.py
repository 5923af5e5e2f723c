"""bf16 (or fp16) master weights: how a float32 update lands on low-precision params.

Plain ``optax.apply_updates`` on a bf16 parameter computes ``bf16(p + u)`` with round
to nearest even: an update below half an ulp of ``p`` is lost, every step, so small
learning rates stall (Zamirai et al., "Revisiting BFloat16 Training", 2020). This
transformation, placed LAST in an optax chain, decides the new low-precision value
and returns the float32 difference ``d = new - p``; ``optax.apply_updates(params, d)``
then lands exactly on ``new`` (``p + d`` is exact in float32, or within a float32 ulp
of ``new`` when their exponents are far apart, which the final bf16 cast rounds back
to ``new``; tested). Rules, per low-precision leaf with ``u`` the float32 update:

* ``Nearest()``: ``new = RNE(p + u)``: what ``apply_updates`` does anyway (the
  baseline).
* ``Stochastic(bits=..., rng=...)``: ``new = SR(p + u)``, bit-level stochastic rounding
  of the float32 sum (:func:`numerics.cast`, every discarded bit randomized unless
  ``bits``), so
  ``E[new] = fl32(p + u)``: small updates move the weight with the right probability.
  Leaf ``name`` at step ``t`` (the new count, from 1) uses
  ``fold_in(fold_in(key, t), crc32(name))`` (:mod:`numerics.optim.step_keys`).
* :class:`Kahan` (this module's own mode: it carries state between steps): compensated
  summation with a buffer ``c`` per element:
  ``y = u + c``, ``s = p + y``, ``new = RNE(s)``, ``c' = s - new`` (optimi's Kahan
  buffers, AnyPrecisionAdamW's ``use_kahan_summation``). ``c`` is stored in
  ``Kahan(compensation_dtype)``: bf16 (the default, 16 + 16 bits per weight, as
  optimi) keeps the top 8 significant bits of the lost part; float32 keeps all of it.

Float32 leaves pass through unchanged (they are their own masters). Leaves of other
dtypes raise. Overflow saturates to the format's max (``numerics.cast`` with
``saturate=True``), unlike ``apply_updates``, which would give Inf.

The returned updates are not differentiable in any useful sense (rounding); use them
only for applying.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from lowprec.numerics import rounding as rounding_lib
from lowprec.numerics import tree_paths
from lowprec.numerics.optim import step_keys

_FORMAT_OF_DTYPE = {jnp.dtype(jnp.bfloat16): "bf16", jnp.dtype(jnp.float16): "fp16"}
_COMPENSATION_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))


@dataclasses.dataclass(frozen=True)
class Kahan:
  """Round to nearest and carry each leaf's rounding error to the next step in a
  compensation buffer of ``compensation_dtype`` (bfloat16 or float32)."""
  compensation_dtype: Any = jnp.bfloat16
  name = "kahan"
  needs_key = False

  def __post_init__(self):
    dtype = jnp.dtype(self.compensation_dtype)
    if dtype not in _COMPENSATION_DTYPES:
      raise ValueError(f"compensation_dtype must be bfloat16 or float32, got {dtype}")
    object.__setattr__(self, "compensation_dtype", dtype)


_KINDS = (rounding_lib.Nearest, rounding_lib.Stochastic, Kahan)
ROUNDINGS = tuple(k.name for k in _KINDS)


def parse_rounding(name: str, *, bits: int | None = None, rng: str = "hash"
                   ) -> rounding_lib.Rounding | Kahan:
  """The master-weight rounding named ``name`` (one of ``ROUNDINGS``; ``"kahan"`` is
  :class:`Kahan` with bfloat16 buffers), as :func:`numerics.rounding.parse`."""
  return rounding_lib.parse(name, bits=bits, rng=rng, kinds=_KINDS)


class MasterWeightsState(NamedTuple):
  """``count`` int32[]; ``compensation``: params' structure, a Kahan buffer for each
  low-precision leaf under ``kahan`` (None elsewhere and under the other rules)."""

  count: jax.Array
  compensation: Any


def _low_precision_format(path: str, p) -> str | None:
  dtype = jnp.result_type(p)
  if dtype == jnp.float32:
    return None
  try:
    return _FORMAT_OF_DTYPE[jnp.dtype(dtype)]
  except KeyError:
    raise TypeError(f"param {path!r} has dtype {dtype}; bf16_master_weights handles "
                    f"bfloat16, float16 and (passing through) float32") from None


def bf16_master_weights(
    rounding: rounding_lib.Rounding | Kahan = rounding_lib.Stochastic(), *,
    key: jax.Array | int | None = None) -> optax.GradientTransformation:
  """Rounds each update onto bf16/fp16 params per ``rounding`` (module docstring).

  Args:
    rounding: ``Nearest()``, ``Stochastic(bits=..., rng=...)`` or ``Kahan(dtype)``.
    key: PRNG key or int seed; required for ``Stochastic``, refused otherwise.

  Returns:
    An optax ``GradientTransformation`` with a :class:`MasterWeightsState`; ``update``
    requires ``params`` and returns float32 updates for the low-precision leaves.
  """
  rounding_lib.check_rounding(rounding, "bf16_master_weights",
                              "lowprec.numerics.optim.master_weights.parse_rounding", _KINDS)
  kahan = isinstance(rounding, Kahan)
  stochastic = isinstance(rounding, rounding_lib.Stochastic)
  if stochastic != (key is not None):
    raise ValueError("key is required for Stochastic rounding and refused otherwise")
  base_key = step_keys.as_key(key) if key is not None else None

  def init_fn(params):
    def comp(path, p):
      fmt = _low_precision_format(tree_paths.path_name(path, "root"), p)
      if not kahan or fmt is None:
        return None
      return jnp.zeros(jnp.shape(p), rounding.compensation_dtype)

    return MasterWeightsState(jnp.zeros([], jnp.int32),
                              jax.tree_util.tree_map_with_path(comp, params))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("bf16_master_weights needs params (the values to round onto)")
    count_inc = optax.safe_increment(state.count)
    with_path, treedef = jax.tree_util.tree_flatten_with_path(params)
    u_leaves = treedef.flatten_up_to(updates)
    c_leaves = treedef.flatten_up_to(state.compensation)
    out_u, out_c = [], []
    for (path, p), u, c in zip(with_path, u_leaves, c_leaves):
      name = tree_paths.path_name(path, "root")
      fmt = _low_precision_format(name, p)
      if fmt is None:
        out_u.append(u)
        out_c.append(c)
        continue
      pf = jnp.asarray(p).astype(jnp.float32)
      uf = jnp.asarray(u).astype(jnp.float32)
      if kahan:
        s = pf + (uf + c.astype(jnp.float32))
        new = rounding_lib.cast(s, fmt)
        c = (s - new).astype(rounding.compensation_dtype)
      else:
        leaf_key = (step_keys.leaf_key(base_key, count_inc, name) if stochastic
                    else None)
        new = rounding_lib.cast(pf + uf, fmt, rounding=rounding, key=leaf_key)
      out_u.append(new - pf)
      out_c.append(c)
    unflat = lambda leaves: jax.tree_util.tree_unflatten(treedef, leaves)
    return unflat(out_u), MasterWeightsState(count_inc, unflat(out_c))

  return optax.GradientTransformation(init_fn, update_fn)
