"""Exporting float32 master weights to the served (sampler) copy.

In RL the learner keeps float32 master weights and the sampler serves a copy in a
narrower format (bf16, fp16, FP8, an MX block format, ...). :func:`export` produces
that copy from a pytree of masters under one of three rounding rules:

* ``Nearest()``: round half to even, element-wise with :func:`numerics.rounding.cast`
  (bit-exact with ml_dtypes) or per block with
  :func:`numerics.quantizer.quantize_dequantize`. Stateless. An update smaller than the
  distance to the next rounding midpoint (about half an ulp) leaves the served value
  unchanged: with Adam at RL learning rates most bf16 values stay bit-identical from
  one export to the next.
* ``Stochastic(rng=...)``: unbiased stochastic rounding, ``E[served] = master``
  exactly for bf16/fp16 and the 8-bit and narrower formats (all discarded bits are
  randomized).
  The random bits of leaf ``i`` at export number ``step`` come from
  ``fold_in(fold_in(key, step), i)``, so exports at different steps draw different
  bits even when the caller passes the same key, and equal (key, step) reproduce.
* :class:`ErrorFeedback` (sigma-delta; this module's own mode, as it carries state):
  ``q = RNE(w + r)``, ``r' = (w + r) - q`` with a float32 residual ``r`` per element
  carried in :class:`ExportState`. Deterministic;
  ``sum_t served_t = sum_t w_t + r_0 - r_T``, so the running sum of the served copy
  tracks that of the master within one residual (``|r| <= ulp/2`` without overflow)
  and no update is lost for good. Residuals that become non-finite or whose target
  ``w + r`` overflows the format are reset to zero (they could not be paid back).

Leaves: every floating leaf of the master must be float32 (TypeError otherwise) and is
exported, scalars included; non-floating leaves (ints, bools) pass through unchanged.
Element-wise casts always saturate finite overflow to ``+-max`` (Inf stays Inf in
bf16/fp16); block targets follow their QuantSpec.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from lowprec.numerics import formats as formats_lib
from lowprec.numerics import quantizer as quantizer_lib
from lowprec.numerics import rounding as rounding_lib
from lowprec.numerics.export._leaves import F32, check_master_leaf, flatten, is_float

Export = Callable[[Any], Any]


@dataclasses.dataclass(frozen=True)
class ErrorFeedback:
  """Error-feedback (sigma-delta) export: ``q = RNE(w + r)`` with the residual ``r``
  carried in :class:`ExportState` (module docstring)."""
  name = "error_feedback"
  needs_key = False


_KINDS = (rounding_lib.Nearest, rounding_lib.Stochastic, ErrorFeedback)
EXPORT_ROUNDINGS = tuple(k.name for k in _KINDS)


def parse_rounding(name: str, *, bits: int | None = None, rng: str = "hash"
                   ) -> rounding_lib.Rounding | ErrorFeedback:
  """The export rounding named ``name`` (one of ``EXPORT_ROUNDINGS``; ``"error_feedback"``
  is :class:`ErrorFeedback`), as :func:`numerics.rounding.parse`. For flags and sweep
  declarations."""
  return rounding_lib.parse(name, bits=bits, rng=rng, kinds=_KINDS)


# Formats whose served copy is stored in their own dtype (XLA holds them everywhere).
_NATIVE_DTYPE_BITS = 8


@dataclasses.dataclass(frozen=True)
class ExportSpec:
  """How master weights are exported (hashable: usable as a static jit argument).

  Attributes:
    target: a format name from :mod:`numerics.formats` (``"bf16"``, ``"fp16"``,
      ``"e4m3"``, ...; not the scale format ``"e8m0"``) for an element-wise cast, or a
      :class:`numerics.quantizer.QuantSpec` for a block format, e.g. MXFP8 for an
      ``(in, out)`` kernel: ``QuantSpec("e4m3", block_shape=32, axis=0)``. The
      QuantSpec's own ``rounding`` must be ``Nearest()`` (its default) or equal to
      ``rounding``; ``rounding`` here decides.
    rounding: ``Nearest()``, ``Stochastic(bits=..., rng=...)`` or
      :class:`ErrorFeedback` (:func:`parse_rounding` reads their names).
  """

  target: str | quantizer_lib.QuantSpec = "bf16"
  rounding: rounding_lib.Rounding | ErrorFeedback = rounding_lib.Nearest()

  def __post_init__(self):
    rounding_lib.check_rounding(self.rounding, "ExportSpec",
                                "lowprec.numerics.export.parse_rounding", _KINDS)
    target = self.target
    if isinstance(target, formats_lib.Format):
      object.__setattr__(self, "target", target.name)
    elif isinstance(target, quantizer_lib.QuantSpec):
      if target.rounding not in (rounding_lib.Nearest(), self._quant_rounding()):
        raise ValueError(
            f"the target QuantSpec has rounding={target.rounding!r}, which conflicts "
            f"with ExportSpec rounding={self.rounding!r}; leave the QuantSpec's "
            f"rounding at Nearest() and choose it here")
    elif isinstance(target, str):
      try:
        f = formats_lib.get(target)
      except ValueError as e:
        raise ValueError(f"{e} (for block formats such as MX or nvfp4 pass a "
                         f"lowprec.numerics.quantizer.QuantSpec)") from None
      if f.kind == "scale":
        raise ValueError(f"{f.name} is a scale format (unsigned, no zero) and cannot "
                         f"hold weights")
    else:
      raise TypeError(f"target must be a format name or a QuantSpec, got "
                      f"{type(target).__name__}")

  def _quant_rounding(self) -> rounding_lib.Rounding:
    if isinstance(self.rounding, rounding_lib.Stochastic):
      return self.rounding
    return rounding_lib.Nearest()

  @property
  def is_cast(self) -> bool:
    """True for an element-wise cast to a named format (``target`` is a string)."""
    return isinstance(self.target, str)

  @property
  def is_stateful(self) -> bool:
    """True when the export needs a key or carried state (not ``Nearest()``)."""
    return not isinstance(self.rounding, rounding_lib.Nearest)

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

  def quant_spec(self, rounding: rounding_lib.Rounding | None = None
                 ) -> quantizer_lib.QuantSpec:
    """The target QuantSpec with this spec's rounding (``rounding`` overrides)."""
    if self.is_cast:
      raise ValueError(f"target {self.target!r} is an element-wise cast")
    return dataclasses.replace(self.target,
                               rounding=rounding or self._quant_rounding())


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
  check_spec(spec)
  residual = None
  if isinstance(spec.rounding, ErrorFeedback):
    paths, leaves, treedef = flatten(master)
    res = []
    for path, leaf in zip(paths, leaves):
      if is_float(leaf):
        check_master_leaf(path, leaf)
        res.append(jnp.zeros(jnp.shape(leaf), F32))
      else:
        res.append(None)
    residual = jax.tree_util.tree_unflatten(treedef, res)
  return ExportState(residual=residual, step=jnp.zeros((), jnp.int32))


@functools.partial(jax.jit, static_argnames=("spec",))
def export(master: Any, spec: ExportSpec, state: ExportState, *,
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
  check_spec(spec)
  if not isinstance(state, ExportState):
    raise TypeError(f"state must be an ExportState, got {type(state).__name__}")
  stochastic = spec.rounding.needs_key
  if stochastic and key is None:
    raise ValueError("Stochastic rounding needs a PRNG key")
  paths, leaves, treedef = flatten(master)
  ef = isinstance(spec.rounding, ErrorFeedback)
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
    if not is_float(leaf):
      served.append(leaf)
      new_res.append(None)
      continue
    w = check_master_leaf(path, leaf)
    leaf_key = None
    if stochastic:
      leaf_key = jax.random.fold_in(jax.random.fold_in(key, step), i)
    if ef:
      res = jnp.asarray(res)
      if res.dtype != F32 or res.shape != w.shape:
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
    if isinstance(spec.rounding, ErrorFeedback):
      q, r = rounding_lib.error_feedback(w, residual, f)
      r = _reset_residual(r, w + residual, f.max)
    else:
      q, r = rounding_lib.cast(w, f, rounding=spec.rounding, key=key), None
    return q.astype(spec.served_dtype), r
  if isinstance(spec.rounding, ErrorFeedback):
    target = w + residual
    q = quantizer_lib.quantize_dequantize(target,
                                          spec.quant_spec(rounding_lib.Nearest()))
    return q, _reset_residual(target - q, target, None)
  return quantizer_lib.quantize_dequantize(w, spec.quant_spec(), key=key), None


def _reset_residual(r, target, fmax):
  keep = jnp.isfinite(r)
  if fmax is not None:
    keep &= jnp.abs(target) <= np.float32(fmax)
  return jnp.where(keep, r, jnp.zeros_like(r))


def make_export(spec: ExportSpec) -> Export:
  """A stateless ``params -> served`` export for ``rounding=Nearest()``.

  The :data:`numerics.rl.sampler_copy.Export` signature: pass it to
  ``sampler_copy.initial_copy`` / ``maybe_refresh``.

  Raises:
    ValueError: for ``Stochastic`` or ``ErrorFeedback`` (they need a key or state;
      call :func:`export` with an :class:`ExportState`).
  """
  check_spec(spec)
  if spec.is_stateful:
    raise ValueError(f"rounding={spec.rounding!r} is stateful (needs a key or "
                     f"residuals); use export(master, spec, state, key=key)")

  def export_fn(params):
    state = ExportState(residual=None, step=jnp.zeros((), jnp.int32))
    return export(params, spec, state)[0]

  return export_fn


def check_spec(spec) -> None:
  """Raises TypeError unless ``spec`` is an :class:`ExportSpec`."""
  if not isinstance(spec, ExportSpec):
    raise TypeError(f"spec must be an ExportSpec, got {type(spec).__name__}")
