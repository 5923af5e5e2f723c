"""The tiled ``pallas_call`` every block-quantizer kernel runs.

A 2D array ``(R, C)`` with 1D blocks along ``axis`` (1: ``block`` consecutive
elements of a row; 0: of a column) is cut into ``(tr, tc)`` tiles, each holding whole
blocks; one kernel instance quantizes one tile. Outputs are either tile-shaped
(``"full"``: codes or dequantized values) or one value per block (``"blocks"``:
scale codes, ``(R, C/block)`` or ``(R/block, C)``). Tiles at the ragged ends of the
non-blocked axis (and of the blocked axis, which is a multiple of ``block``) are
partial: the backend masks the out-of-range part, which holds whole blocks of its own
that are never stored, so no valid block sees them.

Stochastic rounding draws the counter-hash word of :mod:`numerics.random_bits` at the
element's global row-major index (``row * C + col``), so every tiling, and the jnp
reference, see the same bits. In a program on several devices the call runs once per
shard (:mod:`numerics.kernels.partitioning`); each shard draws the words of its
elements' indices in the whole array, so the bits are the unsharded ones.

Tiles (``tile=None``), chosen per backend:

* GPU (Triton): power-of-two tiles of 4096 elements, ``(16, 256)`` when blocks run
  along a row (axis 1) and ``(32, 128)`` when they run down a column (axis 0), clamped
  to the array; 8 warps: 16 elements per thread, so the integer rounding's
  temporaries stay in registers (with 4 warps, 32 per thread, ptxas spilled the
  e2m3 rceil fused quantizer; the compile check fails any kernel that spills).
* TPU (Mosaic): blocks down a column (axis 0) run along sublanes: ``(256, 512)`` tiles
  reshaped to ``(256/block, block, 512)`` and reduced over the block axis, every vector
  register full. Blocks along a row (axis 1) would reduce along lanes and leave the
  per-block values (the scale arithmetic, NVFP4's long division) one per 128-lane
  register, which made the NVFP4 kernels 25 s to compile and over v5e's 16 MiB of
  scoped VMEM; so each ``(128, 32 * block)`` tile is transposed in the kernel (a float32
  transpose on the XLU; narrow outputs go back through int32), quantized as blocks down
  a column, and transposed back; its per-block outputs are written as ``(C/block, R)``
  and transposed outside the kernel (1/block of the elements). ``tr`` a multiple of 32
  (uint8 outputs tile as (32, 128)) or the whole dim. Scalars (seeds, tensor scales)
  live in SMEM.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton
import numpy as np

from lowprec.numerics import random_bits as random_bits_lib
from lowprec.numerics.kernels import dispatch
from lowprec.numerics.kernels import partitioning

FULL, BLOCKS = "full", "blocks"
_GPU_TILES = {1: (16, 256), 0: (32, 128)}
_TPU_TILE_AXIS0 = (256, 512)
_TPU_ROWS_AXIS1 = 128
_TPU_BLOCKS_AXIS1 = 32  # blocks per row of a tile: per-block outputs tile as (32, 128)

# body(x_tile_f32, words_fn, scalars_ref, axis) -> one array per output
Body = Callable[..., Sequence[jax.Array]]


def default_tile(variant: str, shape: tuple[int, int], axis: int, block: int
                 ) -> tuple[int, int]:
  """The ``(tr, tc)`` tile of ``variant`` for an ``(R, C)`` array (see module doc)."""
  r, c = shape
  if variant == dispatch.GPU:
    tr, tc = _GPU_TILES[axis]
    return min(tr, dispatch.next_pow2(r)), min(tc, dispatch.next_pow2(c))
  if axis == 0:
    tr, tc = _TPU_TILE_AXIS0
  else:
    tr, tc = _TPU_ROWS_AXIS1, _TPU_BLOCKS_AXIS1 * block
  return (r if r <= tr else tr), (c if c <= tc else tc)


def transposes(variant: str, axis: int) -> bool:
  """Whether the kernel quantizes a transposed tile (TPU, blocks along a row)."""
  return variant == dispatch.TPU and axis == 1


def check_tile(variant: str, axis: int, block: int, tile: tuple[int, int]
               ) -> tuple[int, int]:
  """Validates an explicit tile (whole blocks; powers of two for Triton)."""
  tr, tc = (int(t) for t in tile)
  if tr < 1 or tc < 1:
    raise ValueError(f"tile must be positive, got {tile}")
  if (tr, tc)[axis] % block:
    raise ValueError(f"tile {tile} must hold whole blocks of {block} along axis {axis}")
  if variant == dispatch.GPU and (tr & (tr - 1) or tc & (tc - 1)):
    raise ValueError(f"Triton tiles must be powers of two, got {tile}")
  return tr, tc


def _scalar_spec(variant: str):
  if variant == dispatch.TPU:
    return pl.BlockSpec(memory_space=pltpu.SMEM)
  return pl.BlockSpec((2,), lambda i, j: (0,))


def _compiler_params(variant: str):
  if variant == dispatch.TPU:
    return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"))
  return pltriton.CompilerParams(num_warps=8, num_stages=1)


def blockwise_call(body: Body, x: jax.Array, *, axis: int, block: int,
                   outputs: Sequence[tuple[str, jnp.dtype]], seeds: jax.Array,
                   scalars: jax.Array, variant: str, interpret: bool,
                   tile: tuple[int, int] | None = None, name: str = "blockwise"
                   ) -> list[jax.Array]:
  """Runs ``body`` over the tiles of 2D ``x`` (float32/bfloat16, ``(R, C)``).

  Args:
    body: ``body(x_f32, words, scalars_ref, axis)``: ``x_f32`` the float32 tile with
      blocks along ``axis`` of it (0 or 1: the TPU kernel hands ``body`` a transposed
      tile, see the module doc), ``words()`` the tile's uint32 random words (the hash
      at each element's global row-major index in ``x``), ``scalars_ref`` the float32
      (2,) scalar input; returns one array per entry of ``outputs``, full ones in the
      tile's shape and per-block ones with the block axis reduced to one per block.
    axis, block: blocks of ``block`` along ``axis`` (``x.shape[axis] % block == 0``).
    outputs: ``(kind, dtype)`` per output, kind ``"full"`` or ``"blocks"``.
    seeds: uint32 (2,) hash seeds; scalars: float32 (2,).
    variant: ``"gpu"`` or ``"tpu"`` (tiling, scalar memory space, compiler params).
    interpret: Pallas interpret mode.
    tile: explicit ``(tr, tc)``; default :func:`default_tile`.
  """
  r, c = x.shape
  if tile is not None:
    check_tile(variant, axis, block, tile)
  transpose = transposes(variant, axis)

  def run(first_index, seeds, scalars, x):
    # A shard's words are the whole array's: its first element's index moves the
    # seed, and rows step by the whole array's row length ``c``.
    seeds = seeds.astype(jnp.uint32) + jnp.stack([first_index, jnp.uint32(0)])
    return _tiled_call(body, seeds, scalars.astype(jnp.float32), x, whole_shape=(r, c),
                       axis=axis, block=block, outputs=outputs, variant=variant,
                       interpret=interpret, tile=tile, name=name)

  rows, cols = ("r", ("c", block)) if axis == 1 else (("r", block), "c")
  block_dims = ("c", "r") if transpose else ("r", "c")
  results = partitioning.call(
      run, (seeds, scalars, x), dims=(("s",), ("t",), (rows, cols)),
      result_dims=[(rows, cols) if kind == FULL else block_dims for kind, _ in outputs],
      prefer=("r", "c"), whole=("s", "t"), indexed=2)
  return [res.T if transpose and kind == BLOCKS else res
          for res, (kind, _) in zip(results, outputs, strict=True)]


def _tiled_call(body, seeds, scalars, x, *, whole_shape, axis, block, outputs, variant,
                interpret, tile, name):
  """The ``pallas_call`` over the tiles of ``x``: the whole array of ``whole_shape`` or
  one shard of it; the words hash ``row * whole_shape[1] + col`` plus the seed."""
  seeds, scalars, x = _vary_together(seeds, scalars, x)
  r, c = x.shape
  out_type = dict(manual_axis_type=jax.typeof(x).manual_axis_type)
  if tile is None:
    tr, tc = default_tile(variant, (r, c), axis, block)
  else:
    tr, tc = check_tile(variant, axis, block, tile)
  grid = (dispatch.cdiv(r, tr), dispatch.cdiv(c, tc))
  transpose = transposes(variant, axis)

  def kernel(seed_ref, scal_ref, x_ref, *out_refs):
    def words():
      if whole_shape[0] * whole_shape[1] >= 2 ** 32:
        raise ValueError(f"the hash generator indexes at most 2^32 elements, got "
                         f"{whole_shape}")
      shape, (row_dim, col_dim) = ((tc, tr), (1, 0)) if transpose else ((tr, tc), (0, 1))
      rows = pl.program_id(0) * tr + lax.broadcasted_iota(jnp.int32, shape, row_dim)
      cols = pl.program_id(1) * tc + lax.broadcasted_iota(jnp.int32, shape, col_dim)
      index = (rows.astype(jnp.uint32) * np.uint32(whole_shape[1])
               + cols.astype(jnp.uint32))
      return random_bits_lib.hash_words(index, seed_ref[0], seed_ref[1])
    x_tile = x_ref[...].astype(jnp.float32)
    if transpose:
      results = body(x_tile.T, words, scal_ref, 0)
    else:
      results = body(x_tile, words, scal_ref, axis)
    for ref, value, (kind, dtype) in zip(out_refs, results, outputs, strict=True):
      if transpose and kind == FULL:
        value = _transpose_via_32_bits(value).astype(dtype)
      ref[...] = value

  tile_spec = pl.BlockSpec((tr, tc), lambda i, j: (i, j))
  if transpose:  # per-block outputs stored as (C/block, R), transposed by the caller
    block_spec = pl.BlockSpec((tc // block, tr), lambda i, j: (j, i))
    block_shape = (c // block, r)
  elif axis == 1:
    block_spec = pl.BlockSpec((tr, tc // block), lambda i, j: (i, j))
    block_shape = (r, c // block)
  else:
    block_spec = pl.BlockSpec((tr // block, tc), lambda i, j: (i, j))
    block_shape = (r // block, c)
  out_specs, out_shapes = [], []
  for kind, dtype in outputs:
    if kind == FULL:
      out_specs.append(tile_spec)
      out_shapes.append(jax.ShapeDtypeStruct((r, c), dtype, **out_type))
    elif kind == BLOCKS:
      out_specs.append(block_spec)
      out_shapes.append(jax.ShapeDtypeStruct(block_shape, dtype, **out_type))
    else:
      raise ValueError(f"unknown output kind {kind!r}")
  return pl.pallas_call(
      kernel,
      grid=grid,
      in_specs=[_scalar_spec(variant), _scalar_spec(variant), tile_spec],
      out_specs=out_specs,
      out_shape=out_shapes,
      compiler_params=None if interpret else _compiler_params(variant),
      interpret=interpret,
      name=name,
  )(seeds, scalars, x)


def _vary_together(*arrays: jax.Array) -> list[jax.Array]:
  """``arrays``, each cast to vary over every manual mesh axis any of them varies over.

  Inside ``jax.shard_map`` (``check_vma=True``) a ``pallas_call`` needs the type of its
  outputs: that of its inputs once they agree (the seeds vary with the shard's offset,
  NVFP4's tensor scale does not where its amax was reduced). Outside, a no-op.
  """
  have = [set(random_bits_lib.varying_manual_axes(a)) for a in arrays]
  union = set().union(*have)
  if not union:
    return list(arrays)
  order = [n for n in jax.sharding.get_abstract_mesh().axis_names if n in union]
  return [lax.pcast(a, tuple(n for n in order if n not in h), to="varying")
          if union - h else a for a, h in zip(arrays, have)]


def _transpose_via_32_bits(v: jax.Array) -> jax.Array:
  """``v.T``, moved as a 32-bit type (Mosaic transposes 32-bit vectors, not i8/i1)."""
  if v.dtype.itemsize == 4:
    return v.T
  wide = jnp.int32 if jnp.issubdtype(v.dtype, jnp.integer) else jnp.float32
  return v.astype(wide).T


def seeds_of(key: jax.Array | None, x: jax.Array) -> jax.Array:
  """uint32 (2,) hash seeds of ``key`` for the array ``x`` the kernel rounds (zeros
  without a key: deterministic roundings). Inside ``shard_map`` they carry the shard's
  offset (:func:`numerics.random_bits.sharded_seeds`), so kernels and the jnp path
  draw the same words on every shard."""
  if key is None:
    return jnp.zeros((2,), jnp.uint32)
  return jnp.stack(random_bits_lib.sharded_seeds(key, x.shape, x))


def as_2d(x: jax.Array, block_axis: int) -> tuple[jax.Array, int]:
  """``(x2, axis)``: ``x`` (blocks along ``block_axis``, the last or second-to-last
  axis) as ``(rows, x.shape[-1])`` and the blocked axis of that 2D view.

  Blocks along the second-to-last axis become blocks along the rows (a block never
  straddles two of the flattened leading axes when the blocked extent is a multiple of
  the block). The reshape is free (row-major) and keeps every element's row-major
  index, so stochastic rounding's words are unchanged.
  """
  nd = x.ndim
  if block_axis == nd - 1:
    return x.reshape(-1, x.shape[-1]), 1
  if nd >= 2 and block_axis == nd - 2:
    return x.reshape(-1, x.shape[-1]), 0
  raise ValueError(f"kernels block the last or second-to-last axis, got axis "
                   f"{block_axis} of a {nd}-d array")


def pad_blocked_axis(x: jax.Array, axis: int, block: int, pad: bool) -> jax.Array:
  """``x`` zero-padded along ``axis`` to a multiple of ``block`` (or a clear error)."""
  r = x.shape[axis] % block
  if not r:
    return x
  if not pad:
    raise ValueError(f"axis {axis} of shape {x.shape} has length {x.shape[axis]}, not "
                     f"divisible by the block {block}; pass pad=True to zero-pad it")
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, block - r)
  return jnp.pad(x, widths)


def normalize_axis(axis: int, ndim: int) -> int:
  """``axis`` as a non-negative int; the kernels block the last two axes only."""
  if not isinstance(axis, int) or not -ndim <= axis < ndim:
    raise ValueError(f"axis {axis!r} out of range for a {ndim}-d array")
  axis %= ndim
  if axis not in (ndim - 1, ndim - 2):
    raise ValueError(f"the kernels block the last or second-to-last axis, got axis "
                     f"{axis} of a {ndim}-d array; use lowprec.numerics.quantize_mx")
  return axis
