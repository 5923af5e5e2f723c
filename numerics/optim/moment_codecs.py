"""Moment codecs: how an optimizer moment is stored between steps, as data.

A :class:`MomentCodec` is a frozen dataclass naming a storage format; it encodes a
float32 moment (``encode(x, key) -> EncodedMoment``) and :func:`decode` brings it back
to float32. An :class:`EncodedMoment` is a pytree of the stored arrays (codes and
scales) whose static metadata is the shape and the codec, so a stored state decodes
by itself. Kinds:

============  ===========================================================  ==========
kind          storage                                                      ``fmt``
============  ===========================================================  ==========
identity      the float32 array (lossless)                                 fp32
cast          element-wise cast, same shape                                bf16, fp16
scaled        blocks of ``block_size`` consecutive elements (flattened     int8, e4m3,
              row-major), a float32 absmax per block; elements             e5m2, e2m3,
              ``round(x * fl32(top / absmax))`` on the format's grid       e3m2, e2m1
              (``top`` = the format's max; 127 for int8, the linear int8
              code), decoded as ``element * fl32(absmax * fl32(1/top))``
codebook      blocks as above; codes index a lookup table                  see
              (:mod:`numerics.codebooks`: bitsandbytes' dynamic maps,       numerics.
              NF4, linear 4-bit), decoded as ``level * absmax``            codebooks
mx            OCP MX blocks (:func:`numerics.quantize_mx`: E8M0 power-of-  e4m3, e5m2,
              two scales, ``block_size`` 32 by default, ``scale_rule``)    e2m3, e3m2,
                                                                           e2m1, int8
============  ===========================================================  ==========

Codes are stored for the ``n`` elements only (the zero padding of the last block is
not stored); 4-bit codes (e2m1, 4-bit codebooks) two per byte
(:func:`numerics.encoding.pack_nibbles`); FP6 codes one per byte. The block absmax
rules (NaN for a block holding NaN/Inf, so it decodes to NaN; 0 below 2^-126) are
those of :mod:`numerics.codebooks`; for ``scaled`` a block with absmax below
``top * 2^-126`` is stored as zeros, so neither the per-block factor ``top / absmax``
overflows nor the decode scale ``absmax / top`` is a float32 subnormal (XLA:CPU
flushes those to zero). The per-block factor and scale are formed explicitly because
XLA reassociates products with constants (``(x * c) * s`` becomes ``x * (c * s)``)
and turns divisions by a broadcast into reciprocal multiplies; written this way the
eager, jitted and NumPy computations round identically.

**Unsigned codecs** (``unsigned=True``; the second moment's): every stored code
decodes to a value >= 0, whatever was encoded. Codebooks must then have no negative
level (``dynamic8_unsigned``, ``linear4_unsigned``); ``scaled`` int8 becomes the
unsigned linear code ``k / 255``, k = 0..255 (all 8 bits used); float element formats
(scaled and MX) encode ``|x|`` and clear the sign bit of the code on encoding and on
decoding (so one bit of the code is unused); ``cast`` encodes and decodes ``|x|``.
Signed codecs refuse unsigned codebooks (they cannot hold a negative first moment).
``sqrt=True`` (unsigned codecs only) stores ``sqrt(|x|)`` and decodes its square.

**Rounding**: ``Nearest()`` (round half to even on grids; codebooks as in
:mod:`numerics.codebooks`) or ``Stochastic(bits=..., rng=...)``: grid kinds round in
the integer domain with ``bits`` random bits (:mod:`numerics.rounding`; ``None``: every
discarded bit), codebooks with 24-bit uniforms. Random words are a function of the key
and the element's position in the padded flat array (:mod:`numerics.random_bits`, the
rounding's generator).
The block scales are never rounded stochastically.

:class:`StateFormat` pairs a first-moment and a second-moment codec; ``state_format``
builds the named ones (the table in :func:`state_format`'s docstring).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from lowprec.numerics import blockscale
from lowprec.numerics import codebooks
from lowprec.numerics import encoding
from lowprec.numerics import formats as formats_lib
from lowprec.numerics import rounding as rounding_lib

KINDS = ("identity", "cast", "scaled", "codebook", "mx")
SCALED_FORMATS = ("int8", "e4m3", "e5m2", "e2m3", "e3m2", "e2m1")
CAST_FORMATS = {"bf16": jnp.bfloat16, "fp16": jnp.float16}
# The names of the roundings a codec takes (numerics.rounding.parse reads them).
_KINDS = (rounding_lib.Nearest, rounding_lib.Stochastic)
ROUNDINGS = tuple(k.name for k in _KINDS)
_U = np.uint32
_UINT8_TOP = 255.0
_MIN_NORMAL = np.float32(2.0 ** -126)


@dataclasses.dataclass(frozen=True)
class MomentCodec:
  """A moment storage format (hashable: usable as static pytree metadata).

  Attributes:
    kind: ``identity``, ``cast``, ``scaled``, ``codebook`` or ``mx``.
    fmt: ``fp32`` (identity), ``bf16``/``fp16`` (cast), an element format
      (scaled, mx) or a codebook name (codebook).
    block_size: elements per scale block (scaled, codebook, mx; None otherwise).
    unsigned: an unsigned codec (decodes to values >= 0; see the module docstring).
    rounding: ``Nearest()`` or ``Stochastic(bits=..., rng=...)`` (not for identity);
      codebooks always use 24 random bits (``Stochastic(bits=None)``).
    scale_rule: the MX scale rule (mx only).
    sqrt: store ``sqrt(|x|)`` and decode its square (unsigned codecs only): a block
      then spans the square root of the values' dynamic range, so fewer small values
      round to zero, at the cost of a sqrt per encode.
  """

  kind: str = "identity"
  fmt: str = "fp32"
  block_size: int | None = None
  unsigned: bool = False
  rounding: rounding_lib.Rounding = rounding_lib.Nearest()
  scale_rule: str = "floor"
  sqrt: bool = False

  def __post_init__(self):
    k = self.kind
    if k not in KINDS:
      raise ValueError(f"unknown codec kind {k!r}; known: {', '.join(KINDS)}")
    rounding_lib.check_rounding(self.rounding, "MomentCodec", kinds=_KINDS)
    if k == "identity":
      if self.fmt != "fp32":
        raise ValueError(f"the identity codec stores fp32, got fmt={self.fmt!r}")
      if self.rounding.needs_key:
        raise ValueError("the identity codec does not round; rounding must be Nearest()")
      if self.unsigned or self.sqrt:
        raise ValueError("the identity codec stores x as is: unsigned and sqrt do not "
                         "apply")
    elif k == "cast":
      if self.fmt not in CAST_FORMATS:
        raise ValueError(f"cast codec fmt must be one of {tuple(CAST_FORMATS)}, got "
                         f"{self.fmt!r}")
    elif k == "scaled":
      if self.fmt not in SCALED_FORMATS:
        raise ValueError(f"scaled codec fmt must be one of {SCALED_FORMATS}, got "
                         f"{self.fmt!r}")
    elif k == "codebook":
      book = codebooks.get(self.fmt)
      if self.unsigned and book.signed:
        raise ValueError(f"codebook {book.name!r} has negative levels; an unsigned "
                         f"codec needs an unsigned codebook")
      if not self.unsigned and not book.signed:
        raise ValueError(f"codebook {book.name!r} has no negative levels; a signed "
                         f"codec cannot store a negative moment")
      if getattr(self.rounding, "bits", None) is not None:
        raise ValueError("codebook stochastic rounding uses 24 random bits; leave "
                         "Stochastic(bits=None)")
    elif k == "mx":
      if self.fmt not in blockscale.MX_ELEMENT_FORMATS:
        raise ValueError(f"mx codec fmt must be one of {blockscale.MX_ELEMENT_FORMATS}, "
                         f"got {self.fmt!r}")
      if self.scale_rule not in blockscale.SCALE_RULES:
        raise ValueError(f"unknown scale_rule {self.scale_rule!r}; known: "
                         f"{', '.join(blockscale.SCALE_RULES)}")
    if k != "mx" and self.scale_rule != "floor":
      raise ValueError(f"scale_rule applies to mx codecs only, not {k!r}")
    blocked = k in ("scaled", "codebook", "mx")
    if blocked:
      b = self.block_size
      if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
        raise ValueError(f"{k} codec needs block_size, a positive int; got {b!r}")
      if self.code_bits == 4 and b % 2:
        raise ValueError(f"4-bit codes are stored two per byte: block_size must be "
                         f"even, got {b}")
    elif self.block_size is not None:
      raise ValueError(f"{k} codec has no blocks; block_size must be None")
    if self.sqrt and not self.unsigned:
      raise ValueError("sqrt storage needs an unsigned codec (unsigned=True)")

  @property
  def code_bits(self) -> int:
    """Stored bits per element, scales excluded (FP6 occupies a byte)."""
    if self.kind == "identity":
      return 32
    if self.kind == "cast":
      return 16
    if self.kind == "codebook":
      return codebooks.get(self.fmt).bits
    return 4 if self.fmt == "e2m1" else 8

  def init(self, shape: tuple[int, ...]) -> "EncodedMoment":
    """The encoding of zeros of ``shape``, built without computing (equal to
    ``encode(zeros)``, tested): zero codes, except a codebook's code for 0, and zero
    scales (absmax 0, or the E8M0 code 0 of an all-zero MX block)."""
    shape = tuple(int(d) for d in shape)
    if self.kind == "identity":
      return EncodedMoment(jnp.zeros(shape, jnp.float32), None, shape, self)
    if self.kind == "cast":
      return EncodedMoment(jnp.zeros(shape, CAST_FORMATS[self.fmt]), None, shape, self)
    n = int(np.prod(shape, dtype=np.int64))
    if n == 0:
      raise ValueError(f"{self.kind} codec cannot store an empty array")
    nb = -(-n // self.block_size)
    zero_code = 0
    if self.kind == "codebook":
      book = codebooks.get(self.fmt)
      zero_code = int(np.searchsorted(book.thresholds, np.float32(0), side="left"))
    if self.code_bits == 4:  # pack_nibbles layout; an odd tail pads with code 0
      codes = np.full(-(-n // 2), (zero_code << 4) | zero_code, np.uint8)
      if n % 2:
        codes[-1] = zero_code << 4
    else:
      codes = np.full(n, zero_code, np.uint8)
    codes = jnp.asarray(codes)
    scale_dtype = jnp.uint8 if self.kind == "mx" else jnp.float32
    return EncodedMoment(codes, jnp.zeros((nb,), scale_dtype), shape, self)

  def encode(self, x: jax.Array, key: jax.Array | None = None) -> "EncodedMoment":
    """Stores float32 ``x`` (any shape); ``key`` is required for stochastic rounding."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
      raise TypeError(f"encode expects a floating array, got {x.dtype}")
    if self.rounding.needs_key and key is None:
      raise ValueError(f"codec {self} rounds stochastically and needs a key")
    if not self.rounding.needs_key and key is not None:
      raise ValueError(f"codec {self} rounds to nearest; a key would be ignored")
    if x.size == 0 and self.kind not in ("identity", "cast"):
      raise ValueError(f"{self.kind} codec cannot store an empty array")
    return _encode_jit(self, x.astype(jnp.float32), key)

  def _encode(self, x: jax.Array, key: jax.Array | None) -> "EncodedMoment":
    shape = tuple(x.shape)
    if self.kind == "identity":
      return EncodedMoment(x, None, shape, self)
    if self.unsigned:
      x = jnp.abs(x)
    if self.sqrt:
      x = jnp.sqrt(x)
    if self.kind == "cast":
      y = rounding_lib.cast(x, self.fmt, rounding=self.rounding, key=key)
      return EncodedMoment(y.astype(CAST_FORMATS[self.fmt]), None, shape, self)
    n = x.size
    if self.kind == "mx":
      return self._encode_mx(x, key, shape)
    b = self.block_size
    nb = -(-n // b)
    x_NxB = jnp.pad(x.reshape(-1), (0, nb * b - n)).reshape(nb, b)
    words = self.rounding.words(key, x_NxB.shape, shard_of=x_NxB)
    if self.kind == "codebook":
      codes, absmax = codebooks.quantize_blocks(x_NxB, self.fmt, rounding=self.rounding,
                                                words=words)
    else:
      codes, absmax = self._encode_scaled(x_NxB, words)
    return EncodedMoment(self._store(codes.reshape(-1)[:n]), absmax, shape, self)

  def _top(self) -> float:
    if self.fmt == "int8" and self.unsigned:
      return _UINT8_TOP
    return formats_lib.get(self.fmt).max

  def _encode_scaled(self, x_NxB, words):
    f = formats_lib.get(self.fmt)
    top = np.float32(self._top())
    absmax = codebooks.block_absmax(x_NxB, float(top * _MIN_NORMAL))
    ok = absmax > 0
    # One per-block factor: XLA reassociates products with constants (x * inv * top
    # would become x * (inv * top)), so the factor is formed explicitly.
    factor = jnp.where(ok, top / jnp.where(ok, absmax, np.float32(1.0)), np.float32(0.0))
    t = x_NxB * factor[:, None]
    if self.fmt == "int8" and self.unsigned:
      # The unsigned linear code: integers 0..255 (a grid with quantum 1 below 2^9).
      a = lax.bitcast_convert_type(t, jnp.uint32) & _U(0x7FFFFFFF)
      mag = rounding_lib.round_magnitude(a, 8, 8, self.rounding, words)
      mag = jnp.minimum(mag, _U(np.float32(_UINT8_TOP).view(np.uint32)))
      return lax.bitcast_convert_type(mag, jnp.float32).astype(jnp.uint8), absmax
    e = rounding_lib.round_f32(t, f, rounding=self.rounding, words=words, saturate=True)
    return self._unsign(encoding.encode(e, f)), absmax

  def _encode_mx(self, x, key, shape):
    q = blockscale.quantize_mx(x.reshape(-1), self.fmt, block_shape=self.block_size,
                               axis=0, scale_rule=self.scale_rule, rounding=self.rounding,
                               pad=True, key=key)
    return EncodedMoment(self._store(self._unsign(q.codes[:x.size])), q.scales, shape,
                         self)

  def _unsign(self, codes):
    """Clears the sign bit of float / MX element codes of an unsigned codec."""
    if (not self.unsigned or self.kind not in ("scaled", "mx")
        or (self.kind == "scaled" and self.fmt == "int8")):
      return codes
    bits = formats_lib.get(self.fmt).bits
    return codes & np.uint8((1 << (bits - 1)) - 1)

  def _store(self, codes_n):
    return encoding.pack_nibbles(codes_n) if self.code_bits == 4 else codes_n

  def _load(self, stored, n, nb):
    codes = encoding.unpack_nibbles(stored, n) if self.code_bits == 4 else stored
    return jnp.pad(codes, (0, nb * self.block_size - n)).reshape(nb, self.block_size)

  def decode(self, enc: "EncodedMoment") -> jax.Array:
    """float32 values of ``enc`` (which must have been stored by this codec)."""
    if enc.codec != self:
      raise ValueError(f"{enc.codec} stored this moment, not {self}")
    return _decode_jit(enc)

  def _decode(self, enc: "EncodedMoment") -> jax.Array:
    y = self._decode_values(enc)
    return y * y if self.sqrt else y

  def _decode_values(self, enc: "EncodedMoment") -> jax.Array:
    shape = enc.shape
    if self.kind == "identity":
      return enc.codes
    if self.kind == "cast":
      y = enc.codes.astype(jnp.float32)
      return jnp.abs(y) if self.unsigned else y
    n = int(np.prod(shape, dtype=np.int64))
    b = self.block_size
    nb = -(-n // b)
    codes = self._unsign(self._load(enc.codes, n, nb))  # any stored byte decodes >= 0
    if self.kind == "mx":
      q = blockscale.QuantizedArray(
          codes=codes.reshape(-1), scales=enc.scales, tensor_scale=jnp.float32(1.0),
          fmt=self.fmt, scale_fmt="e8m0", axes=(0,), block_shape=(b,), shape=(n,),
          scale_rule=self.scale_rule)
      return blockscale.dequantize(q).reshape(shape)
    if self.kind == "codebook":
      values = codebooks.dequantize_blocks(codes, enc.scales, self.fmt)
    else:
      if self.fmt == "int8" and self.unsigned:
        elem = codes.astype(jnp.float32)
      else:
        elem = encoding.decode(codes, self.fmt)
      # One per-block scale, formed explicitly (XLA would reassociate
      # (elem * c) * absmax into this form anyway).
      scale = enc.scales * (np.float32(1) / np.float32(self._top()))
      values = elem * scale[:, None]
    return values.reshape(-1)[:n].reshape(shape)


@dataclasses.dataclass(frozen=True)
class EncodedMoment:
  """A stored moment: arrays ``codes`` and ``scales`` plus static ``shape`` and ``codec``.

  ``codes``: the float32 (identity) or bf16/fp16 (cast) array of ``shape``, or flat
  uint8 codes (packed two per byte for 4-bit codecs). ``scales``: float32 block
  absmaxes (scaled, codebook), uint8 E8M0 codes (mx) or None.
  """

  codes: jax.Array
  scales: jax.Array | None
  shape: tuple[int, ...]
  codec: MomentCodec


jax.tree_util.register_dataclass(EncodedMoment, data_fields=["codes", "scales"],
                                 meta_fields=["shape", "codec"])


@functools.partial(jax.jit, static_argnums=0)
def _encode_jit(codec: MomentCodec, x: jax.Array, key: jax.Array | None) -> EncodedMoment:
  return codec._encode(x, key)  # pylint: disable=protected-access


@jax.jit
def _decode_jit(enc: EncodedMoment) -> jax.Array:
  return enc.codec._decode(enc)  # pylint: disable=protected-access


def decode(enc: EncodedMoment) -> jax.Array:
  """float32 values of a stored moment (its codec is part of it)."""
  if not isinstance(enc, EncodedMoment):
    raise TypeError(f"decode expects an EncodedMoment, got {type(enc).__name__}")
  return enc.codec.decode(enc)


# ----------------------------------------------------------------------- state formats


@dataclasses.dataclass(frozen=True)
class StateFormat:
  """The storage of Adam's two moments: ``mu`` signed, ``nu`` unsigned.

  Leaves with fewer than ``min_size`` elements keep float32 moments (bitsandbytes'
  ``min_8bit_size`` and torchao's threshold: 4096): their block scales would cost
  more than quantization saves.
  """

  name: str
  mu: MomentCodec
  nu: MomentCodec
  min_size: int = 4096

  def __post_init__(self):
    m = self.min_size
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 0:
      raise ValueError(f"min_size must be an int >= 0, got {m!r}")
    if not isinstance(self.mu, MomentCodec) or not isinstance(self.nu, MomentCodec):
      raise TypeError("mu and nu must be MomentCodecs")
    if self.mu.unsigned:
      raise ValueError("the first moment is signed: mu must not be an unsigned codec")
    if not self.nu.unsigned and self.nu.kind != "identity":
      raise ValueError("the second moment is kept non-negative by construction: nu "
                       "must be an unsigned codec (unsigned=True)")

  @property
  def is_stochastic(self) -> bool:
    return self.mu.rounding.needs_key or self.nu.rounding.needs_key

  def codecs_for(self, size: int) -> tuple[MomentCodec, MomentCodec]:
    """(mu, nu) codecs of a leaf of ``size`` elements (float32 below ``min_size``)."""
    if size == 0 or size < self.min_size:
      return MomentCodec(), MomentCodec()
    return self.mu, self.nu


# name: (mu kind, mu fmt, nu kind, nu fmt, default block size, anchor)
_FORMATS: dict[str, tuple[str, str, str, str, int | None, str]] = {
    "fp32": ("identity", "fp32", "identity", "fp32", None, "optax.adamw"),
    "bf16": ("cast", "bf16", "cast", "bf16", None, "bf16 moments"),
    "dynamic8": ("codebook", "dynamic8", "codebook", "dynamic8_unsigned", 2048,
                 "bitsandbytes 8-bit Adam (blockwise dynamic, block 2048)"),
    "linear8": ("scaled", "int8", "scaled", "int8", 2048,
                "linear int8 blockwise absmax (signed k/127; unsigned k/255)"),
    "dynamic4": ("codebook", "dynamic4", "codebook", "linear4_unsigned", 128,
                 "torchao Adam4bit (block 128)"),
    "nf4": ("codebook", "nf4", "codebook", "linear4_unsigned", 128,
            "NF4 first moment, torchao's linear 4-bit second moment"),
    "e2m1": ("scaled", "e2m1", "scaled", "e2m1", 128, "FP4 E2M1 with float32 block absmax"),
    "fp8_e4m3": ("scaled", "e4m3", "scaled", "e4m3", 256, "torchao AdamFp8 (block 256)"),
    "fp8_e5m2": ("scaled", "e5m2", "scaled", "e5m2", 256, "FP8 E5M2, float32 block absmax"),
    "mxfp8": ("mx", "e4m3", "mx", "e4m3", blockscale.MX_BLOCK, "OCP MXFP8 E4M3"),
    "mxfp8_e5m2": ("mx", "e5m2", "mx", "e5m2", blockscale.MX_BLOCK, "OCP MXFP8 E5M2"),
    "mxfp6_e2m3": ("mx", "e2m3", "mx", "e2m3", blockscale.MX_BLOCK, "OCP MXFP6 E2M3"),
    "mxfp6_e3m2": ("mx", "e3m2", "mx", "e3m2", blockscale.MX_BLOCK, "OCP MXFP6 E3M2"),
    "mxfp4": ("mx", "e2m1", "mx", "e2m1", blockscale.MX_BLOCK, "OCP MXFP4"),
    "mxint8": ("mx", "int8", "mx", "int8", blockscale.MX_BLOCK, "OCP MXINT8"),
}


def state_format_names() -> tuple[str, ...]:
  """The names :func:`state_format` knows, in table order."""
  return tuple(_FORMATS)


def state_format(name: str, *, block_size: int | None = None,
                 rounding: rounding_lib.Rounding = rounding_lib.Nearest(),
                 scale_rule: str = "floor", sqrt_nu: bool = False,
                 min_size: int = 4096) -> StateFormat:
  """A named :class:`StateFormat` (first moment, second moment):

  ==============  ==================================  ===========================  =====
  name            first moment                        second moment                block
  ==============  ==================================  ===========================  =====
  fp32            float32 (lossless)                  float32                      --
  bf16            bf16 cast                           bf16 cast of ``|v|``         --
  dynamic8        codebook dynamic8                   codebook dynamic8_unsigned   2048
  linear8         int8 ``k/127``                      uint8 ``k/255``              2048
  dynamic4        codebook dynamic4                   codebook linear4_unsigned    128
  nf4             codebook nf4                        codebook linear4_unsigned    128
  e2m1            E2M1, float32 absmax                E2M1 of ``|v|``              128
  fp8_e4m3        E4M3, float32 absmax                E4M3 of ``|v|``              256
  fp8_e5m2        E5M2, float32 absmax                E5M2 of ``|v|``              256
  mxfp8 ...       MX E4M3 (mxfp8), E5M2, E2M3, E3M2,  the same of ``|v|``          32
  mxint8          E2M1 (mxfp4), INT8
  ==============  ==================================  ===========================  =====

  Args:
    name: a row above.
    block_size: overrides the row's block size (not for fp32/bf16).
    rounding: ``Nearest()`` or ``Stochastic(bits=..., rng=...)`` for both moments
      (not for fp32).
    scale_rule: MX scale rule (mx rows only).
    sqrt_nu: store the second moment as ``sqrt(v)`` (not for fp32).
    min_size: leaves with fewer elements keep float32 moments.
  """
  try:
    mu_kind, mu_fmt, nu_kind, nu_fmt, default_block, _ = _FORMATS[name]
  except KeyError:
    raise ValueError(f"unknown state format {name!r}; known: "
                     f"{', '.join(state_format_names())}") from None
  if default_block is None and block_size is not None:
    raise ValueError(f"state format {name!r} has no blocks; block_size must be None")
  block = default_block if block_size is None else block_size
  common = dict(block_size=block, rounding=rounding, scale_rule=scale_rule)
  mu = MomentCodec(mu_kind, mu_fmt, unsigned=False, **common)
  if sqrt_nu and nu_kind == "identity":
    raise ValueError("sqrt_nu with a float32 second moment only adds rounding")
  nu = MomentCodec(nu_kind, nu_fmt, unsigned=nu_kind != "identity", sqrt=sqrt_nu,
                   **common)
  return StateFormat(name, mu, nu, min_size)


def tree_decode(tree: Any) -> Any:
  """Decodes every :class:`EncodedMoment` in ``tree`` (other leaves unchanged)."""
  return jax.tree.map(lambda e: decode(e) if isinstance(e, EncodedMoment) else e, tree,
                      is_leaf=lambda e: isinstance(e, EncodedMoment))
