"""Exporting float32 master weights to the served (sampler) copy, and measuring it.

In RL the learner keeps float32 master weights and the sampler serves a copy in a
narrower format (bf16, fp16, FP8, an MX block format, ...). :func:`export` produces
that copy from a pytree of masters under one of three rounding rules:

* ``nearest``: round half to even, element-wise with :func:`numerics.rounding.cast`
  (bit-exact with ml_dtypes) or per block with
  :func:`numerics.quantizer.quantize_dequantize`. Stateless. An update smaller than the
  distance to the next rounding midpoint (about half an ulp) leaves the served value
  unchanged: with Adam at RL learning rates most bf16 values stay bit-identical from
  one export to the next.
* ``stochastic``: unbiased stochastic rounding, ``E[served] = master`` exactly for
  bf16/fp16 and the 8-bit and narrower formats (all discarded bits are randomized).
  The random bits of leaf ``i`` at export number ``step`` come from
  ``fold_in(fold_in(key, step), i)``, so exports at different steps draw different
  bits even when the caller passes the same key, and equal (key, step) reproduce.
* ``error_feedback`` (sigma-delta): ``q = RNE(w + r)``, ``r' = (w + r) - q`` with a
  float32 residual ``r`` per element carried in :class:`ExportState`. Deterministic;
  ``sum_t served_t = sum_t w_t + r_0 - r_T``, so the running sum of the served copy
  tracks that of the master within one residual (``|r| <= ulp/2`` without overflow)
  and no update is lost for good. Residuals that become non-finite or whose target
  ``w + r`` overflows the format are reset to zero (they could not be paid back).

Leaves: every floating leaf of the master must be float32 (TypeError otherwise) and is
exported, scalars included; non-floating leaves (ints, bools) pass through unchanged.
Element-wise casts always saturate finite overflow to ``+-max`` (Inf stays Inf in
bf16/fp16); block targets follow their QuantSpec.

Metrics (pure, jitted; dicts keyed by the '/'-joined pytree path of each
floating leaf, ``"root"`` for a bare array, plus ``"global"`` over all floating leaves):
:func:`unchanged_fraction`, :func:`ulp_distance`, :func:`relative_drift`, and the lag
tracker :func:`init_lag_state` / :func:`update_lag`.

Grid spacing ("ulp") used by the ulp metrics, for a served value ``s`` on an
element-wise grid with ``man_bits`` mantissa bits and smallest normal exponent ``emin``
and a master ``m``: ``ulp(s, m) = 2^(max(floor(log2|s|), emin) - man_bits)`` (for
``s = 0``: ``2^(emin - man_bits)``), halved when ``|s|`` is a normal power of two above
``2^emin`` and ``m`` lies on the zero side of ``s`` (the binade below is finer). It is
the distance from ``s`` to its grid neighbour in the direction of ``m``, so
``|m - s| <= ulp(s, m) / 2`` holds exactly when ``s`` is a nearest grid value of ``m``
(ties included). This is computed in float32 arithmetic: on backends that flush float32
subnormals (XLA:CPU) differences below ``2^-126`` read as zero.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from numerics import formats as formats_lib
from numerics import quantizer as quantizer_lib
from numerics import random_bits as random_bits_lib
from numerics import rounding as rounding_lib
from numerics import tree_paths

Export = Callable[[Any], Any]
EXPORT_ROUNDINGS = ("nearest", "stochastic", "error_feedback")
GLOBAL = "global"
_ROOT = "root"
_F32 = jnp.float32
# Formats whose served copy is stored in their own dtype (XLA holds them everywhere).
_NATIVE_DTYPE_BITS = 8


# ------------------------------------------------------------------------------ spec


@dataclasses.dataclass(frozen=True)
class ExportSpec:
  """How master weights are exported (hashable: usable as a static jit argument).

  Attributes:
    target: a format name from :mod:`numerics.formats` (``"bf16"``, ``"fp16"``,
      ``"e4m3"``, ...; not the scale format ``"e8m0"``) for an element-wise cast, or a
      :class:`numerics.quantizer.QuantSpec` for a block format, e.g. MXFP8 for an
      ``(in, out)`` kernel: ``QuantSpec("e4m3", block_size=32, axis=0)``. The
      QuantSpec's own ``rounding`` must be ``"nearest"`` (its default) or equal to
      ``rounding``; ``rounding`` and ``rng`` here decide.
    rounding: ``"nearest"``, ``"stochastic"`` or ``"error_feedback"``.
    rng: random-word generator for ``stochastic`` (``"hash"`` or ``"threefry"``).
  """

  target: str | quantizer_lib.QuantSpec = "bf16"
  rounding: str = "nearest"
  rng: str = "hash"

  def __post_init__(self):
    if self.rounding not in EXPORT_ROUNDINGS:
      raise ValueError(f"unknown rounding {self.rounding!r}; known: "
                       f"{', '.join(EXPORT_ROUNDINGS)}")
    if self.rng not in random_bits_lib.METHODS:
      raise ValueError(f"unknown rng {self.rng!r}; known: "
                       f"{', '.join(random_bits_lib.METHODS)}")
    target = self.target
    if isinstance(target, formats_lib.Format):
      object.__setattr__(self, "target", target.name)
    elif isinstance(target, quantizer_lib.QuantSpec):
      if target.rounding not in ("nearest", self._quant_rounding()):
        raise ValueError(
            f"the target QuantSpec has rounding={target.rounding!r}, which conflicts "
            f"with ExportSpec rounding={self.rounding!r}; leave the QuantSpec's "
            f"rounding at 'nearest' and choose it here")
    elif isinstance(target, str):
      try:
        f = formats_lib.get(target)
      except ValueError as e:
        raise ValueError(f"{e} (for block formats such as MX or nvfp4 pass a "
                         f"numerics.quantizer.QuantSpec)") from None
      if f.kind == "scale":
        raise ValueError(f"{f.name} is a scale format (unsigned, no zero) and cannot "
                         f"hold weights")
    else:
      raise TypeError(f"target must be a format name or a QuantSpec, got "
                      f"{type(target).__name__}")

  def _quant_rounding(self) -> str:
    return "stochastic" if self.rounding == "stochastic" else "nearest"

  @property
  def is_cast(self) -> bool:
    """True for an element-wise cast to a named format (``target`` is a string)."""
    return isinstance(self.target, str)

  @property
  def is_stateful(self) -> bool:
    """True when the export needs a key or carried state (not ``nearest``)."""
    return self.rounding != "nearest"

  @property
  def element_format(self) -> formats_lib.Format:
    """The element format (for a QuantSpec: its element format; not for nvfp4)."""
    name = self.target if self.is_cast else self.target.fmt
    if name == "nvfp4":
      return formats_lib.get("e2m1")
    return formats_lib.get(name)

  @property
  def served_dtype(self) -> jnp.dtype:
    """dtype of the served copy's floating leaves.

    bf16 -> bfloat16, fp16 -> float16, e4m3 -> float8_e4m3fn, e5m2 -> float8_e5m2; FP6,
    FP4 and int8 casts and all QuantSpec targets give float32 arrays holding grid
    values (sub-byte dtypes are not held uniformly by XLA backends).
    """
    if self.is_cast:
      f = formats_lib.get(self.target)
      if f.kind == "float" and f.bits >= _NATIVE_DTYPE_BITS and f.xla_castable:
        return jnp.dtype(f.np_dtype)
    return jnp.dtype(jnp.float32)

  def quant_spec(self, rounding: str | None = None) -> quantizer_lib.QuantSpec:
    """The target QuantSpec with this spec's rounding (``rounding`` overrides)."""
    if self.is_cast:
      raise ValueError(f"target {self.target!r} is an element-wise cast")
    return dataclasses.replace(self.target, rounding=rounding or self._quant_rounding(),
                               rng=self.rng)


class ExportState(NamedTuple):
  """Export state carried in the training state (a plain pytree of arrays).

  Attributes:
    residual: for ``error_feedback``, a pytree of the master's structure with a float32
      array of each floating leaf's shape (None at non-floating leaves); ``None`` for
      the other roundings.
    step: int32[] number of exports done; seeds stochastic rounding.
  """

  residual: Any
  step: jax.Array


def init_export_state(master: Any, spec: ExportSpec) -> ExportState:
  """The export state before the first export: zero residuals, step 0.

  Args:
    master: pytree of master weights (floating leaves float32).
    spec: the export spec the state will be used with.
  """
  _check_spec(spec)
  residual = None
  if spec.rounding == "error_feedback":
    paths, leaves, treedef = _flatten(master)
    res = []
    for path, leaf in zip(paths, leaves):
      if _is_float(leaf):
        _check_master_leaf(path, leaf)
        res.append(jnp.zeros(jnp.shape(leaf), _F32))
      else:
        res.append(None)
    residual = jax.tree_util.tree_unflatten(treedef, res)
  return ExportState(residual=residual, step=jnp.zeros((), jnp.int32))


# ---------------------------------------------------------------------------- export


@functools.partial(jax.jit, static_argnames=("spec",))
def export(master: Any, spec: ExportSpec, state: ExportState,
           key: jax.Array | None = None) -> tuple[Any, ExportState]:
  """Exports float32 master weights to the served copy (pure, jitted).

  Args:
    master: pytree; floating leaves must be float32 (any shape), others pass through.
    spec: the :class:`ExportSpec` (static).
    state: from :func:`init_export_state` (or a previous export) for this spec.
    key: JAX PRNG key, required for ``stochastic``. Leaf ``i`` (in tree-flatten
      order) rounds with ``fold_in(fold_in(key, state.step), i)``.

  Returns:
    ``(served, new_state)``: ``served`` has the master's structure; floating leaves in
    ``spec.served_dtype`` holding values exact in the target (``nearest``:
    ``RNE(w)``; ``stochastic``: ``SR(w)``; ``error_feedback``: ``RNE(w + r)``).
    ``new_state.step = state.step + 1``; ``error_feedback`` updates the residuals.

  Raises:
    TypeError: a floating master leaf is not float32.
    ValueError: ``stochastic`` without a key, or a state that does not fit the spec.
  """
  _check_spec(spec)
  if not isinstance(state, ExportState):
    raise TypeError(f"state must be an ExportState, got {type(state).__name__}")
  if spec.rounding == "stochastic" and key is None:
    raise ValueError("rounding='stochastic' needs a PRNG key")
  paths, leaves, treedef = _flatten(master)
  ef = spec.rounding == "error_feedback"
  if ef:
    if state.residual is None:
      raise ValueError("error_feedback needs residuals: make the state with "
                       "init_export_state(master, spec) for this spec")
    try:
      residuals = treedef.flatten_up_to(state.residual)
    except (ValueError, TypeError) as e:
      raise ValueError(f"state.residual does not match the master's structure: {e}"
                       ) from None
  else:
    residuals = [None] * len(leaves)
  step = jnp.asarray(state.step, jnp.int32)
  served, new_res = [], []
  for i, (path, leaf, res) in enumerate(zip(paths, leaves, residuals)):
    if not _is_float(leaf):
      served.append(leaf)
      new_res.append(None)
      continue
    w = _check_master_leaf(path, leaf)
    leaf_key = None
    if spec.rounding == "stochastic":
      leaf_key = jax.random.fold_in(jax.random.fold_in(key, step), i)
    if ef:
      res = jnp.asarray(res)
      if res.dtype != _F32 or res.shape != w.shape:
        raise ValueError(f"residual at {path!r} must be float32{list(w.shape)}, got "
                         f"{res.dtype}{list(res.shape)}")
    try:
      s, r = _export_leaf(w, spec, leaf_key, res)
    except (ValueError, TypeError) as e:
      raise type(e)(f"exporting leaf {path!r}: {e}") from None
    served.append(s)
    new_res.append(r)
  residual = jax.tree_util.tree_unflatten(treedef, new_res) if ef else None
  return (jax.tree_util.tree_unflatten(treedef, served),
          ExportState(residual=residual, step=step + 1))


def _export_leaf(w, spec, key, residual):
  """(served leaf in spec.served_dtype, new float32 residual or None)."""
  if spec.is_cast:
    f = formats_lib.get(spec.target)
    if spec.rounding == "error_feedback":
      q, r = rounding_lib.error_feedback(w, residual, f)
      r = _reset_residual(r, w + residual, f.max)
    else:
      q, r = rounding_lib.cast(w, f, rounding=spec.rounding, key=key,
                               rng=spec.rng), None
    return q.astype(spec.served_dtype), r
  if spec.rounding == "error_feedback":
    target = w + residual
    q = quantizer_lib.quantize_dequantize(target, spec.quant_spec("nearest"))
    return q, _reset_residual(target - q, target, None)
  return quantizer_lib.quantize_dequantize(w, spec.quant_spec(), key), None


def _reset_residual(r, target, fmax):
  keep = jnp.isfinite(r)
  if fmax is not None:
    keep &= jnp.abs(target) <= np.float32(fmax)
  return jnp.where(keep, r, jnp.zeros_like(r))


def make_export(spec: ExportSpec) -> Export:
  """A stateless ``params -> served`` export for ``rounding="nearest"``.

  The :data:`numerics.rl.sampler_copy.Export` signature: pass it to
  ``sampler_copy.initial_copy`` / ``maybe_refresh``.

  Raises:
    ValueError: for ``stochastic`` or ``error_feedback`` (they need a key or state;
      call :func:`export` with an :class:`ExportState`).
  """
  _check_spec(spec)
  if spec.is_stateful:
    raise ValueError(f"rounding={spec.rounding!r} is stateful (needs a key or "
                     f"residuals); use export(master, spec, state, key)")

  def export_fn(params):
    state = ExportState(residual=None, step=jnp.zeros((), jnp.int32))
    return export(params, spec, state)[0]

  return export_fn


# ------------------------------------------------------------------ straight-through


@jax.custom_vjp
def _straight_through_leaf(master, served):
  return served.astype(_F32)


def _st_fwd(master, served):
  return served.astype(_F32), served


def _st_bwd(served, g):
  return g, jnp.zeros_like(served)


_straight_through_leaf.defvjp(_st_fwd, _st_bwd)


@jax.jit
def straight_through(master: Any, served: Any) -> Any:
  """The served values in the forward pass, the identity gradient to the master.

  Per floating leaf this is ``master + stop_gradient(served - master)``, implemented
  as a custom VJP so the forward is *exactly* ``served.astype(float32)`` bit for bit
  (the float32 sum can round when ``|served - master|`` is not exact, e.g. after
  saturation, or flush subnormals). The cotangent passes to ``master`` unchanged;
  ``served`` gets a zero cotangent. Non-floating leaves return the served leaf.

  Args:
    master: pytree of float32 master weights.
    served: pytree of the same structure and shapes (e.g. from :func:`export`).

  Returns:
    A pytree of float32 leaves equal to the served values (non-floating: served).
  """
  paths, m_leaves, treedef = _flatten(master)
  s_leaves = _flatten_like(treedef, served, "served")
  out = []
  for path, m, s in zip(paths, m_leaves, s_leaves):
    if not _is_float(m):
      out.append(s)
      continue
    m = _check_master_leaf(path, m)
    s = _check_served_leaf(path, m, s)
    out.append(_straight_through_leaf(m, s))
  return jax.tree_util.tree_unflatten(treedef, out)


# --------------------------------------------------------------------------- metrics


@jax.jit
def unchanged_fraction(prev_served: Any, served: Any) -> dict[str, jax.Array]:
  """Fraction of elements whose served value is bit-identical to the previous export.

  Compares bit patterns (so ``-0`` vs ``+0`` counts as a change and a NaN that stays
  the same NaN does not). The PULSE / Fireworks statistic: about 98-99% for bf16 at
  RL learning rates with ``nearest``.

  Args:
    prev_served, served: pytrees of the same structure; floating leaves of equal
      shape and dtype are compared, non-floating leaves are ignored.

  Returns:
    ``{path: float32[]}`` per floating leaf and ``"global"`` (over all elements).
    An empty leaf counts as fully unchanged.
  """
  paths, p_leaves, treedef = _flatten(prev_served)
  s_leaves = _flatten_like(treedef, served, "served")
  out, tot_same, tot_n = {}, jnp.zeros((), _F32), 0
  for path, p, s in zip(paths, p_leaves, s_leaves):
    if not _is_float(p):
      continue
    p, s = jnp.asarray(p), jnp.asarray(s)
    if p.shape != s.shape or p.dtype != s.dtype:
      raise ValueError(f"leaf {path!r}: prev_served is {p.dtype}{list(p.shape)} but "
                       f"served is {s.dtype}{list(s.shape)}")
    same = jnp.sum(_bits(p) == _bits(s), dtype=_F32)
    out[path] = _safe_div(same, p.size, 1.0)
    tot_same, tot_n = tot_same + same, tot_n + p.size
  out[GLOBAL] = _safe_div(tot_same, tot_n, 1.0)
  return out


@functools.partial(jax.jit, static_argnames=("spec",))
def ulp_distance(master: Any, served: Any, spec: ExportSpec) -> dict[str, dict]:
  """``|master - served|`` in units of the served grid's spacing at the served value.

  The unit is ``ulp(s, m)`` of the module docstring: the gap from ``s`` to its grid
  neighbour toward ``m`` (e.g. bf16 at 1.0 toward larger values: ``2^-7``, so
  ``m = 1 + 2^-9`` served as 1.0 is 0.25 ulp). ``nearest`` exports are always within
  0.5. Only element-wise cast targets are supported.

  Args:
    master: pytree of float32 masters; served: same structure and shapes.
    spec: the export spec whose grid ``served`` lies on.

  Returns:
    ``{path: {"mean": float32[], "max": float32[]}}`` per floating leaf and
    ``"global"`` (element-weighted mean, overall max). Non-finite values propagate.

  Raises:
    NotImplementedError: for QuantSpec (block) targets.
  """
  fmt = _grid_format(spec, "ulp_distance")
  out, tot, n, mx = {}, jnp.zeros((), _F32), 0, jnp.zeros((), _F32)
  for path, m, s in _float_pairs(master, served):
    d = _ulp_ratio(m, s, fmt)
    total = jnp.sum(d)
    leaf_max = jnp.max(d, initial=0.0)
    out[path] = {"mean": _safe_div(total, d.size, 0.0), "max": leaf_max}
    tot, n, mx = tot + total, n + d.size, jnp.maximum(mx, leaf_max)
  out[GLOBAL] = {"mean": _safe_div(tot, n, 0.0), "max": mx}
  return out


@jax.jit
def relative_drift(master: Any, served: Any) -> dict[str, jax.Array]:
  """``||served - master||_2 / ||master||_2`` per floating leaf and globally.

  Both in float32 (served upcast exactly). A zero master gives 0 when the served copy
  is zero too, else Inf.

  Returns:
    ``{path: float32[]}`` and ``"global"`` (norms over all floating leaves together).
  """
  out, dsq, msq = {}, jnp.zeros((), _F32), jnp.zeros((), _F32)
  for path, m, s in _float_pairs(master, served):
    d2 = jnp.sum(jnp.square(s - m))
    m2 = jnp.sum(jnp.square(m))
    out[path] = _norm_ratio(d2, m2)
    dsq, msq = dsq + d2, msq + m2
  out[GLOBAL] = _norm_ratio(dsq, msq)
  return out


# ------------------------------------------------------------------------ lag tracker


class LagState(NamedTuple):
  """Per-element lag of the served copy behind the master (a pytree of arrays).

  Each field has the master's structure, None at non-floating leaves.

  Attributes:
    pending_since: int32, the leaf's shape: ``-1`` where the served value reflects the
      master (``|m - s| <= tolerance * ulp(s, m)``), else the step at which the
      current lag episode was first observed.
    lag_sum: float32[] per leaf: sum of the lengths (steps) of completed episodes.
    lag_count: float32[] per leaf: number of completed episodes. Both are float32 so
      they cannot overflow; they are exact while below 2^24.
  """

  pending_since: Any
  lag_sum: Any
  lag_count: Any


def init_lag_state(master: Any) -> LagState:
  """A lag state with nothing pending and no completed lags, for ``master``'s tree."""
  paths, leaves, treedef = _flatten(master)
  pend, sums, counts = [], [], []
  for path, leaf in zip(paths, leaves):
    if _is_float(leaf):
      pend.append(jnp.full(jnp.shape(leaf), -1, jnp.int32))
      sums.append(jnp.zeros((), _F32))
      counts.append(jnp.zeros((), _F32))
    else:
      pend.append(None)
      sums.append(None)
      counts.append(None)
  unflat = functools.partial(jax.tree_util.tree_unflatten, treedef)
  return LagState(unflat(pend), unflat(sums), unflat(counts))


@functools.partial(jax.jit, static_argnames=("spec", "tolerance"))
def update_lag(lag_state: LagState, master: Any, served: Any, spec: ExportSpec,
               step: int | jax.Array, *, tolerance: float = 0.5
               ) -> tuple[LagState, dict[str, dict]]:
  """Advances the lag tracker to ``step`` with the current master and served copy.

  Definitions (per element, ``d = |m - s| / ulp(s, m)`` as in :func:`ulp_distance`):

  * *lagging* at ``step``: ``d > tolerance`` (default half an ulp, i.e. the served
    value is not a nearest grid value of the master), or ``d`` is NaN.
  * an *episode* starts at the first observed lagging step ``t0`` (``pending_since``
    is set to ``t0``) and *completes* at the first later observed step ``t1`` at which
    the element is not lagging; its length is ``t1 - t0`` steps. E.g. a master that
    moves past half an ulp at step 3 while the served copy catches up at step 5 has a
    completed lag of 2. Its current *age* at ``step`` is ``step - t0``.

  Lags are in the units of ``step`` and resolved at the calls made: call it at every
  learner step with the copy the sampler actually serves (e.g. a stale
  :class:`numerics.rl.sampler_copy.SamplerCopy`); ``step`` must not decrease. A
  ``nearest`` export taken at the same step never lags by this definition (it is
  within half an ulp); stale copies, stochastic and error-feedback exports can.

  Args:
    lag_state: from :func:`init_lag_state` or a previous call.
    master: pytree of float32 masters; served: same structure and shapes.
    spec: the export spec whose grid ``served`` lies on (casts only).
    step: int or int32[] current step.
    tolerance: lag threshold in ulps (default 0.5).

  Returns:
    ``(new_lag_state, metrics)``; ``metrics[path]`` and ``metrics["global"]`` hold
    float32[] ``lagging_fraction`` (elements lagging now), ``mean_age`` and ``max_age``
    (over the elements lagging now; 0 if none), ``completed`` (episodes completed at
    this call), ``mean_completed_lag`` (over all episodes completed so far; 0 if none)
    and ``completed_total``.

  Raises:
    NotImplementedError: for QuantSpec (block) targets.
  """
  fmt = _grid_format(spec, "update_lag")
  if not isinstance(lag_state, LagState):
    raise TypeError(f"lag_state must be a LagState, got {type(lag_state).__name__}")
  step = jnp.asarray(step, jnp.int32)
  paths, m_leaves, treedef = _flatten(master)
  s_leaves = _flatten_like(treedef, served, "served")
  pend_l = _flatten_like(treedef, lag_state.pending_since, "lag_state.pending_since")
  sum_l = _flatten_like(treedef, lag_state.lag_sum, "lag_state.lag_sum")
  cnt_l = _flatten_like(treedef, lag_state.lag_count, "lag_state.lag_count")
  new_p, new_s, new_c, metrics = [], [], [], {}
  g = dict(n=0, lagging=0.0, age_sum=0.0, max_age=jnp.zeros((), jnp.int32),
           completed=0.0, lag_sum=0.0, lag_count=0.0)
  for path, m, s, p, ls, lc in zip(paths, m_leaves, s_leaves, pend_l, sum_l, cnt_l):
    if not _is_float(m):
      for lst in (new_p, new_s, new_c):
        lst.append(None)
      continue
    m = _check_master_leaf(path, m)
    s = _check_served_leaf(path, m, s)
    p = jnp.asarray(p)
    if p.shape != m.shape or p.dtype != jnp.int32:
      raise ValueError(f"lag_state.pending_since at {path!r} must be int32"
                       f"{list(m.shape)}, got {p.dtype}{list(p.shape)}")
    lagging = ~(_ulp_ratio(m, s.astype(_F32), fmt) <= tolerance)
    was = p >= 0
    done = was & ~lagging
    pend = jnp.where(lagging, jnp.where(was, p, step), -1)
    n_lag = jnp.sum(lagging, dtype=_F32)
    age = jnp.where(lagging, step - pend, 0)
    age_sum = jnp.sum(age, dtype=_F32)
    max_age = jnp.max(age, initial=0).astype(jnp.int32)
    n_done = jnp.sum(done, dtype=_F32)
    ls = ls + jnp.sum(jnp.where(done, step - p, 0), dtype=_F32)
    lc = lc + n_done
    new_p.append(pend)
    new_s.append(ls)
    new_c.append(lc)
    metrics[path] = _lag_metrics(m.size, n_lag, age_sum, max_age, n_done, ls, lc)
    g["n"] += m.size
    g["lagging"] += n_lag
    g["age_sum"] += age_sum
    g["max_age"] = jnp.maximum(g["max_age"], max_age)
    g["completed"] += n_done
    g["lag_sum"] += ls
    g["lag_count"] += lc
  metrics[GLOBAL] = _lag_metrics(g["n"], g["lagging"], g["age_sum"], g["max_age"],
                                 g["completed"], g["lag_sum"], g["lag_count"])
  unflat = functools.partial(jax.tree_util.tree_unflatten, treedef)
  return LagState(unflat(new_p), unflat(new_s), unflat(new_c)), metrics


def _lag_metrics(n, n_lag, age_sum, max_age, n_done, lag_sum, lag_count):
  return {
      "lagging_fraction": _safe_div(n_lag, n, 0.0),
      "mean_age": _safe_div(age_sum, n_lag, 0.0),
      "max_age": jnp.asarray(max_age, _F32),
      "completed": jnp.asarray(n_done, _F32),
      "mean_completed_lag": _safe_div(lag_sum, lag_count, 0.0),
      "completed_total": jnp.asarray(lag_count, _F32),
  }


# --------------------------------------------------------------------------- helpers


def _check_spec(spec):
  if not isinstance(spec, ExportSpec):
    raise TypeError(f"spec must be an ExportSpec, got {type(spec).__name__}")


def _is_float(leaf) -> bool:
  return jnp.issubdtype(jnp.result_type(leaf), jnp.floating)


def _check_master_leaf(path, leaf):
  leaf = jnp.asarray(leaf)
  if leaf.dtype != _F32:
    raise TypeError(f"master leaf {path!r} must be float32, got {leaf.dtype}")
  return leaf


def _check_served_leaf(path, m, s):
  s = jnp.asarray(s)
  if not jnp.issubdtype(s.dtype, jnp.floating) or s.shape != m.shape:
    raise ValueError(f"served leaf {path!r} must be floating of shape {list(m.shape)}, "
                     f"got {s.dtype}{list(s.shape)}")
  return s


def _flatten(tree):
  """(path names, leaves, treedef); path names are unique and never 'global'."""
  with_path, treedef = jax.tree_util.tree_flatten_with_path(tree)
  names = [tree_paths.path_name(p, _ROOT) for p, _ in with_path]
  if GLOBAL in names:
    raise ValueError(f"a leaf path is named {GLOBAL!r}, which the metrics reserve")
  return names, [leaf for _, leaf in with_path], treedef


def _flatten_like(treedef, tree, what):
  try:
    return treedef.flatten_up_to(tree)
  except (ValueError, TypeError) as e:
    raise ValueError(f"{what} does not match the master's tree structure: {e}"
                     ) from None


def _float_pairs(master, served):
  """(path, float32 master, float32 served) for every floating leaf."""
  paths, m_leaves, treedef = _flatten(master)
  s_leaves = _flatten_like(treedef, served, "served")
  for path, m, s in zip(paths, m_leaves, s_leaves):
    if _is_float(m):
      m = _check_master_leaf(path, m)
      yield path, m, _check_served_leaf(path, m, s).astype(_F32)


def _bits(x):
  width = jnp.dtype(x.dtype).itemsize
  uint = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[width]
  return lax.bitcast_convert_type(x, uint)


def _safe_div(num, den, empty):
  den = jnp.asarray(den, _F32)
  return jnp.where(den > 0, jnp.asarray(num, _F32) / jnp.maximum(den, 1.0),
                   jnp.float32(empty))


def _norm_ratio(d2, m2):
  ratio = jnp.sqrt(d2) / jnp.sqrt(jnp.where(m2 > 0, m2, 1.0))
  return jnp.where(m2 > 0, ratio, jnp.where(d2 == 0, 0.0, jnp.inf)).astype(_F32)


def _grid_format(spec, what) -> formats_lib.Format:
  _check_spec(spec)
  if not spec.is_cast:
    raise NotImplementedError(
        f"{what} supports element-wise cast targets only; for a block target "
        f"({spec.target}) the grid spacing depends on each block's scale")
  return formats_lib.get(spec.target)


def _pow2(e):
  """float32 2^e for int32 e in [-126, 127], from the bits (exact, no flushing)."""
  return lax.bitcast_convert_type(((e + 127).astype(jnp.uint32)) << 23, _F32)


def _ulp_ratio(m, s, fmt):
  """float32 ``|m - s| / ulp(s, m)`` (see the module docstring); 0 where m == s."""
  a = lax.bitcast_convert_type(s, jnp.uint32) & np.uint32(0x7FFFFFFF)
  sig, eb = rounding_lib.split_bits(a)
  k = jnp.maximum(eb, fmt.emin) - fmt.man_bits  # exponent of the spacing above |s|
  toward_zero = jnp.where(s > 0, m < s, jnp.where(s < 0, m > s, False))
  finer_below = (sig == np.uint32(0x800000)) & (eb > fmt.emin)  # normal power of two
  k = k - (toward_zero & finer_below).astype(jnp.int32)
  # |m - s| * 2^-k in two power-of-two factors: exact, and 2^-k may exceed float32.
  k1 = jnp.clip(-k, -126, 127)
  k2 = jnp.clip(-k - k1, -126, 127)
  d = (jnp.abs(m - s) * _pow2(k1)) * _pow2(k2)
  return jnp.where(m == s, jnp.zeros_like(d), d)
