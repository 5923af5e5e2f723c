"""The jnp products a quantized model intercepts: ``@``, ``jnp.matmul``, ``dot``,
``tensordot``, ``inner``, ``vdot`` (kind ``matmul``) and ``jnp.outer``.

Each of the first six is one ``dot_general`` as JAX issues it; under a quantizing rule
it runs as :func:`lowprec.numerics.qdot.quantized_dot_general_with_state` on that
dot_general's operands and dimension numbers (``@`` broadcasts batch dimensions first;
``vdot`` flattens, and conjugates a complex ``a``). ``jnp.outer`` and products with a
scalar have no contraction: they are recorded and run as written, and a rule that asks
for a recipe warns (:func:`.context.as_written`). :mod:`.interception` installs these.
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


def outer(a, b, out=None):
  """``jnp.outer`` inside a quantized model: no contraction, so no GEMM to quantize;
  recorded (kind ``matmul``), run as written, and a warning under a quantizing rule."""
  original = lambda: JNP_OUTER(a, b, out)
  if _passes(active()):
    return original()
  return context_lib.as_written("outer", "matmul", jnp.shape(a), jnp.shape(b), original,
                                "jnp.outer has no contraction to quantize (not a GEMM)",
                                stacklevel=3)


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
