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
float32; the output takes ``preferred_element_type`` if given, else lhs's dtype.
A recipe that quantizes nothing (``bf16``) is exactly a plain ``lax.dot_general`` of
operands cast to the compute dtype.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from numerics import blockscale
from numerics import clipping
from numerics import dge
from numerics import formats as formats_lib
from numerics import hadamard as hadamard_lib
from numerics import kernels
from numerics import macro_scaling
from numerics import recipes as recipes_lib

DimensionNumbers = tuple[tuple[tuple[int, ...], tuple[int, ...]],
                         tuple[tuple[int, ...], tuple[int, ...]]]

FORWARD, DGRAD, WGRAD = 0, 1, 2


def _gemm_keys(key, gemm: int):
  if key is None:
    return None, None, None
  k = jax.random.fold_in(key, gemm)
  return (jax.random.fold_in(k, 0), jax.random.fold_in(k, 1), jax.random.fold_in(k, 2))


def _quantize_operand(x: jax.Array, op: recipes_lib.OperandQuant | None,
                      contract_axis: int, free_axis: int, key) -> jax.Array:
  """float32 fake-quantized operand (or x in float32 when ``op`` is None).

  Still multiplied by ``op.prescale``: the GEMM divides the prescales out of its
  output, so the operands it multiplies stay exact quantized values.
  """
  x = x.astype(jnp.float32)
  if op is None:
    return x
  spec = op.spec(contract_axis, free_axis)
  if op.prescale != 1.0:
    x = x * np.float32(op.prescale)
  if op.clip == "rms":
    x = clipping.clip_to_block_rms(x, **op.blocks(contract_axis, free_axis))
  # The fused Pallas kernel on GPU/TPU where the spec allows (same bits), else jnp;
  # the rule and its NUMERICS_KERNELS override: numerics.kernels.dispatch.
  if op.macro_block is None:
    return kernels.quantize_dequantize(x, spec, key)
  fmt_max = float(formats_lib.get(op.fmt).max)
  s = macro_scaling.macro_block_scales(
      x, fmt_max, **op.blocks(contract_axis, free_axis, op.macro_block))
  return kernels.quantize_dequantize(x / s, spec, key) * s


def _prescale(op: recipes_lib.OperandQuant | None) -> float:
  return 1.0 if op is None else op.prescale


def _compensate(out: jax.Array, *ops) -> jax.Array:
  """Divides a GEMM output by its operands' static-clipping prescales."""
  p = math.prod(_prescale(op) for op in ops)
  return out if p == 1.0 else out / np.float32(p)


def _hadamard_pair(a: jax.Array, b: jax.Array, axis_a: int, axis_b: int, block: int,
                   key) -> tuple[jax.Array, jax.Array]:
  """Applies the same RHT along the contraction axis of both operands (zero-padded)."""
  a = blockscale.pad_to_multiple(a, (axis_a,), (block,))
  b = blockscale.pad_to_multiple(b, (axis_b,), (block,))
  r = hadamard_lib.random_hadamard_matrix(key, block)
  return (hadamard_lib.apply_blockwise(a, r, block, axis_a),
          hadamard_lib.apply_blockwise(b, r, block, axis_b))


def gemm_operands(a: jax.Array, b: jax.Array, gemm: recipes_lib.GemmRecipe,
                  axes_a: tuple[int, int], axes_b: tuple[int, int], keys
                  ) -> tuple[jax.Array, jax.Array]:
  """Quantized float32 operands of one GEMM per its recipe.

  ``axes_a``/``axes_b`` are (contraction, free) axes of each operand; ``keys`` the
  (hadamard, lhs, rhs) keys. Exposed so tests and tools can reproduce a GEMM by hand.
  With static clipping the operands are still multiplied by their prescales (divide
  the GEMM's output by ``prescale_lhs * prescale_rhs``).
  """
  a = a.astype(jnp.float32)
  b = b.astype(jnp.float32)
  if gemm.hadamard is not None:
    a, b = _hadamard_pair(a, b, axes_a[0], axes_b[0], gemm.hadamard, keys[0])
  return (_quantize_operand(a, gemm.lhs, *axes_a, keys[1]),
          _quantize_operand(b, gemm.rhs, *axes_b, keys[2]))


def _mm(a, b, spec: str, compute_dtype) -> jax.Array:
  return jnp.einsum(spec, a.astype(compute_dtype), b.astype(compute_dtype),
                    preferred_element_type=jnp.float32,
                    precision=lax.Precision.HIGHEST)


# Axes of the canonical operands: X (B, M, K), W (B, K, N), dO (B, M, N).
_X_FWD, _W_FWD = (-1, -2), (-2, -1)      # forward contracts K
_DO_DGRAD, _W_DGRAD = (-1, -2), (-1, -2)  # dgrad contracts N
_X_WGRAD, _DO_WGRAD = (-2, -1), (-2, -1)  # wgrad contracts M (tokens)


def _forward(x, w, key, recipe):
  keys = _gemm_keys(key, FORWARD)
  xq, wq = gemm_operands(x, w, recipe.forward, _X_FWD, _W_FWD, keys)
  out = _mm(xq, wq, "bmk,bkn->bmn", recipe.compute_dtype)
  return _compensate(out, recipe.forward.lhs, recipe.forward.rhs), wq


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _qmatmul(x, w, key, recipe):
  return _forward(x, w, key, recipe)[0]


def _qmatmul_fwd(x, w, key, recipe):
  out, wq = _forward(x, w, key, recipe)
  return out, (x, w, key, wq if recipe.reuse_forward_weight else None)


def _qmatmul_bwd(recipe, res, g):
  x, w, key, wq_fwd = res
  g = g.astype(jnp.float32)
  kd = _gemm_keys(key, DGRAD)
  if recipe.reuse_forward_weight:  # ALTO 1d2d: the forward-quantized W, as is
    gq = _quantize_operand(g, recipe.dgrad.lhs, *_DO_DGRAD, kd[1])
    wq, w_op = wq_fwd, recipe.forward.rhs
  else:
    gq, wq = gemm_operands(g, w, recipe.dgrad, _DO_DGRAD, _W_DGRAD, kd)
    w_op = recipe.dgrad.rhs
  dx = _compensate(_mm(gq, wq, "bmn,bkn->bmk", recipe.compute_dtype),
                   recipe.dgrad.lhs, w_op)
  kw = _gemm_keys(key, WGRAD)
  xq, gq2 = gemm_operands(x, g, recipe.wgrad, _X_WGRAD, _DO_WGRAD, kw)
  dw = _compensate(_mm(xq, gq2, "bmk,bmn->bkn", recipe.compute_dtype),
                   recipe.wgrad.lhs, recipe.wgrad.rhs)
  if recipe.dge_k is not None:
    w_op = recipe.forward.rhs
    w_in_grid = w.astype(jnp.float32) * np.float32(w_op.prescale)
    dw = dw * dge.surrogate_derivative(w_in_grid, w_op.spec(*_W_FWD), recipe.dge_k,
                                       recipe.dge_clamp)
  # The zero padding an RHT may add along M leaves dW's shape alone (M is contracted).
  return dx.astype(x.dtype), dw.astype(w.dtype), None


_qmatmul.defvjp(_qmatmul_fwd, _qmatmul_bwd)


def _canonical(lhs, rhs, dimension_numbers):
  (lc, rc), (lb, rb) = dimension_numbers
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


def quantized_dot_general(lhs: jax.Array, rhs: jax.Array,
                          dimension_numbers: DimensionNumbers,
                          recipe: str | recipes_lib.Recipe = "bf16",
                          key: jax.Array | None = None, *,
                          precision: Any = None,
                          preferred_element_type: Any = None) -> jax.Array:
  """``lax.dot_general`` with the GEMMs quantized per ``recipe``.

  Args:
    lhs, rhs: float arrays (activations and weights for a layer).
    dimension_numbers: as in ``lax.dot_general``.
    recipe: a :class:`numerics.recipes.Recipe` or its name.
    key: PRNG key; required when the recipe uses stochastic rounding or an RHT.
    precision: passed through for unquantized recipes (quantized GEMMs use HIGHEST
      on their exactly representable operands).
    preferred_element_type: output dtype (default: lhs's dtype).

  Returns:
    ``dot_general``'s output shape; gradients flow to lhs and rhs (not to ``key``).
  """
  r = recipes_lib.get(recipe)
  lhs = jnp.asarray(lhs)
  rhs = jnp.asarray(rhs)
  for name, a in (("lhs", lhs), ("rhs", rhs)):
    if not jnp.issubdtype(a.dtype, jnp.floating):
      raise TypeError(f"{name} must be a float array, got {a.dtype}")
  cd = jnp.dtype(r.compute_dtype)
  if not r.quantized:
    # A bf16 lhs gives exactly Flax's bf16 layer; a wider lhs keeps its dtype
    # (accumulated in it) rather than silently dropping to the compute dtype.
    if preferred_element_type is None and lhs.dtype != cd:
      preferred_element_type = lhs.dtype
    return lax.dot_general(lhs.astype(cd), rhs.astype(cd), dimension_numbers,
                           precision=precision,
                           preferred_element_type=preferred_element_type)
  if r.needs_key and key is None:
    raise ValueError(f"recipe {r.name!r} uses stochastic rounding or a Hadamard "
                     f"transform and needs a PRNG key")
  out_dtype = preferred_element_type or lhs.dtype
  x, w, out_shape = _canonical(lhs, rhs, dimension_numbers)
  out = _qmatmul(x, w, key, r)
  return out.reshape(out_shape).astype(out_dtype)


def make_dot_general(recipe: str | recipes_lib.Recipe,
                     key: jax.Array | None = None) -> Callable[..., jax.Array]:
  """A ``lax.dot_general``-compatible callable bound to ``recipe`` and ``key``.

  For injection into Flax layers (``nn.Dense(dot_general=...)``) and ``jnp.einsum``
  (``_dot_general=``).
  """
  r = recipes_lib.get(recipe)

  def dot_general(lhs, rhs, dimension_numbers, precision=None,
                  preferred_element_type=None, **unused):
    del unused  # e.g. out_sharding, which a single-device emulation ignores
    return quantized_dot_general(lhs, rhs, dimension_numbers, r, key,
                                 precision=precision,
                                 preferred_element_type=preferred_element_type)

  return dot_general


def forward_weight_quantizer(recipe: str | recipes_lib.Recipe
                             ) -> Callable[[jax.Array], jax.Array]:
  """``Q(w)``: the recipe's forward weight fake-quantizer for weights ``[..., K, N]``.

  The quantizer the forward GEMM applies to a ``Linear`` kernel ``[K, N]`` or a
  grouped expert kernel ``[E, K, N]`` (blocks and tiles over the last two axes, the
  recipe's scale rule, rounding, clipping and macro blocks), returned in float32 with
  any static-clipping prescale divided back out. For weight de-oscillation
  (:mod:`numerics.optim.deoscillation`). Identity (a float32 cast) when the recipe
  leaves the forward weight unquantized. Deterministic forward roundings only.
  """
  op = recipes_lib.get(recipe).forward.rhs
  if op is not None and op.rounding == "stochastic":
    raise ValueError("forward_weight_quantizer needs a deterministic weight rounding")

  def quantize(w: jax.Array) -> jax.Array:
    if w.ndim < 2:
      raise ValueError(f"weights must be [..., K, N], got shape {w.shape}")
    q = _quantize_operand(w, op, *_W_FWD, None)
    return q if _prescale(op) == 1.0 else q / np.float32(op.prescale)

  return quantize
