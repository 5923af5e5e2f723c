"""The jnp products a quantized model intercepts: ``@``, ``jnp.matmul``, ``dot``,
``tensordot``, ``inner``, ``vdot``, ``vecdot``, ``matvec``, ``vecmat``, their
``jnp.linalg`` namesakes (kind ``matmul``), ``jnp.outer`` and ``jnp.linalg.multi_dot``.

Each product is one ``dot_general`` as JAX issues it; under a quantizing rule it runs as
:func:`lowprec.numerics.qdot.quantized_dot_general_with_state` on that dot_general's
operands and dimension numbers (batch dimensions broadcast first, as JAX's vectorized
forms do; ``vdot`` flattens; ``vdot``, ``vecdot`` and ``vecmat`` conjugate a complex
first operand). ``jnp.outer`` and products with a scalar have no contraction, and
``multi_dot`` is a chain in an order JAX picks: they are recorded and run as written,
and a rule that asks for a recipe warns (:func:`.context.as_written`).
:mod:`.interception` installs these (:data:`INSTALLED`).
"""

from __future__ import annotations

import jax.numpy as jnp

from lowprec.numerics import qdot
from lowprec.models.quantization import context as context_lib
from lowprec.models.quantization.context import Context, active

# The functions the model would have called (captured before any interception).
JNP_MATMUL = jnp.matmul
JNP_DOT = jnp.dot
JNP_TENSORDOT = jnp.tensordot
JNP_INNER = jnp.inner
JNP_VDOT = jnp.vdot
JNP_OUTER = jnp.outer
JNP_VECDOT = jnp.vecdot
JNP_MATVEC = jnp.matvec
JNP_VECMAT = jnp.vecmat
LINALG_TENSORDOT = jnp.linalg.tensordot
LINALG_VECDOT = jnp.linalg.vecdot
LINALG_OUTER = jnp.linalg.outer
LINALG_MULTI_DOT = jnp.linalg.multi_dot


def _matmul_operands(a, b):
  """(a, b, dimension_numbers) of ``jnp.matmul(a, b)`` as one dot_general, or None
  for a product with a scalar (no contraction)."""
  na, nb = jnp.ndim(a), jnp.ndim(b)
  if na == 0 or nb == 0:
    return None
  if nb == 1:
    return a, b, (((na - 1,), (0,)), ((), ()))
  if na == 1:
    return a, b, (((0,), (nb - 2,)), ((), ()))
  if nb == 2:
    return a, b, (((na - 1,), (0,)), ((), ()))
  batch = jnp.broadcast_shapes(jnp.shape(a)[:-2], jnp.shape(b)[:-2])
  a = jnp.broadcast_to(a, batch + jnp.shape(a)[-2:])
  b = jnp.broadcast_to(b, batch + jnp.shape(b)[-2:])
  n = len(batch)
  return a, b, (((n + 1,), (n,)), (tuple(range(n)), tuple(range(n))))


def _dot_operands(a, b):
  """(a, b, dimension_numbers) of ``jnp.dot(a, b)`` as one dot_general, or None."""
  na, nb = jnp.ndim(a), jnp.ndim(b)
  if na == 0 or nb == 0:
    return None
  return a, b, (((na - 1,), (max(nb - 2, 0),)), ((), ()))


def _tensordot_operands(a, b, axes):
  """(a, b, dimension_numbers) of ``jnp.tensordot(a, b, axes)`` as the one dot_general
  JAX issues for it (no batch dimensions), or None for ``axes`` that jnp.tensordot
  refuses (it then raises its own error)."""
  na, nb = jnp.ndim(a), jnp.ndim(b)
  if type(axes) is int:  # pylint: disable=unidiomatic-typecheck  (as jnp.tensordot)
    if axes > min(na, nb):
      return None
    return a, b, ((tuple(range(na - axes, na)), tuple(range(axes))), ((), ()))
  if not (isinstance(axes, (tuple, list)) and len(axes) == 2):
    return None
  ax1, ax2 = axes
  if isinstance(ax1, int) and isinstance(ax2, int):
    ax1, ax2 = (ax1,), (ax2,)
  if not (isinstance(ax1, (tuple, list)) and isinstance(ax2, (tuple, list))
          and len(ax1) == len(ax2)):
    return None
  if not (all(isinstance(i, int) and -na <= i < na for i in ax1)
          and all(isinstance(i, int) and -nb <= i < nb for i in ax2)):
    return None
  return a, b, ((tuple(i % na for i in ax1), tuple(i % nb for i in ax2)), ((), ()))


def _inner_operands(a, b):
  """(a, b, dimension_numbers) of ``jnp.inner(a, b)``: the last axes contracted."""
  na, nb = jnp.ndim(a), jnp.ndim(b)
  if na == 0 or nb == 0:
    return None
  return a, b, (((na - 1,), (nb - 1,)), ((), ()))


def _vdot_operands(a, b):
  """(a, b, dimension_numbers) of ``jnp.vdot(a, b)``: the flattened vectors contracted,
  ``a`` conjugated first when complex (as jnp.vdot; qdot then refuses complex)."""
  a, b = jnp.asarray(a), jnp.asarray(b)
  if jnp.iscomplexobj(a):
    a = jnp.conj(a)
  return a.ravel(), b.ravel(), (((0,), (0,)), ((), ()))


def _batched(a, b, core_a: int, core_b: int):
  """``a`` and ``b`` with their leading (batch) dimensions broadcast together, keeping
  their last ``core_a`` / ``core_b`` dimensions, and the batch rank; None where they
  do not broadcast (the original raises its own error)."""
  a, b = jnp.asarray(a), jnp.asarray(b)
  if a.ndim < core_a or b.ndim < core_b:
    return None
  try:
    batch = jnp.broadcast_shapes(a.shape[:a.ndim - core_a], b.shape[:b.ndim - core_b])
  except ValueError:
    return None
  a = jnp.broadcast_to(a, batch + a.shape[a.ndim - core_a:])
  b = jnp.broadcast_to(b, batch + b.shape[b.ndim - core_b:])
  return a, b, len(batch)


def _vecdot_operands(a, b, axis):
  """``jnp.vecdot(a, b, axis=axis)``: conj(a) . b along ``axis``, batched over the
  broadcast other dimensions (JAX vectorizes vdot over them)."""
  a, b = jnp.asarray(a), jnp.asarray(b)
  if not (-a.ndim <= axis < a.ndim and -b.ndim <= axis < b.ndim
          and a.shape[axis] == b.shape[axis]):
    return None
  if jnp.iscomplexobj(a):
    a = jnp.conj(a)
  parts = _batched(jnp.moveaxis(a, axis, -1), jnp.moveaxis(b, axis, -1), 1, 1)
  if parts is None:
    return None
  a, b, n = parts
  return a, b, (((n,), (n,)), (tuple(range(n)), tuple(range(n))))


def _matvec_operands(a, b):
  """``jnp.matvec(a, b)``: [..., n, m] . [..., m] -> [..., n], batched."""
  parts = _batched(a, b, 2, 1)
  if parts is None or parts[0].shape[-1] != parts[1].shape[-1]:
    return None
  a, b, n = parts
  return a, b, (((n + 1,), (n,)), (tuple(range(n)), tuple(range(n))))


def _vecmat_operands(a, b):
  """``jnp.vecmat(a, b)``: conj([..., n]) . [..., n, m] -> [..., m], batched."""
  parts = _batched(a, b, 1, 2)
  if parts is None or parts[0].shape[-1] != parts[1].shape[-2]:
    return None
  a, b, n = parts
  if jnp.iscomplexobj(a):
    a = jnp.conj(a)
  return a, b, (((n,), (n,)), (tuple(range(n)), tuple(range(n))))


_SCALAR = "a product with a scalar has no contraction to quantize"


def _passes(ctx: Context | None) -> bool:
  """Whether an op runs as written unseen: no quantized call in this thread, or the
  library's own contraction inside a quantized op."""
  return ctx is None or ctx.busy


def _contraction(op, original, operands, a, b, precision, preferred_element_type):
  """Runs ``op`` (``original()`` as the model wrote it) per its rule, kind ``matmul``:
  quantized as ``operands() = (lhs, rhs, dimension_numbers)``, or, where that is None
  (a product with a scalar), as written with a warning under a quantizing rule."""
  if _passes(active()):
    return original()
  parts = operands()
  if parts is None:
    return context_lib.as_written(op, "matmul", jnp.shape(a), jnp.shape(b), original,
                                  _SCALAR, stacklevel=4)
  lhs, rhs, dn = parts

  def quantized(recipe, state, key):
    return qdot.quantized_dot_general_with_state(
        lhs, rhs, dn, recipe, state, key=key, precision=precision,
        preferred_element_type=preferred_element_type)

  return context_lib.handle(op, "matmul", jnp.shape(a), jnp.shape(b), original, quantized)


def _checked(op, original, operands, a, b, precision=None, preferred_element_type=None):
  """:func:`_contraction` for a product whose ``operands()`` is None only for shapes
  the original refuses (it then raises its own error)."""
  if _passes(active()):
    return original()
  parts = operands()
  if parts is None:
    return original()
  return _contraction(op, original, lambda: parts, a, b, precision,
                      preferred_element_type)


def matmul(a, b, *, precision=None, preferred_element_type=None, **kwargs):
  """``jnp.matmul`` (and ``a @ b``) that a quantized model intercepts (kind ``matmul``)."""
  original = lambda: JNP_MATMUL(a, b, precision=precision,
                                preferred_element_type=preferred_element_type, **kwargs)
  if jnp.ndim(a) == 0 or jnp.ndim(b) == 0:
    return original()  # jnp.matmul refuses scalars: its own error
  return _contraction("matmul", original, lambda: _matmul_operands(a, b), a, b,
                      precision, preferred_element_type)


def dot(a, b, *, precision=None, preferred_element_type=None, **kwargs):
  """``jnp.dot`` that a quantized model intercepts (kind ``matmul``); a product with a
  scalar runs as written (recorded; a warning under a quantizing rule)."""
  original = lambda: JNP_DOT(a, b, precision=precision,
                             preferred_element_type=preferred_element_type, **kwargs)
  return _contraction("dot", original, lambda: _dot_operands(a, b), a, b, precision,
                      preferred_element_type)


def tensordot(a, b, axes=2, *, precision=None, preferred_element_type=None, **kwargs):
  """``jnp.tensordot`` that a quantized model intercepts (kind ``matmul``): the one
  dot_general contracting ``axes`` that JAX issues, quantized as
  ``lowprec.numerics.qdot.quantized_dot_general`` quantizes it (``out_sharding``
  applies to the op as written only)."""
  original = lambda: JNP_TENSORDOT(a, b, axes, precision=precision,
                                   preferred_element_type=preferred_element_type,
                                   **kwargs)
  if _tensordot_operands(a, b, axes) is None:
    return original()  # axes jnp.tensordot refuses: its own error
  return _contraction("tensordot", original, lambda: _tensordot_operands(a, b, axes), a,
                      b, precision, preferred_element_type)


def inner(a, b, *, precision=None, preferred_element_type=None):
  """``jnp.inner`` that a quantized model intercepts (kind ``matmul``): the last axes
  contracted in one dot_general; with a scalar, a product run as written."""
  original = lambda: JNP_INNER(a, b, precision=precision,
                               preferred_element_type=preferred_element_type)
  return _contraction("inner", original, lambda: _inner_operands(a, b), a, b, precision,
                      preferred_element_type)


def vdot(a, b, *, precision=None, preferred_element_type=None):
  """``jnp.vdot`` that a quantized model intercepts (kind ``matmul``): the flattened
  operands contracted in one dot_general."""
  original = lambda: JNP_VDOT(a, b, precision=precision,
                              preferred_element_type=preferred_element_type)
  return _contraction("vdot", original, lambda: _vdot_operands(a, b), a, b, precision,
                      preferred_element_type)


def vecdot(x1, x2, /, *, axis=-1, precision=None, preferred_element_type=None):
  """``jnp.vecdot`` (and ``jnp.linalg.vecdot``) that a quantized model intercepts
  (kind ``matmul``): one batched dot_general along ``axis``."""
  original = lambda: JNP_VECDOT(x1, x2, axis=axis, precision=precision,
                                preferred_element_type=preferred_element_type)
  return _checked("vecdot", original, lambda: _vecdot_operands(x1, x2, axis), x1, x2,
                  precision, preferred_element_type)


def matvec(x1, x2, /):
  """``jnp.matvec`` that a quantized model intercepts (kind ``matmul``)."""
  return _checked("matvec", lambda: JNP_MATVEC(x1, x2), lambda: _matvec_operands(x1, x2),
                  x1, x2)


def vecmat(x1, x2, /):
  """``jnp.vecmat`` that a quantized model intercepts (kind ``matmul``)."""
  return _checked("vecmat", lambda: JNP_VECMAT(x1, x2), lambda: _vecmat_operands(x1, x2),
                  x1, x2)


def _no_gemm(op, original, lhs_shape, rhs_shape, why):
  if _passes(active()):
    return original()
  return context_lib.as_written(op, "matmul", lhs_shape, rhs_shape, original, why,
                                stacklevel=4)


def outer(a, b, out=None):
  """``jnp.outer`` inside a quantized model: no contraction, so no GEMM to quantize;
  recorded (kind ``matmul``), run as written, and a warning under a quantizing rule."""
  return _no_gemm("outer", lambda: JNP_OUTER(a, b, out), jnp.shape(a), jnp.shape(b),
                  "jnp.outer has no contraction to quantize (not a GEMM)")


def multi_dot(arrays, *, precision=None):
  """``jnp.linalg.multi_dot`` inside a quantized model: a chain of GEMMs whose order
  JAX picks (one einsum of all operands), so not one op a rule can quantize; recorded
  (kind ``matmul``, the first and last operands' shapes), run as written, and a warning
  under a quantizing rule (write the products out to quantize them)."""
  shapes = [jnp.shape(x) for x in arrays]
  return _no_gemm("multi_dot", lambda: LINALG_MULTI_DOT(arrays, precision=precision),
                  shapes[0] if shapes else (), shapes[-1] if shapes else (),
                  f"jnp.linalg.multi_dot of {len(shapes)} arrays is a chain of products "
                  f"in an order JAX picks, not one GEMM (write them as @ to quantize them)")


def _intercepted_matmul(a, b, **kwargs):
  return matmul(a, b, **kwargs)


def _intercepted_dot(a, b, **kwargs):
  return dot(a, b, **kwargs)


def _intercepted_tensordot(a, b, axes=2, **kwargs):
  return tensordot(a, b, axes, **kwargs)


def _intercepted_inner(a, b, **kwargs):
  return inner(a, b, **kwargs)


def _intercepted_vdot(a, b, **kwargs):
  return vdot(a, b, **kwargs)


def _intercepted_outer(a, b, out=None):
  return outer(a, b, out)


def _intercepted_vecdot(x1, x2, /, **kwargs):
  return vecdot(x1, x2, **kwargs)


def _intercepted_matvec(x1, x2, /):
  return matvec(x1, x2)


def _intercepted_vecmat(x1, x2, /):
  return vecmat(x1, x2)


def _intercepted_linalg_tensordot(x1, x2, /, *, axes=2, **kwargs):
  return tensordot(x1, x2, axes, **kwargs)


def _linalg_outer(x1, x2):
  return _no_gemm("outer", lambda: LINALG_OUTER(x1, x2), jnp.shape(x1), jnp.shape(x2),
                  "jnp.linalg.outer has no contraction to quantize (not a GEMM)")


def _intercepted_linalg_outer(x1, x2, /):
  return _linalg_outer(x1, x2)


def _intercepted_multi_dot(arrays, **kwargs):
  return multi_dot(arrays, **kwargs)


# (public attribute, module holding it, original, interceptor) of each product above.
INSTALLED = (
    ("matmul", jnp, JNP_MATMUL, _intercepted_matmul),
    ("dot", jnp, JNP_DOT, _intercepted_dot),
    ("tensordot", jnp, JNP_TENSORDOT, _intercepted_tensordot),
    ("inner", jnp, JNP_INNER, _intercepted_inner),
    ("vdot", jnp, JNP_VDOT, _intercepted_vdot),
    ("outer", jnp, JNP_OUTER, _intercepted_outer),
    ("vecdot", jnp, JNP_VECDOT, _intercepted_vecdot),
    ("matvec", jnp, JNP_MATVEC, _intercepted_matvec),
    ("vecmat", jnp, JNP_VECMAT, _intercepted_vecmat),
    ("tensordot", jnp.linalg, LINALG_TENSORDOT, _intercepted_linalg_tensordot),
    ("vecdot", jnp.linalg, LINALG_VECDOT, _intercepted_vecdot),
    ("outer", jnp.linalg, LINALG_OUTER, _intercepted_linalg_outer),
    ("multi_dot", jnp.linalg, LINALG_MULTI_DOT, _intercepted_multi_dot),
)
