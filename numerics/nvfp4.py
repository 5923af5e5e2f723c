"""NVFP4: E2M1 elements in 16-element blocks, E4M3 block scales, an fp32 tensor scale.

Blocks are 1x16 along one axis (default the last) or 16x16 tiles; any other extent
raises. Three conventions (``convention=``), each bit-exact against its library's
formula (TE's and torchao's against a NumPy transcription in
``tests/numerics/mx_reference.py``, qwix's against qwix itself):

* ``"te"`` (default): Transformer Engine's chain (:mod:`numerics.nvfp4_te`; run by
  the two-pass fast path :mod:`numerics.nvfp4_fast`).
* ``"torchao"``: torchao's ``NVFP4Tensor.to_nvfp4`` with a per-tensor scale
  (:mod:`numerics.nvfp4_torchao`, which also says where the two differ).
* ``"qwix"``: qwix 0.1.8's ``nvfp4`` qtype, which has no tensor scale
  (:mod:`numerics.nvfp4_qwix`; its NaN/Inf and tiny blocks are qwix's, not ours below).

Our choices where the libraries are silent: the tensor amax ignores NaN/Inf, and a
block holding them gets the NaN scale (E4M3 0x7F) and zero element codes, so it
dequantizes to NaN.

Inside ``jax.shard_map`` the tensor amax is the shard's unless ``amax_axis_name`` names
the mesh axes to reduce it over (``lax.pmax``, Transformer Engine's amax reduction
group); stochastic rounding's words are the shard's own (:mod:`numerics.random_bits`).

Gradients (:mod:`numerics.gradients`): :func:`quantize_dequantize_nvfp4` is
straight-through; :func:`quantize_nvfp4` (integer codes) and
:func:`quantize_dequantize_nvfp4_blocks` (values not in x's units) raise when
differentiated.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.numerics import block_layout
from lowprec.numerics import float_bits
from lowprec.numerics import gradients as gradients_lib
from lowprec.numerics import nvfp4_fast
from lowprec.numerics import nvfp4_qwix
from lowprec.numerics import nvfp4_te
from lowprec.numerics import nvfp4_torchao
from lowprec.numerics import rounding as rounding_lib
from lowprec.numerics.block_layout import (AmaxAxisName, NVFP4_BLOCK, NVFP4_CONVENTIONS,
                                          NVFP4_SCALE_RULES, QuantizedArray)


def nvfp4_layout(ndim: int, block_shape, axis) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(axes, extents) of NVFP4 blocks: 16 along one axis, or 16x16 tiles (default 1x16)."""
  axes, blocks = block_layout.resolve_layout(ndim, block_shape, axis, NVFP4_BLOCK)
  if any(b != NVFP4_BLOCK for b in blocks):
    raise ValueError(f"NVFP4 blocks are {NVFP4_BLOCK} elements along each blocked axis "
                     f"(1x16, or 16x16 tiles), got block_shape={block_shape!r}")
  return axes, blocks


def _nvfp4_args(x, block_shape, axis, rounding, key, convention, fn,
                amax_axis_name=None):
  if convention not in NVFP4_CONVENTIONS:
    raise ValueError(f"NVFP4 convention must be one of {NVFP4_CONVENTIONS}, got "
                     f"{convention!r}")
  rounding_lib.check_rounding_and_key(rounding, key, fn)
  x32 = block_layout.check_block_input(x, fn)
  return (x32, nvfp4_layout(x32.ndim, block_shape, axis),
          block_layout.check_amax_axis_name(amax_axis_name, fn))


@functools.partial(jax.jit, static_argnames=(
    "axes", "blocks", "rounding", "pad", "convention", "amax_axis_name"))
def _quantize_nvfp4(x, key, *, axes, blocks, rounding, pad, convention, amax_axis_name):

  def run(x, key):
    xp = block_layout.pad_blocks(x.astype(jnp.float32), axes, blocks, pad)
    words = rounding.words(key, xp.shape, shard_of=xp)
    if convention == "te":
      return nvfp4_fast.nvfp4_te_fast(xp, axes, blocks, rounding=rounding, words=words,
                                      dequantize=False, amax_axis_name=amax_axis_name)
    if convention == "qwix":
      codes, scale_codes, _ = nvfp4_qwix.nvfp4_qwix_quantize_core(
          xp, axes, blocks, rounding, words)
      return codes, scale_codes, jnp.float32(1.0)
    pts = nvfp4_torchao.nvfp4_torchao_tensor_scale(xp, amax_axis_name=amax_axis_name)
    codes, scale_codes, _ = nvfp4_torchao.nvfp4_torchao_quantize_core(
        xp, pts, axes, blocks, rounding, words)
    return codes, scale_codes, pts

  return gradients_lib.not_differentiable(
      run, "quantize_nvfp4", "quantizer.quantize_dequantize or fake_quant(x, 'nvfp4')"
  )(x, key)


def quantize_nvfp4(x: jax.Array, *, block_shape: int | Sequence[int] | None = None,
                   axis: int | Sequence[int] | None = None,
                   rounding: rounding_lib.Rounding = rounding_lib.Nearest(),
                   key: jax.Array | None = None, pad: bool = False,
                   convention: str = "te",
                   amax_axis_name: AmaxAxisName = None) -> QuantizedArray:
  """NVFP4: E2M1 elements in 16-element blocks, E4M3 block scales, fp32 tensor scale.

  Args:
    x: float32/bfloat16/float16 array.
    block_shape: 16 (default: 1x16 blocks along ``axis``) or ``(16, 16)`` for 2D
      weight tiles; any other extent raises.
    axis: as in :func:`numerics.mx.quantize_mx`.
    rounding, key, pad: as in :func:`numerics.mx.quantize_mx`.
    convention: ``"te"`` (Transformer Engine's scale chain), ``"torchao"``
      (torchao's ``NVFP4Tensor.to_nvfp4`` with a per-tensor scale) or ``"qwix"`` (qwix
      0.1.8's ``nvfp4``: no tensor scale, so blocks with amax below ``6 * 2^-10`` get
      scale 0); see :mod:`numerics.nvfp4_te`, :mod:`numerics.nvfp4_torchao`,
      :mod:`numerics.nvfp4_qwix` and docs/api.md ("Conventions").
    amax_axis_name: inside ``jax.shard_map``, the mesh axis (or axes) to take the
      tensor amax over (``lax.pmax``), as Transformer Engine reduces it over a
      tensor-parallel group: every shard gets the whole tensor's tensor scale, so the
      shards quantize as the unsharded tensor does wherever no block straddles two
      shards. None (default): the amax of the array this call sees (per shard inside
      ``shard_map``).

  Returns:
    A :class:`numerics.block_layout.QuantizedArray` with ``tensor_scale = 1/S_enc``
    (``te``), torchao's ``per_tensor_scale`` (``torchao``) or 1 (``qwix``; its
    ``amax_axis_name`` has no effect). Not differentiable
    (integer codes).
  """
  x32, (axes, blocks), amax_axis_name = _nvfp4_args(
      x, block_shape, axis, rounding, key, convention, "quantize_nvfp4", amax_axis_name)
  codes, scale_codes, tensor_scale = _quantize_nvfp4(
      jnp.asarray(x), key, axes=axes, blocks=blocks, rounding=rounding, pad=pad,
      convention=convention, amax_axis_name=amax_axis_name)
  return QuantizedArray(codes=codes, scales=scale_codes, tensor_scale=tensor_scale,
                        fmt="e2m1", scale_fmt="e4m3", axes=axes, block_shape=blocks,
                        shape=tuple(x32.shape), scale_rule=NVFP4_SCALE_RULES[convention])


@functools.partial(jax.jit, static_argnames=(
    "axes", "blocks", "rounding", "pad", "convention", "amax_axis_name"))
def _qdq_nvfp4(x, key, *, axes, blocks, rounding, pad, convention, amax_axis_name):

  def run(x, key):
    xp = block_layout.pad_blocks(x.astype(jnp.float32), axes, blocks, pad)
    if convention == "te":
      words = rounding.lazy_words(key, xp)
      out = nvfp4_fast.nvfp4_te_fast(xp, axes, blocks, rounding=rounding, words=words,
                                     dequantize=True, amax_axis_name=amax_axis_name)
    elif convention == "qwix":
      words = rounding.words(key, xp.shape, shard_of=xp)
      out = nvfp4_qwix.nvfp4_qwix_quantize_core(xp, axes, blocks, rounding, words)[2]
    else:
      pts = nvfp4_torchao.nvfp4_torchao_tensor_scale(xp, amax_axis_name=amax_axis_name)
      words = rounding.words(key, xp.shape, shard_of=xp)
      out = nvfp4_torchao.nvfp4_torchao_quantize_core(xp, pts, axes, blocks, rounding,
                                                      words)[2]
    return out[tuple(slice(0, d) for d in x.shape)]

  return gradients_lib.straight_through(run, x, key)


def quantize_dequantize_nvfp4(x: jax.Array, *,
                              block_shape: int | Sequence[int] | None = None,
                              axis: int | Sequence[int] | None = None,
                              rounding: rounding_lib.Rounding = rounding_lib.Nearest(),
                              key: jax.Array | None = None, pad: bool = False,
                              convention: str = "te",
                              amax_axis_name: AmaxAxisName = None) -> jax.Array:
  """float32 ``dequantize(quantize_nvfp4(x, ...))`` in one jitted pass over ``x``.

  Equal bit for bit to the two-step form (tested); arguments as
  :func:`quantize_nvfp4`. Gradient: straight-through.
  """
  _, (axes, blocks), amax_axis_name = _nvfp4_args(
      x, block_shape, axis, rounding, key, convention, "quantize_dequantize_nvfp4",
      amax_axis_name)
  return _qdq_nvfp4(jnp.asarray(x), key, axes=axes, blocks=blocks, rounding=rounding,
                    pad=pad, convention=convention, amax_axis_name=amax_axis_name)


def quantize_dequantize_nvfp4_blocks(x: jax.Array, *,
                                     block_shape: int | Sequence[int] | None = None,
                                     axis: int | Sequence[int] | None = None,
                                     rounding: rounding_lib.Rounding = (
                                         rounding_lib.Nearest()),
                                     key: jax.Array | None = None, pad: bool = False,
                                     amax_axis_name: AmaxAxisName = None
                                     ) -> tuple[jax.Array, jax.Array]:
  """NVFP4 (``te`` convention) dequantized up to its tensor scale: ``(values, 1/S_enc)``.

  ``values`` (float32, x's shape) is each element times its block's E4M3 scale,
  ``E2M1 * S_dec``: at most 6 significant bits and at least 2^-10 in magnitude, so
  exact in bfloat16 (NaN for a block holding NaN or Inf). ``values * (1/S_enc)`` equals
  :func:`quantize_dequantize_nvfp4` bit for bit (that function's one float32
  rounding). A GEMM of two such operands can multiply ``values`` in bfloat16 with
  float32 accumulation and apply both tensor scales to its output, as an NVFP4 tensor
  core GEMM does (Transformer Engine passes them to cuBLASLt as ``alpha``):
  :mod:`numerics.qdot` does. Arguments as :func:`quantize_nvfp4`.

  Not differentiable (raises under ``jax.grad``; ``values`` is not in x's units).
  """
  _, (axes, blocks), amax_axis_name = _nvfp4_args(
      x, block_shape, axis, rounding, key, "te", "quantize_dequantize_nvfp4_blocks",
      amax_axis_name)
  (out,) = _qdq_nvfp4_blocks_many(
      [jnp.asarray(x)], [key], configs=((axes, blocks, rounding, pad, amax_axis_name),),
      name="quantize_dequantize_nvfp4_blocks")
  return out


@functools.partial(jax.jit, static_argnames=("configs", "name"))
def _qdq_nvfp4_blocks_many(xs, keys, *, configs, name):

  def run(xs, keys):
    xps = [block_layout.pad_blocks(x.astype(jnp.float32), axes, blocks, pad)
           for x, (axes, blocks, _, pad, _) in zip(xs, configs)]
    outs = nvfp4_fast.nvfp4_te_fast_blocks_many(
        xps, [(c[0], c[1]) for c in configs], [c[2] for c in configs],
        [c[2].words(key, xp.shape, shard_of=xp) for c, key, xp in zip(configs, keys, xps)],
        [c[4] for c in configs])
    return [(v[tuple(slice(0, d) for d in x.shape)], inv)
            for (v, inv), x in zip(outs, xs)]

  return gradients_lib.not_differentiable(
      run, name, "quantize_dequantize_nvfp4 (straight-through)")(xs, keys)


def quantize_dequantize_nvfp4_blocks_many(xs: Sequence[jax.Array],
                                          options: Sequence[dict]
                                          ) -> list[tuple[jax.Array, jax.Array]]:
  """:func:`quantize_dequantize_nvfp4_blocks` of several tensors, bit for bit:
  ``[(values, 1/S_enc), ...]``. ``options[i]`` holds ``xs[i]``'s keyword arguments of
  that function (``block_shape``, ``axis``, ``rounding``, ``key``, ``pad``,
  ``amax_axis_name``; absent ones take its defaults).

  One program for all: the tensors' scale chains (``S_enc``, ``1/S_enc``, the 127-entry
  ``enc`` table) run as one vectorized computation, so a GEMM that quantizes both
  operands compiles one chain instead of two (:mod:`numerics.nvfp4_fast`). Not
  differentiable, as :func:`quantize_dequantize_nvfp4_blocks`.
  """
  if len(xs) != len(options) or not xs:
    raise ValueError(f"quantize_dequantize_nvfp4_blocks_many takes as many options as "
                     f"tensors (at least one), got {len(xs)} and {len(options)}")
  configs, keys = [], []
  for x, opt in zip(xs, options):
    unknown = set(opt) - {"block_shape", "axis", "rounding", "key", "pad",
                          "amax_axis_name"}
    if unknown:
      raise ValueError(f"quantize_dequantize_nvfp4_blocks_many: unknown option(s) "
                       f"{sorted(unknown)}")
    rounding = opt.get("rounding", rounding_lib.Nearest())
    _, (axes, blocks), name = _nvfp4_args(
        x, opt.get("block_shape"), opt.get("axis"), rounding, opt.get("key"), "te",
        "quantize_dequantize_nvfp4_blocks_many", opt.get("amax_axis_name"))
    configs.append((axes, blocks, rounding, bool(opt.get("pad", False)), name))
    keys.append(opt.get("key"))
  return _qdq_nvfp4_blocks_many([jnp.asarray(x) for x in xs], keys,
                                configs=tuple(configs),
                                name="quantize_dequantize_nvfp4_blocks_many")


def nvfp4_grid_multipliers(x: jax.Array, *,
                           block_shape: int | Sequence[int] | None = None,
                           axis: int | Sequence[int] | None = None, pad: bool = False,
                           convention: str = "te", amax_axis_name: AmaxAxisName = None
                           ) -> tuple[jax.Array, jax.Array]:
  """(float32 per element: the multiplier that maps x onto E2M1's grid, bool per block:
  the block scale was clamped) of NVFP4 with these arguments.

  Clamped: ``te``, a nonzero block whose E4M3 scale rounded to zero (TE has no lower
  clamp, so its elements flush); ``torchao``, a nonzero block whose scale was raised to
  2^-6 or lowered to 448; ``qwix``, a nonzero block whose scale rounded to zero or was
  lowered to 448 (its multiplier ``1/s`` is the rounded reciprocal of a divisor). For
  numerics telemetry; blocks and conventions as in
  :func:`quantize_nvfp4`.
  """
  if convention not in NVFP4_CONVENTIONS:
    raise ValueError(f"NVFP4 convention must be one of {NVFP4_CONVENTIONS}, got "
                     f"{convention!r}")
  x = block_layout.check_block_input(x, "nvfp4_grid_multipliers")
  axes, blocks = nvfp4_layout(x.ndim, block_shape, axis)
  xp = block_layout.pad_blocks(x, axes, blocks, pad)
  block_amax, _, bshape, bpos = nvfp4_te.finite_block_amax(xp, axes, blocks)
  amax_axis_name = block_layout.check_amax_axis_name(amax_axis_name,
                                                     "nvfp4_grid_multipliers")
  if convention == "te":
    s_enc, _ = nvfp4_te.nvfp4_tensor_scale(xp, amax_axis_name=amax_axis_name)
    s_dec, mult = nvfp4_te.te_block_scales(block_amax, s_enc, float_bits.div_rn_idiv)
    clamped = (s_dec == 0) & (block_amax > 0)
  elif convention == "qwix":
    s, _ = nvfp4_qwix.qwix_block_scales(
        lax.bitcast_convert_type(block_amax, jnp.uint32))
    mult = float_bits.div_rn(np.float32(1.0), jnp.where(s == 0, np.float32(1.0), s))
    mult = jnp.where(s == 0, np.float32(np.inf), mult)
    clamped = ((s == 0) | (block_amax > np.float32(448.0 * 6.0))) & (block_amax > 0)
  else:
    pts = nvfp4_torchao.nvfp4_torchao_tensor_scale(xp, amax_axis_name=amax_axis_name)
    scaled, _, mult = nvfp4_torchao.torchao_block_scales(block_amax, pts)
    clamped = (((scaled < nvfp4_torchao.E4M3_EPS) | (scaled > 448.0))
               & (block_amax > 0))
  full = jnp.broadcast_to(mult, bshape).reshape(xp.shape)
  return (full[tuple(slice(0, d) for d in x.shape)],
          jnp.squeeze(clamped, axis=bpos))
