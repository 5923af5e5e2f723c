"""Quantized key/value cache storage: element codes and scales as a pytree.

A decoder's KV cache holds, per attention layer, the keys and the values of every
decoded position, float32[B, H, S, K] (B batch, H heads, S cache positions, K head
dim). A :class:`QuantizedKV` stores one such tensor in the format a
:class:`KVQuantSpec` names; :func:`write` stores a few new positions (a prefill, then
one token at a time) and :func:`read` returns the whole tensor in float32 for the
attention products. What each position costs, per batch row:

===========  ============  ===========================================================
``fmt``      granularity   stored per position
===========  ============  ===========================================================
fp32         None          H*K float32 values (the unquantized cache)
bf16         None          H*K bfloat16 values
e4m3, e5m2,  ``tensor``    H*K uint8 codes (one static float32 scale for the tensor)
int8         ``head``      H*K uint8 codes (one static float32 scale per head)
             ``token``     H*K uint8 codes + H float32 scales (one per head vector)
             ``block``     H*K uint8 codes + H*K/block_size E8M0 scales (OCP MX along
                           the head dim: MXFP8 for e4m3/e5m2, MXINT8 for int8)
nvfp4        ``block``     H*K/2 bytes (E2M1 codes, two a byte) + H*K/16 E4M3 scales
                           + one float32 NVFP4 tensor scale over the position's H*K
===========  ============  ===========================================================

Rounding rule of the scaled element formats (``tensor``, ``head``, ``token``): the
stored code is ``c = cast(x * (1 / s), fmt)`` (the float32 reciprocal of the scale,
one float32 multiply, then a saturating cast: round to nearest even or stochastic),
read back as ``decode(c) * s`` (one float32 multiply). A reciprocal rather than a
division because XLA rewrites division by a compile-time constant (a scale closed
over under jit) into exactly this, and the result must not depend on whether the
scale was a constant. Static scales (``tensor``, ``head``) are fixed when the cache is made
(:func:`init` ``scale=``): 1 is the *naive* choice (values cast directly, as a KV cache
without calibration does); :func:`calibrated_scale` gives ``amax / max`` from
calibration data; values beyond ``max * s`` saturate to ``+-max * s``. ``token``
scales are dynamic: ``s = amax * (1 / max)`` over each written head vector (float32,
``1 / max`` rounded to float32 first; 1 for an all-zero vector). ``block`` uses :func:`numerics.blockscale.quantize_mx`
(``scale_rule`` as there) and :func:`numerics.blockscale.quantize_nvfp4` (per
position, over all heads) unchanged, so their rounding and special-value rules hold.
``bf16`` is :func:`numerics.cast` to bf16 (nearest or stochastic), stored as bfloat16.

Special values: NaN is stored as NaN (int8, which has no NaN code, uses the unused
code -128, which decodes to NaN); a NaN or Inf in a ``token`` vector makes its scale
non-finite, so the vector reads back non-finite; a block holding one is poisoned
(see :mod:`numerics.blockscale`). Static-scale casts saturate, Inf included. Scales
below the float32 normal range flush to zero on XLA:CPU; a ``token`` scale that does
is replaced by 1 (only vectors with ``amax < max * 2^-126`` are affected).

Stochastic rounding draws its words from the ``key`` given to :func:`write`, indexed
by the element's position in the written slice (for ``nvfp4``: one key per
(row, position), split from ``key``); use a fresh key per write.

:class:`KVCache` gathers one keys and one values :class:`QuantizedKV` per layer of
a stack and the number of positions written (:func:`init_cache`);
:func:`tree_nbytes` and :func:`bytes_per_position` measure memory from the pytree.

Gradients: the ``fp32`` format stores ``x`` unchanged and passes its gradient
through; every other format has a zero gradient with respect to the written values
(:func:`write` stops it): a KV cache is an inference structure, and a partial
gradient through a dynamic scale would mislead. Train through
:func:`numerics.fake_quant` instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.numerics import blockscale
from lowprec.numerics import encoding
from lowprec.numerics import formats as formats_lib
from lowprec.numerics import rounding as rounding_lib

KV_FORMATS = ("fp32", "bf16", "e4m3", "e5m2", "int8", "nvfp4")
GRANULARITIES = ("tensor", "head", "token", "block")
STATIC_GRANULARITIES = ("tensor", "head")
_SCALED_FORMATS = ("e4m3", "e5m2", "int8")
_INT8_NAN_CODE = 0x80  # -128: unused by the symmetric grid; decodes to NaN


@dataclasses.dataclass(frozen=True)
class KVQuantSpec:
  """How one cached tensor (the keys or the values of a layer) is stored.

  Attributes:
    fmt: ``fp32``, ``bf16``, ``e4m3``, ``e5m2``, ``int8`` or ``nvfp4``.
    granularity: the scale granularity: ``None`` for fp32/bf16 (unscaled);
      ``tensor``, ``head``, ``token`` or ``block`` for e4m3/e5m2/int8; ``block``
      for nvfp4 (see the module docstring's table).
    rounding: ``Nearest()`` (round half to even) or ``Stochastic(bits=..., rng=...)``
      (needs a key at every :func:`write`; not for fp32); see
      :mod:`numerics.rounding`.
    block_size: MX block length along the head dim (``block`` granularity of
      e4m3/e5m2/int8 only; default 32, the OCP block). nvfp4's block is 16.
    scale_rule: MX scale rule (``block`` granularity of e4m3/e5m2/int8 only;
      default ``floor``, OCP MX v1.0).
  """

  fmt: str = "fp32"
  granularity: str | None = None
  rounding: rounding_lib.Rounding = rounding_lib.Nearest()
  block_size: int | None = None
  scale_rule: str | None = None

  def __post_init__(self):
    if self.fmt not in KV_FORMATS:
      raise ValueError(f"unknown KV format {self.fmt!r}; known: {', '.join(KV_FORMATS)}")
    if self.granularity is not None and self.granularity not in GRANULARITIES:
      raise ValueError(f"unknown granularity {self.granularity!r}; known: "
                       f"{', '.join(GRANULARITIES)}")
    rounding_lib.check_rounding(self.rounding, "KVQuantSpec",
                                kinds=(rounding_lib.Nearest, rounding_lib.Stochastic))
    if self.fmt in ("fp32", "bf16"):
      if self.granularity is not None:
        raise ValueError(f"fmt={self.fmt!r} is unscaled; granularity must be None, got "
                         f"{self.granularity!r}")
    elif self.granularity is None:
      raise ValueError(f"fmt={self.fmt!r} needs a granularity: one of "
                       f"{', '.join(GRANULARITIES if self.fmt != 'nvfp4' else ('block',))}")
    if self.fmt == "nvfp4" and self.granularity != "block":
      raise ValueError(f"nvfp4 is block-scaled; granularity must be 'block', got "
                       f"{self.granularity!r}")
    mx = self.is_mx
    if self.block_size is not None:
      if not mx:
        raise ValueError(f"block_size applies to the MX block granularity of "
                         f"e4m3/e5m2/int8, not to fmt={self.fmt!r} granularity="
                         f"{self.granularity!r}")
      if isinstance(self.block_size, bool) or not isinstance(
          self.block_size, (int, np.integer)) or self.block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {self.block_size!r}")
    if self.scale_rule is not None:
      if not mx:
        raise ValueError(f"scale_rule applies to the MX block granularity of "
                         f"e4m3/e5m2/int8, not to fmt={self.fmt!r} granularity="
                         f"{self.granularity!r}")
      if self.scale_rule not in blockscale.SCALE_RULES:
        raise ValueError(f"unknown scale_rule {self.scale_rule!r}; known: "
                         f"{', '.join(blockscale.SCALE_RULES)}")
    if self.fmt == "fp32" and self.rounding.needs_key:
      raise ValueError("fp32 stores values unrounded; rounding must be Nearest()")

  @property
  def is_mx(self) -> bool:
    return self.fmt in _SCALED_FORMATS and self.granularity == "block"

  @property
  def is_static(self) -> bool:
    """Whether the scale is fixed at :func:`init` (``tensor`` or ``head``)."""
    return self.granularity in STATIC_GRANULARITIES

  @property
  def mx_block(self) -> int:
    return blockscale.MX_BLOCK if self.block_size is None else int(self.block_size)

  @property
  def mx_scale_rule(self) -> str:
    return "floor" if self.scale_rule is None else self.scale_rule


@dataclasses.dataclass(frozen=True)
class QuantizedKV:
  """One cached tensor, logically float32[B, H, S, K] (a pytree; ``spec`` is static).

  Attributes:
    codes: fp32: float32[B, H, S, K]; bf16: bfloat16[B, H, S, K]; e4m3/e5m2/int8:
      uint8[B, H, S, K] codes (:mod:`numerics.encoding`); nvfp4: uint8[B, H, S, K/2],
      the E2M1 code of element 2j in the low nibble, of 2j+1 in the high one.
    scales: ``tensor``: float32[]; ``head``: float32[H]; ``token``: float32[B, H, S];
      ``block``: uint8[B, H, S, K/block] scale codes (E8M0 for MX, E4M3 for nvfp4);
      fp32/bf16: float32[0].
    tensor_scales: nvfp4: float32[B, S], the decode multiplier ``1/S_enc`` of each
      position; otherwise float32[0].
    spec: the :class:`KVQuantSpec`.
  """

  codes: jax.Array
  scales: jax.Array
  tensor_scales: jax.Array
  spec: KVQuantSpec

  @property
  def shape(self) -> tuple[int, int, int, int]:
    """The logical shape (B, H, S, K)."""
    b, h, s, k = self.codes.shape
    return (b, h, s, 2 * k if self.spec.fmt == "nvfp4" else k)


jax.tree_util.register_dataclass(
    QuantizedKV, data_fields=["codes", "scales", "tensor_scales"], meta_fields=["spec"])


def _empty() -> jax.Array:
  return jnp.zeros((0,), jnp.float32)


def _check_spec(spec: Any) -> KVQuantSpec:
  if not isinstance(spec, KVQuantSpec):
    raise TypeError(f"spec must be a KVQuantSpec, got {type(spec).__name__}")
  return spec


def _static_scale(spec: KVQuantSpec, scale: Any, heads: int) -> jax.Array:
  want = () if spec.granularity == "tensor" else (heads,)
  s = jnp.ones(want, jnp.float32) if scale is None else jnp.asarray(scale, jnp.float32)
  if s.shape != want:
    raise ValueError(f"a {spec.granularity!r} scale must have shape {want}, got "
                     f"{s.shape}")
  if not isinstance(s, jax.core.Tracer):
    bad = ~(np.isfinite(np.asarray(s)) & (np.asarray(s) > 0))
    if np.any(bad):
      raise ValueError(f"static scales must be finite and > 0, got {np.asarray(s)}")
  return s


def init(spec: KVQuantSpec, shape: tuple[int, int, int, int],
         scale: jax.Array | float | None = None) -> QuantizedKV:
  """An empty cache of logical shape ``(B, H, S, K)``: every position reads as 0.

  Args:
    spec: the storage format.
    shape: (batch, heads, positions, head dim).
    scale: the static scale of a ``tensor`` (scalar) or ``head`` (float32[H])
      granularity; ``None`` gives 1 (the naive scale). Must be ``None`` for the
      other granularities (their scales are computed at write time).

  Raises:
    ValueError: a bad shape, a scale given where none is used, a head dim the block
      does not divide.
  """
  spec = _check_spec(spec)
  if len(shape) != 4 or any(not isinstance(d, (int, np.integer)) or d < 1 for d in shape):
    raise ValueError(f"shape must be four positive ints (B, H, S, K), got {shape}")
  b, h, s, k = (int(d) for d in shape)
  if scale is not None and not spec.is_static:
    raise ValueError(f"scale is only used by the static granularities "
                     f"{STATIC_GRANULARITIES}; fmt={spec.fmt!r} granularity="
                     f"{spec.granularity!r} computes its own")
  if spec.is_mx and k % spec.mx_block:
    raise ValueError(f"head dim {k} is not divisible by the MX block {spec.mx_block}")
  if spec.fmt == "nvfp4" and k % blockscale.NVFP4_BLOCK:
    raise ValueError(f"head dim {k} is not divisible by the NVFP4 block "
                     f"{blockscale.NVFP4_BLOCK}")
  tensor_scales = _empty()
  if spec.fmt == "fp32":
    codes, scales = jnp.zeros((b, h, s, k), jnp.float32), _empty()
  elif spec.fmt == "bf16":
    codes, scales = jnp.zeros((b, h, s, k), jnp.bfloat16), _empty()
  elif spec.fmt == "nvfp4":
    codes = jnp.zeros((b, h, s, k // 2), jnp.uint8)
    scales = jnp.zeros((b, h, s, k // blockscale.NVFP4_BLOCK), jnp.uint8)
    tensor_scales = jnp.ones((b, s), jnp.float32)
  else:
    codes = jnp.zeros((b, h, s, k), jnp.uint8)
    if spec.is_static:
      scales = _static_scale(spec, scale, h)
    elif spec.granularity == "token":
      scales = jnp.ones((b, h, s), jnp.float32)
    else:
      scales = jnp.zeros((b, h, s, k // spec.mx_block), jnp.uint8)
  return QuantizedKV(codes=codes, scales=scales, tensor_scales=tensor_scales, spec=spec)


def _reciprocal_max(fmt: formats_lib.Format) -> np.float32:
  return np.float32(1.0) / np.float32(fmt.max)


def _scaled_codes(x: jax.Array, s: jax.Array, spec: KVQuantSpec,
                  key: jax.Array | None) -> jax.Array:
  """uint8 codes of ``cast(x * (1 / s))`` (x float32, s broadcastable to x)."""
  f = formats_lib.get(spec.fmt)
  v = x * (jnp.float32(1.0) / s)
  y = rounding_lib.cast(v, f, rounding=spec.rounding, key=key, saturate=True)
  codes = encoding.encode(y, f)
  if f.kind == "int":
    codes = jnp.where(jnp.isnan(y), jnp.uint8(_INT8_NAN_CODE), codes)
  return codes


def _token_scale(x_BxHxTxK: jax.Array, spec: KVQuantSpec) -> jax.Array:
  amax = jnp.max(jnp.abs(x_BxHxTxK), axis=-1)  # NaN propagates
  s = amax * _reciprocal_max(formats_lib.get(spec.fmt))
  return jnp.where((amax == 0) | (s == 0), jnp.float32(1.0), s)


def _pack_nibbles(codes: jax.Array) -> jax.Array:
  return codes[..., 0::2] | (codes[..., 1::2] << 4)


def _unpack_nibbles(packed: jax.Array) -> jax.Array:
  both = jnp.stack([packed & jnp.uint8(0xF), packed >> 4], axis=-1)
  return both.reshape(packed.shape[:-1] + (2 * packed.shape[-1],))


def _nvfp4_write(x_BxHxTxK: jax.Array, spec: KVQuantSpec, key: jax.Array | None):
  """(packed codes [B,H,T,K/2], E4M3 scales [B,H,T,K/16], tensor scales [B,T])."""
  b, _, t, _ = x_BxHxTxK.shape
  x_BxTxHxK = x_BxHxTxK.transpose(0, 2, 1, 3)
  quant = lambda x, k: blockscale.quantize_nvfp4(
      x, rounding=spec.rounding, key=k)
  if spec.rounding.needs_key:
    keys = jax.random.split(key, b * t)
    keys = keys.reshape((b, t) + keys.shape[1:])
    q = jax.vmap(jax.vmap(quant))(x_BxTxHxK, keys)
  else:
    q = jax.vmap(jax.vmap(lambda x: quant(x, None)))(x_BxTxHxK)
  codes = _pack_nibbles(q.codes.transpose(0, 2, 1, 3))
  return codes, q.scales.transpose(0, 2, 1, 3), q.tensor_scale


def write(cache: QuantizedKV, x_BxHxTxK: jax.Array, start: jax.Array | int,
          key: jax.Array | None = None) -> QuantizedKV:
  """Stores ``x`` (float32[B, H, T, K]) at positions ``start .. start + T - 1``.

  Args:
    cache: the cache to update (returned updated; the input is not modified).
    x_BxHxTxK: the new keys or values, float32/bfloat16/float16.
    start: int32 scalar (may be traced). ``start + T`` must not exceed S: a traced
      ``start`` cannot be checked here and ``lax.dynamic_update_slice`` would shift
      the write (the caller bounds it; :class:`models.transformer.DecoderLM` poisons
      its logits with NaN when it overflows).
    key: PRNG key, required for stochastic rounding, unused otherwise.

  Returns:
    The updated :class:`QuantizedKV`.
  """
  if not isinstance(cache, QuantizedKV):
    raise TypeError(f"cache must be a QuantizedKV, got {type(cache).__name__}")
  spec = cache.spec
  b, h, s, k = cache.shape
  x = jnp.asarray(x_BxHxTxK)
  if x.ndim != 4 or x.shape[:2] != (b, h) or x.shape[3] != k or x.shape[2] > s:
    raise ValueError(f"x must be [B={b}, H={h}, T<={s}, K={k}], got shape {x.shape}")
  if x.dtype not in (jnp.float32, jnp.bfloat16, jnp.float16):
    raise TypeError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
  if spec.rounding.needs_key and key is None:
    raise ValueError("stochastic rounding needs a PRNG key at every write")
  if not spec.rounding.needs_key:
    key = None  # a key is "unused otherwise": the casts refuse one they would ignore
  x = x.astype(jnp.float32)
  if spec.fmt != "fp32":
    x = lax.stop_gradient(x)  # zero gradient: see the module docstring
  start = jnp.asarray(start, jnp.int32)
  at4 = (0, 0, start, 0)
  put = lambda dst, src, at: lax.dynamic_update_slice(dst, src.astype(dst.dtype), at)
  scales, tensor_scales = cache.scales, cache.tensor_scales
  if spec.fmt == "fp32":
    codes = x
  elif spec.fmt == "bf16":
    codes = rounding_lib.cast(x, "bf16", rounding=spec.rounding, key=key,
                              saturate=False)
  elif spec.fmt == "nvfp4":
    codes, blk, ts = _nvfp4_write(x, spec, key)
    scales = put(scales, blk, at4)
    tensor_scales = put(tensor_scales, ts, (0, start))
  elif spec.is_mx:
    q = blockscale.quantize_mx(x, spec.fmt, block_shape=spec.mx_block, axis=-1,
                               scale_rule=spec.mx_scale_rule, rounding=spec.rounding,
                               key=key)
    codes = q.codes
    scales = put(scales, q.scales, at4)
  elif spec.granularity == "token":
    s_BxHxT = _token_scale(x, spec)
    codes = _scaled_codes(x, s_BxHxT[..., None], spec, key)
    scales = put(scales, s_BxHxT, (0, 0, start))
  else:
    codes = _scaled_codes(x, _broadcast_static(cache.scales, spec), spec, key)
  return QuantizedKV(codes=put(cache.codes, codes, at4), scales=scales,
                     tensor_scales=tensor_scales, spec=spec)


def _broadcast_static(scales: jax.Array, spec: KVQuantSpec) -> jax.Array:
  return scales if spec.granularity == "tensor" else scales[None, :, None, None]


def read(cache: QuantizedKV) -> jax.Array:
  """float32[B, H, S, K]: every position's stored value (0 where none was written).

  Decoding as in the module docstring: exact for fp32, bf16 and the element codes;
  one float32 multiply by the scale for ``tensor``/``head``/``token``; MX and NVFP4
  through :func:`numerics.blockscale.dequantize`.
  """
  if not isinstance(cache, QuantizedKV):
    raise TypeError(f"cache must be a QuantizedKV, got {type(cache).__name__}")
  spec = cache.spec
  if spec.fmt in ("fp32", "bf16"):
    return cache.codes.astype(jnp.float32)
  b, h, s, k = cache.shape
  if spec.fmt == "nvfp4":
    codes_BxSxHxK = _unpack_nibbles(cache.codes).transpose(0, 2, 1, 3)
    scales_BxSxHxN = cache.scales.transpose(0, 2, 1, 3)

    def deq(c, sc, ts):
      return blockscale.dequantize(blockscale.QuantizedArray(
          codes=c, scales=sc, tensor_scale=ts, fmt="e2m1", scale_fmt="e4m3", axes=(1,),
          block_shape=(blockscale.NVFP4_BLOCK,), shape=(h, k), scale_rule="nvfp4"))

    out = jax.vmap(jax.vmap(deq))(codes_BxSxHxK, scales_BxSxHxN, cache.tensor_scales)
    return out.transpose(0, 2, 1, 3)
  if spec.is_mx:
    return blockscale.dequantize(blockscale.QuantizedArray(
        codes=cache.codes, scales=cache.scales, tensor_scale=jnp.float32(1.0),
        fmt=spec.fmt, scale_fmt="e8m0", axes=(3,), block_shape=(spec.mx_block,),
        shape=(b, h, s, k), scale_rule=spec.mx_scale_rule))
  values = encoding.decode(cache.codes, spec.fmt)
  if spec.granularity == "token":
    return values * cache.scales[..., None]
  return values * _broadcast_static(cache.scales, spec)


def calibrated_scale(spec: KVQuantSpec, x_BxHxLxK: jax.Array) -> jax.Array:
  """The static scale ``amax * (1 / fmt.max)`` of calibration data, for :func:`init`.

  ``tensor``: float32[] over all of ``x``; ``head``: float32[H] over each head.
  Non-finite values are ignored; an all-zero tensor or head gets 1.
  """
  spec = _check_spec(spec)
  if not spec.is_static:
    raise ValueError(f"calibrated_scale is for the static granularities "
                     f"{STATIC_GRANULARITIES}, got {spec.granularity!r}")
  x = jnp.asarray(x_BxHxLxK, jnp.float32)
  if x.ndim != 4:
    raise ValueError(f"x must be [B, H, L, K], got shape {x.shape}")
  a = jnp.abs(x)
  a = jnp.where(jnp.isfinite(a), a, 0.0)
  amax = jnp.max(a) if spec.granularity == "tensor" else jnp.max(a, axis=(0, 2, 3))
  s = amax * _reciprocal_max(formats_lib.get(spec.fmt))
  return jnp.where((amax > 0) & (s > 0), s, jnp.float32(1.0))


def tree_nbytes(tree: Any) -> int:
  """Bytes held by the array leaves of ``tree`` (arrays or ``ShapeDtypeStruct``)."""
  return int(sum(int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
                 for leaf in jax.tree_util.tree_leaves(tree)))


def bytes_per_position(spec: KVQuantSpec, heads: int, head_dim: int) -> float:
  """Bytes one cached position of one batch row costs, measured from the pytree.

  The difference of :func:`tree_nbytes` between caches of 2 and 1 positions (batch
  1), so static scales, which do not grow with the cache, are not counted.
  """
  make = lambda s: jax.eval_shape(lambda: init(spec, (1, heads, s, head_dim)))
  return float(tree_nbytes(make(2)) - tree_nbytes(make(1)))


class KVCache(NamedTuple):
  """The KV cache of a stack of attention layers (a pytree).

  Attributes:
    keys: one :class:`QuantizedKV` per layer, logically float32[B, H, S, K].
    values: likewise.
    length: int32[]: positions written so far (the next write starts here).
  """

  keys: tuple[QuantizedKV, ...]
  values: tuple[QuantizedKV, ...]
  length: jax.Array

  @property
  def capacity(self) -> int:
    """S, the number of positions the cache holds."""
    return self.keys[0].shape[2]


def _per_layer(scales: Any, num_layers: int, name: str) -> tuple[Any, ...]:
  if scales is None:
    return (None,) * num_layers
  scales = tuple(scales)
  if len(scales) != num_layers:
    raise ValueError(f"{name} must give one scale per layer ({num_layers}), got "
                     f"{len(scales)}")
  return scales


def init_cache(num_layers: int, shape: tuple[int, int, int, int],
               key_spec: KVQuantSpec, value_spec: KVQuantSpec | None = None, *,
               key_scales: Any = None, value_scales: Any = None) -> KVCache:
  """An empty :class:`KVCache` of ``num_layers`` layers, each ``(B, H, S, K)``.

  ``value_spec=None`` stores the values like the keys. ``key_scales`` /
  ``value_scales``: for static granularities, ``None`` (the naive scale 1) or one
  scale per layer (as :func:`init`'s ``scale``).
  """
  if isinstance(num_layers, bool) or not isinstance(num_layers, (int, np.integer)) or \
      num_layers < 1:
    raise ValueError(f"num_layers must be a positive int, got {num_layers!r}")
  value_spec = key_spec if value_spec is None else value_spec
  ks = _per_layer(key_scales, num_layers, "key_scales")
  vs = _per_layer(value_scales, num_layers, "value_scales")
  return KVCache(keys=tuple(init(key_spec, shape, s) for s in ks),
                 values=tuple(init(value_spec, shape, s) for s in vs),
                 length=jnp.zeros((), jnp.int32))
