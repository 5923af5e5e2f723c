"""How the served copy relates to the master and to the previous export.

:func:`unchanged_fraction` (bit-identical to the previous export), :func:`ulp_distance`
(master minus served in grid spacings), :func:`relative_drift`. Each returns a dict
keyed by the '/'-joined pytree path of each floating leaf (``"root"`` for a bare array)
plus ``"global"`` over all floating leaves.

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

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.numerics import float_bits
from lowprec.numerics import formats as formats_lib
from lowprec.numerics.export._leaves import (F32, GLOBAL, bit_pattern, flatten, flatten_like,
                                     float_pairs, is_float, safe_div)
from lowprec.numerics.export.served_copy import ExportSpec, check_spec


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
  paths, p_leaves, treedef = flatten(prev_served)
  s_leaves = flatten_like(treedef, served, "served")
  out, tot_same, tot_n = {}, jnp.zeros((), F32), 0
  for path, p, s in zip(paths, p_leaves, s_leaves):
    if not is_float(p):
      continue
    p, s = jnp.asarray(p), jnp.asarray(s)
    if p.shape != s.shape or p.dtype != s.dtype:
      raise ValueError(f"leaf {path!r}: prev_served is {p.dtype}{list(p.shape)} but "
                       f"served is {s.dtype}{list(s.shape)}")
    same = jnp.sum(bit_pattern(p) == bit_pattern(s), dtype=F32)
    out[path] = safe_div(same, p.size, 1.0)
    tot_same, tot_n = tot_same + same, tot_n + p.size
  out[GLOBAL] = safe_div(tot_same, tot_n, 1.0)
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
  fmt = grid_format(spec, "ulp_distance")
  out, tot, n, mx = {}, jnp.zeros((), F32), 0, jnp.zeros((), F32)
  for path, m, s in float_pairs(master, served):
    d = ulp_ratio(m, s, fmt)
    total = jnp.sum(d)
    leaf_max = jnp.max(d, initial=0.0)
    out[path] = {"mean": safe_div(total, d.size, 0.0), "max": leaf_max}
    tot, n, mx = tot + total, n + d.size, jnp.maximum(mx, leaf_max)
  out[GLOBAL] = {"mean": safe_div(tot, n, 0.0), "max": mx}
  return out


@jax.jit
def relative_drift(master: Any, served: Any) -> dict[str, jax.Array]:
  """``||served - master||_2 / ||master||_2`` per floating leaf and globally.

  Both in float32 (served upcast exactly). A zero master gives 0 when the served copy
  is zero too, else Inf.

  Returns:
    ``{path: float32[]}`` and ``"global"`` (norms over all floating leaves together).
  """
  out, dsq, msq = {}, jnp.zeros((), F32), jnp.zeros((), F32)
  for path, m, s in float_pairs(master, served):
    d2 = jnp.sum(jnp.square(s - m))
    m2 = jnp.sum(jnp.square(m))
    out[path] = _norm_ratio(d2, m2)
    dsq, msq = dsq + d2, msq + m2
  out[GLOBAL] = _norm_ratio(dsq, msq)
  return out


def grid_format(spec: ExportSpec, what: str) -> formats_lib.Format:
  """The element-wise grid of ``spec`` (NotImplementedError for block targets)."""
  check_spec(spec)
  if not spec.is_cast:
    raise NotImplementedError(
        f"{what} supports element-wise cast targets only; for a block target "
        f"({spec.target}) the grid spacing depends on each block's scale")
  return formats_lib.get(spec.target)


def _norm_ratio(d2, m2):
  ratio = jnp.sqrt(d2) / jnp.sqrt(jnp.where(m2 > 0, m2, 1.0))
  return jnp.where(m2 > 0, ratio, jnp.where(d2 == 0, 0.0, jnp.inf)).astype(F32)


def _pow2(e):
  """float32 2^e for int32 e in [-126, 127], from the bits (exact, no flushing)."""
  return lax.bitcast_convert_type(((e + 127).astype(jnp.uint32)) << 23, F32)


def ulp_ratio(m: jax.Array, s: jax.Array, fmt: formats_lib.Format) -> jax.Array:
  """float32 ``|m - s| / ulp(s, m)`` (see the module docstring); 0 where m == s."""
  a = lax.bitcast_convert_type(s, jnp.uint32) & np.uint32(0x7FFFFFFF)
  sig, eb = float_bits.split_bits(a)
  k = jnp.maximum(eb, fmt.emin) - fmt.man_bits  # exponent of the spacing above |s|
  toward_zero = jnp.where(s > 0, m < s, jnp.where(s < 0, m > s, False))
  finer_below = (sig == np.uint32(0x800000)) & (eb > fmt.emin)  # normal power of two
  k = k - (toward_zero & finer_below).astype(jnp.int32)
  # |m - s| * 2^-k in two power-of-two factors: exact, and 2^-k may exceed float32.
  k1 = jnp.clip(-k, -126, 127)
  k2 = jnp.clip(-k - k1, -126, 127)
  d = (jnp.abs(m - s) * _pow2(k1)) * _pow2(k2)
  return jnp.where(m == s, jnp.zeros_like(d), d)

