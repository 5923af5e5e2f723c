"""Quantized ``dot_general`` with a recipe per GEMM and straight-through gradients.

``quantized_dot_general(lhs, rhs, dimension_numbers, recipe, key)`` computes the
forward GEMM on quantized operands and, through ``jax.custom_vjp``, the dgrad and
wgrad GEMMs on operands quantized as the recipe says (:mod:`numerics.recipes`).
Gradients are straight-through: each backward GEMM consumes the quantized cotangent
and the quantized saved operand; no quantizer derivative is applied, unless the recipe
enables differential gradient estimation (``dge_k``: dW is multiplied by the
surrogate derivative of the forward weight quantizer, :mod:`numerics.dge`).

Any ``dimension_numbers`` work: the operands are brought to batched matrices
``X: (B, M, K)`` and ``W: (B, K, N)`` (batch, free and contracting dims each
flattened, in ``dot_general`` order), the custom VJP runs on those, and the result is
reshaped back, so 1D blocks along "tokens" span every lhs free dimension.

Randomness (stochastic rounding and Hadamard transforms) comes from ``key``:
``fold_in(key, g)`` for GEMM ``g`` in (0 forward, 1 dgrad, 2 wgrad), then
``fold_in(k_g, 0)`` for the Hadamard transform, ``fold_in(k_g, 1)`` for the lhs and
``fold_in(k_g, 2)`` for the rhs quantizer. Operands are quantized in float32,
multiplied in the recipe's compute dtype (exact for MX values) and accumulated in
float32 (or in an emulated narrower accumulator, ``GemmRecipe.accumulation``). An
NVFP4 operand (``te`` convention) enters as its block-scaled values ``E2M1 * S_dec``
(exact in bf16) and its tensor scale ``1/S_enc`` multiplies the GEMM's float32
output: ``acc * (s_lhs * s_rhs)`` with both NVFP4, as NVFP4 tensor cores take the
tensor scales (Transformer Engine's cuBLASLt ``alpha``). This is not bit for bit the
GEMM of the fully dequantized operands (each rounded once by its tensor scale), whose
result differs in the last float32 bits. The output takes ``preferred_element_type``
if given, else lhs's dtype. A recipe that quantizes nothing is exactly a plain
``lax.dot_general`` of operands cast to the compute dtype (``fp32`` at
``Precision.HIGHEST`` unless ``precision`` is given). A GEMM marked ``native``
(:func:`numerics.recipes.with_native_gemm`) takes its operands' codes and scales in
their storage types in programs lowered for ``cuda`` (:mod:`numerics.native_gemm`) and
is this emulated GEMM, with the same bits, elsewhere.

Inside ``jax.shard_map`` (data- or tensor-parallel): the custom VJP returns each
operand's cotangent summed over the manual mesh axes it does not vary over itself (a
replicated weight's dW is the sum of the shards' dW, as JAX's own transpose of the
implicit broadcast), stochastic rounding draws each shard's own words
(:mod:`numerics.random_bits`), NVFP4 and tensor-scaled operands take their tensor amax
over the axes named by ``OperandQuant.amax_axis_name``
(:func:`numerics.recipes.with_amax_axis_name`), and a replicated delayed-scaling state
advances with the amax maximized over the shards. A second derivative (``jax.grad`` of
``jax.grad``) goes through the backward GEMMs' straight-through quantizers; with NVFP4
operands, which enter the GEMMs apart from their tensor scales, it raises a TypeError
naming the public function and the recipe.

State and telemetry (:func:`quantized_dot_general_with_state`): a recipe with
delayed-scaling operands (:mod:`numerics.delayed_scaling`) keeps an amax history per
such operand, and telemetry (:mod:`numerics.telemetry`) reports each quantized
operand's saturation, underflow, scale clamping and SQNR. Both live in a ``state``
pytree (:func:`init_state`) that the caller carries. Forward operands' telemetry is
returned with the output; the next delayed-scaling state and the backward operands'
telemetry exist only once the backward pass ran, so they come back as the *gradient of
the state* (``jax.grad`` w.r.t. ``state`` returns the next state: replace the state
with it, never apply it as an update). This is Flax's ``_overwrite_with_gradient``
convention (``flax.linen.fp8_ops``), which Transformer Engine's JAX delayed scaling
uses too.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.numerics import accumulation as accumulation_lib
from lowprec.numerics import dge
from lowprec.numerics import gemm_operands as operands_lib
from lowprec.numerics import native_gemm
from lowprec.numerics import qdot_state
from lowprec.numerics import recipes as recipes_lib
from lowprec.numerics import telemetry as telemetry_lib

DimensionNumbers = tuple[tuple[tuple[int, ...], tuple[int, ...]],
                         tuple[tuple[int, ...], tuple[int, ...]]]

# The state's type and constructor are part of qdot's API; they live in qdot_state.
State = qdot_state.State
OperandSlots = qdot_state.OperandSlots
init_state = qdot_state.init_state
_Operand = operands_lib.Operand

FORWARD, DGRAD, WGRAD = 0, 1, 2
_COMPUTE = {"bf16": jnp.bfloat16, "fp32": jnp.float32}


def _gemm_keys(key):
  """Each GEMM's (Hadamard, lhs, rhs) keys, indexed by FORWARD, DGRAD, WGRAD (None
  without a key): ``fold_in(fold_in(key, g), j)``, as the module docstring says.

  Formed by two batched ``fold_in`` calls (the three parents, then the nine keys):
  the same keys as twelve scalar calls, but each ``fold_in`` is a threefry hash that
  XLA:CPU compiles to a loop of its own (about 130 instructions), and twelve of them
  per quantized matmul were a fifth of an FP4 step's program.
  """
  if key is None:
    return ((None,) * 3,) * 3
  parents = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(3))
  keys = jax.vmap(jax.random.fold_in)(parents[np.repeat(np.arange(3), 3)],
                                      jnp.asarray(np.tile(np.arange(3), 3)))
  return tuple(tuple(keys[3 * g + j] for j in range(3)) for g in range(3))


# Each GEMM as (einsum, (lhs, rhs) transposes to [B, M, K] x [B, K, N] for emulation,
# (lhs, rhs) contraction axes).
_FWD_MM = ("bmk,bkn->bmn", (0, 1, 2), (0, 1, 2), (-1, -2))
_DGRAD_MM = ("bmn,bkn->bmk", (0, 1, 2), (0, 2, 1), (-1, -1))
_WGRAD_MM = ("bmk,bmn->bkn", (0, 2, 1), (0, 1, 2), (-2, -2))


def _emulated_mm(a, b, sa, sb, mm, compute_dtype: str,
                 accumulation: accumulation_lib.Accumulation | None) -> jax.Array:
  """The emulated GEMM of two operands' values, their tensor scales (where not None)
  applied to the float32 output: ``acc * (s_a * s_b)``, as an NVFP4 tensor-core GEMM
  takes them (cuBLASLt's ``alpha``)."""
  dtype = _COMPUTE[compute_dtype]
  a, b = a.astype(dtype), b.astype(dtype)
  spec, perm_a, perm_b, _ = mm
  if accumulation is not None:
    out = accumulation_lib.emulated_matmul(jnp.transpose(a, perm_a),
                                           jnp.transpose(b, perm_b), accumulation)
  else:
    out = jnp.einsum(spec, a, b, preferred_element_type=jnp.float32,
                     precision=lax.Precision.HIGHEST)
  given = [s for s in (sa, sb) if s is not None]
  if not given:
    return out
  return out * (given[0] if len(given) == 1 else given[0] * given[1])


def _mm(a: _Operand, b: _Operand, mm, recipe: recipes_lib.Recipe, gemm: int) -> jax.Array:
  """GEMM ``gemm`` (:data:`FORWARD`, :data:`DGRAD`, :data:`WGRAD`) of two quantized
  operands: emulated, or native where the GEMM is and the program runs on ``cuda``."""
  g = recipe.gemms[gemm]
  emulated = functools.partial(_emulated_mm, mm=mm, compute_dtype=recipe.compute_dtype,
                               accumulation=g.accumulation)
  if not g.native:
    return emulated(a.q, b.q, a.scale, b.scale)
  kind = native_gemm.pair_kind(*recipe.operand_pairs[gemm])
  ca, cb = mm[3]
  rows = a.q.shape[-2 if ca == -1 else -1]
  cols = b.q.shape[-2 if cb == -1 else -1]
  native = lambda an, bn: native_gemm.gemm(an, bn, ca, cb, rows, cols, kind)
  what = f"recipe {recipe.name!r}, {recipes_lib.GEMM_NAMES[gemm]} GEMM"
  return native_gemm.switch(native, (a.native, b.native), emulated,
                            (a.q, b.q, a.scale, b.scale), what)


# Axes of the canonical operands: X (B, M, K), W (B, K, N), dO (B, M, N).
_X_FWD, _W_FWD = (-1, -2), (-2, -1)      # forward contracts K
_DO_DGRAD, _W_DGRAD = (-1, -2), (-1, -2)  # dgrad contracts N
_X_WGRAD, _DO_WGRAD = (-2, -1), (-2, -1)  # wgrad contracts M (tokens)


def _record(tel: dict, amaxes: dict, name: str, results: tuple[_Operand, _Operand]) -> None:
  for side, op in zip(("lhs", "rhs"), results):
    if op.tel is not None:
      tel[f"{name}/{side}"] = op.tel
    if op.amax is not None:
      amaxes[f"{name}/{side}"] = op.amax


def _owner(recipe, api):
  return (f"{api} with recipe {recipe.name!r}", "second derivative")


def _forward(x, w, keys, state, recipe, api):
  keys = keys[FORWARD]
  # A forward weight that dgrad reuses natively needs its storage form here.
  w_native = recipe.forward.native or (recipe.reuse_forward_weight
                                       and recipe.dgrad.native)
  ops = operands_lib.gemm_operands(x, w, recipe.forward, _X_FWD, _W_FWD, keys,
                                   state.delayed, state.telemetry is not None, "forward",
                                   _owner(recipe, api),
                                   natives=(recipe.forward.native, w_native))
  tel, amaxes = {}, {}
  _record(tel, amaxes, "forward", ops)
  out = _mm(ops[0], ops[1], _FWD_MM, recipe, FORWARD)
  return (operands_lib.compensate(out, recipe.forward.lhs, recipe.forward.rhs), tel,
          ops[1]._replace(tel=None, amax=None), amaxes)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _qmatmul(x, w, key, state, recipe, api):
  out, tel, _, _ = _forward(x, w, _gemm_keys(key), state, recipe, api)
  return out, tel


def _qmatmul_fwd(x, w, key, state, recipe, api):
  keys = _gemm_keys(key)
  out, tel, wq, amaxes = _forward(x, w, keys, state, recipe, api)
  return (out, tel), (x, w, keys[DGRAD:], state,
                      wq if recipe.reuse_forward_weight else None, amaxes)


def _sum_to(ct: jax.Array, primal: jax.Array) -> jax.Array:
  """The cotangent of ``primal``: ``ct`` summed over the manual mesh axes (inside
  ``shard_map``) that ``ct`` varies over and ``primal`` does not.

  A replicated operand used with a sharded one (a weight with data-parallel
  activations) is implicitly broadcast to every shard; the transpose of that broadcast
  is a sum over the shards, which JAX's own autodiff inserts and a custom VJP must.
  """
  axes = qdot_state.excess_axes(ct, primal)
  return lax.psum(ct, axes) if axes else ct


def _qmatmul_bwd(recipe, api, res, cotangents):
  x, w, (kd, kw), state, wq_fwd, amaxes = res
  g = cotangents[0].astype(jnp.float32)  # the telemetry output has no gradient
  telemetry = state.telemetry is not None
  delayed = state.delayed
  tel, amaxes = {}, dict(amaxes)
  owner = _owner(recipe, api)
  if recipe.reuse_forward_weight:  # ALTO 1d2d: the forward-quantized W, as is
    gres = operands_lib.quantize_operand(
        g, recipe.dgrad.lhs, *_DO_DGRAD, kd[1], telemetry=telemetry,
        delayed=operands_lib.delayed_state(delayed, "dgrad", "lhs"), owner=owner,
        native=recipe.dgrad.native)
    ops = (gres, wq_fwd)
    w_op = recipe.forward.rhs
  else:
    ops = operands_lib.gemm_operands(g, w, recipe.dgrad, _DO_DGRAD, _W_DGRAD, kd, delayed,
                                     telemetry, "dgrad", owner)
    w_op = recipe.dgrad.rhs
  _record(tel, amaxes, "dgrad", ops)
  dx = operands_lib.compensate(_mm(ops[0], ops[1], _DGRAD_MM, recipe, DGRAD),
                               recipe.dgrad.lhs, w_op)
  ops = operands_lib.gemm_operands(x, g, recipe.wgrad, _X_WGRAD, _DO_WGRAD, kw, delayed,
                                   telemetry, "wgrad", owner)
  _record(tel, amaxes, "wgrad", ops)
  dw = operands_lib.compensate(_mm(ops[0], ops[1], _WGRAD_MM, recipe, WGRAD),
                               recipe.wgrad.lhs, recipe.wgrad.rhs)
  if recipe.dge_k is not None:
    dw = dw * _dge_factor(recipe, w)
  # The zero padding an RHT may add along M leaves dW's shape alone (M is contracted).
  return (_sum_to(dx, x).astype(x.dtype), _sum_to(dw, w).astype(w.dtype), None,
          qdot_state.next_state(recipe, state, amaxes, tel, api))


_qmatmul.defvjp(_qmatmul_fwd, _qmatmul_bwd)


def _canonical(lhs, rhs, dimension_numbers):
  (lc, rc), (lb, rb) = dimension_numbers
  for ds, a, side in ((lc, lhs, "lhs"), (rc, rhs, "rhs"), (lb, lhs, "lhs"), (rb, rhs, "rhs")):
    bad = [int(d) for d in ds if not -a.ndim <= int(d) < a.ndim]
    if bad:  # the modulo below would silently pick another axis
      raise ValueError(f"dimension_numbers {dimension_numbers}: axis {bad[0]} is out of "
                       f"range for the {side} of rank {a.ndim} (shape {a.shape})")
  lc, rc, lb, rb = (tuple(int(d) % a.ndim for d in ds) for ds, a in
                    ((lc, lhs), (rc, rhs), (lb, lhs), (rb, rhs)))
  if len(lc) != len(rc) or len(lb) != len(rb):
    raise ValueError(f"mismatched dimension_numbers {dimension_numbers}")
  if [lhs.shape[d] for d in lc] != [rhs.shape[d] for d in rc]:
    raise ValueError(f"contracting dims differ: {lhs.shape}, {rhs.shape}, "
                     f"{dimension_numbers}")
  if [lhs.shape[d] for d in lb] != [rhs.shape[d] for d in rb]:
    raise ValueError(f"batch dims differ: {lhs.shape}, {rhs.shape}, {dimension_numbers}")
  lf = tuple(d for d in range(lhs.ndim) if d not in lc + lb)
  rf = tuple(d for d in range(rhs.ndim) if d not in rc + rb)
  bshape = tuple(lhs.shape[d] for d in lb)
  lfs = tuple(lhs.shape[d] for d in lf)
  rfs = tuple(rhs.shape[d] for d in rf)
  k = math.prod(lhs.shape[d] for d in lc)
  x = jnp.transpose(lhs, lb + lf + lc).reshape(math.prod(bshape), math.prod(lfs), k)
  w = jnp.transpose(rhs, rb + rc + rf).reshape(math.prod(bshape), k, math.prod(rfs))
  return x, w, bshape + lfs + rfs


def _check_operands(lhs, rhs):
  lhs = jnp.asarray(lhs)
  rhs = jnp.asarray(rhs)
  for name, a in (("lhs", lhs), ("rhs", rhs)):
    if not jnp.issubdtype(a.dtype, jnp.floating):
      raise TypeError(f"{name} must be a float array, got {a.dtype}")
  return lhs, rhs


def _run(lhs, rhs, dimension_numbers, r, key, state, precision, preferred_element_type,
         api="quantized_dot_general"):
  lhs, rhs = _check_operands(lhs, rhs)
  if not r.quantized:
    cd = jnp.dtype(_COMPUTE[r.compute_dtype])
    # A bf16 lhs gives exactly Flax's bf16 layer; a wider lhs keeps its dtype
    # (accumulated in it) rather than silently dropping to the compute dtype.
    if preferred_element_type is None and lhs.dtype != cd:
      preferred_element_type = lhs.dtype
    if precision is None and r.compute_dtype == "fp32":
      precision = lax.Precision.HIGHEST
    out = lax.dot_general(lhs.astype(cd), rhs.astype(cd), dimension_numbers,
                          precision=precision,
                          preferred_element_type=preferred_element_type)
    return out, {}
  if r.needs_key and key is None:
    raise ValueError(f"recipe {r.name!r} uses stochastic rounding or a Hadamard "
                     f"transform and needs a PRNG key")
  out_dtype = preferred_element_type or lhs.dtype
  x, w, out_shape = _canonical(lhs, rhs, dimension_numbers)
  out, tel = _qmatmul(x, w, key if r.needs_key else None, state, r, api)
  return out.reshape(out_shape).astype(out_dtype), tel


def quantized_dot_general(lhs: jax.Array, rhs: jax.Array,
                          dimension_numbers: DimensionNumbers,
                          recipe: str | recipes_lib.Recipe = "bf16", *,
                          key: jax.Array | None = None, precision: Any = None,
                          preferred_element_type: Any = None) -> jax.Array:
  """``lax.dot_general`` with the GEMMs quantized per ``recipe``.

  Args:
    lhs, rhs: float arrays (activations and weights for a layer).
    dimension_numbers: as in ``lax.dot_general``.
    recipe: a :class:`numerics.recipes.Recipe` or its name (one without
      delayed-scaling operands: those need
      :func:`quantized_dot_general_with_state`).
    key: PRNG key; required when the recipe uses stochastic rounding or an RHT. Call
      sites may pass one for any recipe (a recipe that draws nothing does not use it).
    precision: passed through for unquantized recipes (quantized GEMMs use HIGHEST
      on their exactly representable operands).
    preferred_element_type: output dtype (default: lhs's dtype).

  Returns:
    ``dot_general``'s output shape; gradients flow to lhs and rhs (not to ``key``).
  """
  r = recipes_lib.get(recipe)
  if r.delayed_operands:
    raise ValueError(f"recipe {r.name!r} has delayed-scaling operands "
                     f"{list(r.delayed_operands)}, whose scales are state: use "
                     f"quantized_dot_general_with_state")
  return _run(lhs, rhs, dimension_numbers, r, key, State(), precision,
              preferred_element_type)[0]


def quantized_dot_general_with_state(
    lhs: jax.Array, rhs: jax.Array, dimension_numbers: DimensionNumbers,
    recipe: str | recipes_lib.Recipe, state: State, *, key: jax.Array | None = None,
    precision: Any = None, preferred_element_type: Any = None
) -> tuple[jax.Array, dict[str, telemetry_lib.OperandTelemetry]]:
  """:func:`quantized_dot_general` with delayed-scaling state and telemetry.

  Args:
    lhs, rhs, dimension_numbers, recipe, key, precision, preferred_element_type: as
      :func:`quantized_dot_general` (any recipe).
    state: this call site's :class:`State` from :func:`init_state` (or the previous
      step's gradient of it).

  Returns:
    ``(output, forward telemetry)``: the telemetry is ``{"forward/lhs": ...,
    "forward/rhs": ...}`` for the forward GEMM's quantized operands when the state was
    built with ``telemetry=True``, else ``{}``. The gradient w.r.t. ``state`` is the
    next state: delayed-scaling histories advanced by this step's amaxes and, with
    telemetry, the backward GEMMs' operand telemetry (see the module docstring).
  """
  r = recipes_lib.get(recipe)
  state = qdot_state.as_state(state)
  qdot_state.check_state(r, state)
  if state.telemetry is not None and not r.quantized:
    return _run(lhs, rhs, dimension_numbers, r, key, State(), precision,
                preferred_element_type)[0], {}
  return _run(lhs, rhs, dimension_numbers, r, key, state, precision,
              preferred_element_type, "quantized_dot_general_with_state")


def make_dot_general(recipe: str | recipes_lib.Recipe, *,
                     key: jax.Array | None = None) -> Callable[..., jax.Array]:
  """A ``lax.dot_general``-compatible callable bound to ``recipe`` and ``key``.

  For injection into Flax layers (``nn.Dense(dot_general=...)``) and ``jnp.einsum``
  (``_dot_general=``). To quantize a model you did not write, use
  :func:`models.quantize_model` instead.
  """
  r = recipes_lib.get(recipe)

  def dot_general(lhs, rhs, dimension_numbers, precision=None,
                  preferred_element_type=None, **unused):
    del unused  # e.g. out_sharding, which a single-device emulation ignores
    return quantized_dot_general(lhs, rhs, dimension_numbers, r, key=key,
                                 precision=precision,
                                 preferred_element_type=preferred_element_type)

  return dot_general


def _dge_factor(recipe: recipes_lib.Recipe, w: jax.Array) -> jax.Array:
  w_op = recipe.forward.rhs
  w_in_grid = w.astype(jnp.float32) * np.float32(w_op.prescale)
  return dge.surrogate_derivative(w_in_grid, w_op.spec(*_W_FWD), recipe.dge_k,
                                  recipe.dge_clamp)


def dge_factor(recipe: str | recipes_lib.Recipe, w: jax.Array) -> jax.Array:
  """``f'(w)`` (float32, ``w``'s shape ``[..., K, N]``): the factor a DGE recipe's
  backward multiplies the weight gradient by (:mod:`numerics.dge`, on the forward
  weight quantizer's grid, after any static-clipping prescale). For monitoring what
  DGE does to the gradients; the backward uses this same function. No gradient
  (a statistic of the weights)."""
  r = recipes_lib.get(recipe)
  if r.dge_k is None:
    raise ValueError(f"recipe {r.name!r} has no DGE (see "
                     f"lowprec.numerics.recipes.with_dge)")
  w = jnp.asarray(w)
  if w.ndim < 2:
    raise ValueError(f"weights must be [..., K, N], got shape {w.shape}")
  return jax.lax.stop_gradient(_dge_factor(r, w))


def forward_weight_quantizer(recipe: str | recipes_lib.Recipe
                             ) -> Callable[[jax.Array], jax.Array]:
  """``Q(w)``: the recipe's forward weight fake-quantizer for weights ``[..., K, N]``.

  The quantizer the forward GEMM applies to a ``Linear`` kernel ``[K, N]`` or a
  grouped expert kernel ``[E, K, N]`` (blocks and tiles over the last two axes, the
  recipe's scale rule, rounding, clipping and macro blocks), returned in float32 with
  any static-clipping prescale divided back out. For weight de-oscillation
  (:mod:`numerics.optim.deoscillation`). Identity (a float32 cast) when the recipe
  leaves the forward weight unquantized. Deterministic, stateless forward weight
  roundings only.
  """
  op = recipes_lib.get(recipe).forward.rhs
  if op is not None and op.rounding.needs_key:
    raise ValueError("forward_weight_quantizer needs a deterministic weight rounding")
  if isinstance(op, recipes_lib.DelayedQuant):
    raise ValueError("forward_weight_quantizer needs a stateless weight quantizer; "
                     "delayed scaling keeps state")

  def quantize(w: jax.Array) -> jax.Array:
    if w.ndim < 2:
      raise ValueError(f"weights must be [..., K, N], got shape {w.shape}")
    qw = operands_lib.quantize_operand(w, op, *_W_FWD, None,
                           owner=("forward_weight_quantizer", "gradient"))
    q = qw.q if qw.scale is None else qw.q * qw.scale
    return q if operands_lib.prescale(op) == 1.0 else q / np.float32(op.prescale)

  return quantize
