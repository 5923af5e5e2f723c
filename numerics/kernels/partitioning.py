"""Kernel calls in a sharded program: a ``shard_map`` that runs the kernel per shard.

XLA cannot partition a Pallas call by itself: Mosaic (TPU) refuses ("Mosaic kernels
cannot be automatically partitioned. Please wrap the call in a shard_map"), and
``custom_partitioning``, which would see the partitioner's shardings, is not wired
through on TPU (jax-ml/jax#38196). So every kernel of the package goes through
:func:`call`: when its operand lives on a mesh of several devices (the mesh of
``jax.typeof(x).sharding``, known at trace time under ``jit`` even without a mesh
context), the kernel runs inside ``jax.shard_map`` over that mesh's axes, once per
shard, and XLA moves the operand into that layout (and the results out of it) as
needed. The layout keeps the unsharded bits:

* a dimension is split only where every shard gets whole quantization blocks and equal
  extents, and a matmul's contraction is never split (its float32 sums keep their
  order); a mesh axis that fits no dimension computes the kernel redundantly (each of
  its devices runs the whole slice);
* the kernel learns where its shard starts (``first_index``: the row-major index, in
  the whole operand, of the shard's first element), from which the
  stochastic-rounding words are drawn (:mod:`numerics.random_bits`).

Which dimensions are split: under explicit mesh axes (``jax.sharding.AxisType.
Explicit``), the operand's own sharding, less any split that would break a block; under
automatic axes, where the trace does not see the partitioner's choice, the leading
dimension first (the batch of a data-parallel step), each mesh axis in mesh order
taken by the first dimension it divides. A replicated operand (a weight under data
parallelism) is then quantized in slices and gathered, an operand split another way
(tensor parallelism) is resharded: communication, never other bits.

Inside ``shard_map`` over every mesh axis the kernel runs on what it is given, as
before (the seeds then carry the shard's offset, :func:`blockwise.seeds_of`).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AxisType, PartitionSpec as P
import numpy as np

# A dimension: one factor, or (factor, block) -- a dimension of ``size(factor) *
# block`` elements that may be split along ``factor`` only (whole blocks per shard).
Dim = str | tuple[str, int]


def _factor(dim: Dim) -> str:
  return dim if isinstance(dim, str) else dim[0]


def _factor_sizes(dims, shapes) -> dict[str, int]:
  sizes = {}
  for ds, shape in zip(dims, shapes):
    for d, n in zip(ds, shape):
      sizes[_factor(d)] = n // (1 if isinstance(d, str) else d[1])
  return sizes


def _mesh_of(operands):
  """The abstract mesh the operands live on (None: one device, or no mesh)."""
  for x in operands:
    sharding = getattr(jax.typeof(x), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is not None and not mesh.empty and mesh.size > 1:
      return mesh
  return None


def _explicit_spec(x, ndim: int) -> tuple | None:
  sharding = jax.typeof(x).sharding
  if not any(t == AxisType.Explicit for t in sharding.mesh.axis_types):
    return None
  spec = tuple(sharding.spec)
  return spec + (None,) * (ndim - len(spec))


def _plan(mesh, operands, dims, sizes, whole, prefer) -> dict[str, tuple[str, ...]]:
  """factor -> the mesh axes it is split along (module docstring)."""
  plan: dict[str, list[str]] = {}

  def fits(f, axis):
    count = math.prod(mesh.shape[a] for a in plan.get(f, ())) * mesh.shape[axis]
    return f not in whole and sizes[f] % count == 0

  explicit = [_explicit_spec(x, len(ds)) for x, ds in zip(operands, dims)]
  if any(s is not None for s in explicit):
    for ds, spec in zip(dims, explicit):
      for d, entry in zip(ds, spec or ()):
        for axis in (() if entry is None else
                     entry if isinstance(entry, tuple) else (entry,)):
          f = _factor(d)
          if not any(axis in v for v in plan.values()) and fits(f, axis):
            plan.setdefault(f, []).append(axis)
    return {f: tuple(v) for f, v in plan.items()}
  for axis in mesh.axis_names:
    for f in prefer:
      if fits(f, axis):
        plan.setdefault(f, []).append(axis)
        break
  return {f: tuple(v) for f, v in plan.items()}


def _spec(ds, plan) -> P:
  entries = [plan.get(_factor(d), ()) for d in ds]
  return P(*[None if not a else a[0] if len(a) == 1 else a for a in entries])


def _position(axes: tuple[str, ...]) -> jax.Array:
  """This shard's index along a dimension split over ``axes`` (the first major)."""
  p = jnp.int32(0)
  for a in axes:
    p = p * lax.axis_size(a) + lax.axis_index(a)
  return p


def _first_index(ds, local_shape, plan) -> jax.Array:
  """uint32 row-major index, in the whole array, of this shard's first element."""
  first = jnp.uint32(0)
  stride = 1
  for d, n in reversed(list(zip(ds, local_shape))):
    axes = plan.get(_factor(d), ())
    if axes:
      start = _position(axes).astype(jnp.uint32) * np.uint32(n)
      first = first + start * np.uint32(stride % 2 ** 32)
    stride *= n * math.prod(lax.axis_size(a) for a in axes)
  return first


def call(kernel: Callable[..., Sequence[jax.Array]], operands: Sequence[jax.Array], *,
         dims: Sequence[Sequence[Dim]], result_dims: Sequence[Sequence[Dim]],
         prefer: Sequence[str], whole: Sequence[str] = (), indexed: int | None = None
         ) -> list[jax.Array]:
  """``kernel(first_index, *operands)`` (a list of arrays), per shard on a mesh.

  Args:
    kernel: builds the kernel call on (local) operands; ``first_index`` is a uint32
      scalar, the row-major index in the whole operand ``indexed`` of the shard's first
      element (0 when that operand is whole).
    operands: arrays.
    dims, result_dims: each operand's and result's dimensions as factor names (equal
      names: equal extents, split alike), ``(name, block)`` for a dimension of blocks of
      ``block`` that splits along ``name`` only.
    prefer: the factors split under automatic mesh axes, in order of preference.
    whole: factors never split (a contraction, a scalar operand).
    indexed: the operand ``first_index`` refers to (None: always 0).
  """
  operands = list(operands)
  mesh = _mesh_of(operands)
  if mesh is None or mesh.manual_axes or jax.sharding.get_abstract_mesh().manual_axes:
    return list(kernel(jnp.uint32(0), *operands))
  sizes = _factor_sizes(dims, [x.shape for x in operands])
  plan = _plan(mesh, operands, dims, sizes, frozenset(whole), prefer)
  in_specs = tuple(_spec(ds, plan) for ds in dims)
  out_specs = tuple(_spec(ds, plan) for ds in result_dims)

  def per_shard(*local):
    first = (jnp.uint32(0) if indexed is None else
             _first_index(dims[indexed], local[indexed].shape, plan))
    return tuple(kernel(first, *local))

  explicit = any(t == AxisType.Explicit for t in mesh.axis_types)
  if explicit:  # shard_map takes explicit operands only in its own layout
    operands = [jax.sharding.reshard(x, s) for x, s in zip(operands, in_specs)]
  # check_vma=False: Pallas' interpreter (interpret mode) cannot run under vma checks;
  # the shard's offset is first_index, not the seeds' varying axes.
  results = jax.shard_map(per_shard, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                          check_vma=False)(*operands)
  return list(results)
