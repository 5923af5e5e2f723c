"""numerics.optim.moment_codecs: every kind against an independent reference.

References: NumPy/ml_dtypes blockwise coding (tests/numerics/codebook_reference.py),
the OCP MX NumPy reference (tests/numerics/mx_reference.py), ml_dtypes bf16 casts,
hand byte counts. Statistical tests state their false-failure probability.
"""

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from lowprec.numerics import codebooks
from lowprec.numerics import memory
from lowprec.numerics.optim import moment_codecs as mc
from lowprec.numerics.rounding import Nearest, Stochastic, TowardZero
from tests.numerics import codebook_reference as ref
from tests.numerics import mx_reference

F32 = np.float32
SHAPE = (37, 29)  # 1073 elements: a partial last block for every block size here


def _x(seed=0, shape=SHAPE, positive=False):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(shape) * np.exp2(rng.integers(-12, 4, shape))
  return (np.abs(x) if positive else x).astype(F32)


def _roundtrip(codec, x, key=None):
  return np.asarray(mc.decode(codec.encode(jnp.asarray(x), key)))


@pytest.mark.parametrize("fmt,unsigned,block", [
    ("int8", False, 64), ("int8", True, 64), ("e4m3", True, 32), ("e2m1", False, 16)])
def test_scaled_equals_reference(fmt, unsigned, block):
  codec = mc.MomentCodec("scaled", fmt, block, unsigned=unsigned)
  x = _x(1)
  want = ref.scaled_blocks(ref.blocks_of(x, block), fmt, unsigned).reshape(-1)[:x.size]
  np.testing.assert_array_equal(_roundtrip(codec, x), want.reshape(x.shape))


@pytest.mark.parametrize("book,unsigned", [
    ("dynamic8", False), ("dynamic8_unsigned", True), ("nf4", False),
    ("linear4_unsigned", True)])
def test_codebook_equals_reference(book, unsigned):
  codec = mc.MomentCodec("codebook", book, 64, unsigned=unsigned)
  x = _x(2, positive=unsigned)
  enc = codec.encode(jnp.asarray(x))
  codes, absmax, deq = ref.codebook_blocks(ref.blocks_of(x, 64),
                                           codebooks.get(book).levels_array)
  np.testing.assert_array_equal(np.asarray(mc.decode(enc)),
                                deq.reshape(-1)[:x.size].reshape(x.shape))
  np.testing.assert_array_equal(np.asarray(enc.scales), absmax)
  flat = codes.reshape(-1)[:x.size]
  if codec.code_bits == 4:  # packed two per byte, first element high
    flat = np.concatenate([flat, [0]])[:2 * ((flat.size + 1) // 2)]
    flat = (flat[0::2] << 4) | flat[1::2]
  np.testing.assert_array_equal(np.asarray(enc.codes), flat.astype(np.uint8))


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1", "int8"])
def test_mx_equals_reference(fmt):
  codec = mc.MomentCodec("mx", fmt, 32)
  x = _x(3)
  padded = ref.blocks_of(x, 32).reshape(1, -1)
  want, _ = mx_reference.quantize_dequantize_mx(padded, fmt)
  np.testing.assert_array_equal(_roundtrip(codec, x),
                                want.reshape(-1)[:x.size].reshape(x.shape))


def test_cast_and_identity():
  x = _x(4)
  np.testing.assert_array_equal(_roundtrip(mc.MomentCodec(), x), x)
  bf = mc.MomentCodec("cast", "bf16")
  np.testing.assert_array_equal(_roundtrip(bf, x),
                                x.astype(ml_dtypes.bfloat16).astype(F32))
  ubf = mc.MomentCodec("cast", "bf16", unsigned=True)
  np.testing.assert_array_equal(_roundtrip(ubf, -x),
                                np.abs(x).astype(ml_dtypes.bfloat16).astype(F32))


# (Unsigned codebooks hold no negative level at all; see test_codecs' validation.)
UNSIGNED = [
    mc.MomentCodec("cast", "bf16", unsigned=True),
    mc.MomentCodec("scaled", "int8", 64, unsigned=True),
    mc.MomentCodec("scaled", "e4m3", 64, unsigned=True),
    mc.MomentCodec("mx", "int8", 32, unsigned=True),
]


@pytest.mark.parametrize("codec", UNSIGNED, ids=lambda c: f"{c.kind}-{c.fmt}")
def test_unsigned_codecs_never_decode_negative(codec):
  x = _x(5)
  got = _roundtrip(codec, x)
  assert np.all(got >= 0)
  np.testing.assert_array_equal(got, _roundtrip(codec, np.abs(x)))
  # Whatever bytes are stored, nothing decodes negative (E4M3's all-ones is NaN):
  # fill the codes with every bit set.
  enc = codec.encode(jnp.asarray(x))
  if codec.kind != "cast":
    junk = dataclasses.replace(enc, codes=jnp.full_like(enc.codes, 0xFF))
    assert not np.any(np.asarray(mc.decode(junk)) < 0)


def test_unsigned_int8_uses_all_8_bits():
  codec = mc.MomentCodec("scaled", "int8", 4, unsigned=True)
  x = F32([255.0, 128.0, 1.0, 0.0])
  enc = codec.encode(jnp.asarray(x))
  np.testing.assert_array_equal(np.asarray(enc.codes), [255, 128, 1, 0])
  np.testing.assert_array_equal(np.asarray(mc.decode(enc)), x)


def test_sqrt_storage_keeps_small_second_moments_nonzero():
  # A block holding v = 1 and v = 1e-4: linear uint8 of v gives 1e-4 * 255 < 0.5 -> 0;
  # of sqrt(v): 0.01 * 255 = 2.55 -> 3, decoded (3/255)^2 = 1.38e-4.
  plain = mc.MomentCodec("scaled", "int8", 2, unsigned=True)
  sq = mc.MomentCodec("scaled", "int8", 2, unsigned=True, sqrt=True)
  v = F32([1.0, 1e-4])
  assert _roundtrip(plain, v)[1] == 0.0
  got = _roundtrip(sq, v)
  assert got[0] == 1.0
  assert got[1] == pytest.approx((3 * (F32(1) / F32(255))) ** 2, rel=1e-6)


# One codec per kind and signedness (each one compiles; the rest are the same code).
INIT_CODECS = [
    mc.MomentCodec(), mc.state_format("bf16").nu, mc.state_format("linear8").nu,
    mc.state_format("nf4").mu, mc.state_format("nf4").nu, mc.state_format("mxfp4").nu]


@pytest.mark.parametrize("codec", INIT_CODECS, ids=lambda c: f"{c.kind}-{c.fmt}-"
                         f"{'u' if c.unsigned else 's'}")
def test_init_is_the_encoding_of_zeros(codec):
  init = codec.init(SHAPE)
  enc = codec.encode(jnp.zeros(SHAPE))
  assert jax.tree.structure(init) == jax.tree.structure(enc)
  for a, b in zip(jax.tree.leaves(init), jax.tree.leaves(enc)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert a.dtype == b.dtype
  np.testing.assert_array_equal(np.asarray(mc.decode(init)), np.zeros(SHAPE, F32))


@pytest.mark.parametrize("name,expected", [
    # n = 5000 elements; codes + scales, by hand.
    ("fp32", 4 * 5000), ("bf16", 2 * 5000),
    ("dynamic8", 5000 + 4 * 3),              # 3 blocks of 2048, float32 absmax
    ("linear8", 5000 + 4 * 3),
    ("dynamic4", 2500 + 4 * 40),             # 4-bit packed, 40 blocks of 128
    ("e2m1", 2500 + 4 * 40),
    ("fp8_e4m3", 5000 + 4 * 20),             # 20 blocks of 256
    ("mxfp8", 5000 + 157),                   # 157 E8M0 bytes for blocks of 32
    ("mxfp4", 2500 + 157),
    ("mxfp6_e2m3", 5000 + 157),              # FP6 occupies a byte
])
def test_stored_bytes_by_hand(name, expected):
  fmt = mc.state_format(name)
  for codec in (fmt.mu, fmt.nu):
    stored = jax.eval_shape(lambda: codec.init((50, 100)))
    assert memory.tree_bytes(stored) == expected


@pytest.mark.parametrize("codec", [
    mc.MomentCodec("scaled", "int8", 64, rounding=Stochastic()),
    mc.MomentCodec("codebook", "dynamic8", 64, rounding=Stochastic()),
    mc.MomentCodec("mx", "e4m3", 32, rounding=Stochastic()),
], ids=lambda c: c.kind)
def test_stochastic_is_reproducible_and_within_one_step(codec):
  x = _x(6)
  key = jax.random.key(3)
  a = _roundtrip(codec, x, key)
  np.testing.assert_array_equal(a, _roundtrip(codec, x, key))
  assert not np.array_equal(a, _roundtrip(codec, x, jax.random.key(4)))
  nearest = dataclasses.replace(codec, rounding=Nearest())
  rn = _roundtrip(nearest, x)
  # SR lands on one of the two grid neighbours of x; RN on the nearer one.
  lo, hi = np.minimum(a, rn), np.maximum(a, rn)
  assert np.all((lo <= x) & (x <= hi) | (a == rn))


def test_stochastic_linear_int8_is_unbiased():
  # 4096 copies of 0.5 quanta in blocks whose absmax is 127 quanta: P(up) = 1/2.
  # False-failure probability of |k/N - 1/2| > 5 sigma (normal approx.): 5.7e-7.
  codec = mc.MomentCodec("scaled", "int8", 64, rounding=Stochastic())
  x = np.full((64, 64), 0.5, F32)
  x[:, 0] = 127.0
  got = _roundtrip(codec, x, jax.random.key(11))[:, 1:]
  assert set(np.unique(got)) <= {0.0, 1.0}
  n = got.size
  assert abs(np.mean(got) - 0.5) < 5 * np.sqrt(0.25 / n)


def test_codec_validation():
  with pytest.raises(ValueError, match="unknown codec kind"):
    mc.MomentCodec("lut")
  with pytest.raises(ValueError, match="block_size"):
    mc.MomentCodec("scaled", "int8")
  with pytest.raises(ValueError, match="even"):
    mc.MomentCodec("codebook", "nf4", 63)
  with pytest.raises(ValueError, match="unsigned codebook"):
    mc.MomentCodec("codebook", "nf4", 64, unsigned=True)
  with pytest.raises(ValueError, match="signed codec"):
    mc.MomentCodec("codebook", "linear4_unsigned", 64)
  with pytest.raises(ValueError, match="does not round"):
    mc.MomentCodec(rounding=Stochastic())
  with pytest.raises(ValueError, match="24 random bits"):
    mc.MomentCodec("codebook", "dynamic8", 64, rounding=Stochastic(bits=8))
  with pytest.raises(ValueError, match="TowardZero"):
    mc.MomentCodec("scaled", "int8", 64, rounding=TowardZero())
  with pytest.raises(ValueError, match="scale_rule"):
    mc.MomentCodec("scaled", "int8", 64, scale_rule="ceil")
  with pytest.raises(ValueError, match="no blocks"):
    mc.MomentCodec("cast", "bf16", 32)
  with pytest.raises(ValueError, match="sqrt"):
    mc.MomentCodec("scaled", "int8", 64, sqrt=True)
  codec = mc.MomentCodec("scaled", "int8", 64)
  with pytest.raises(ValueError, match="ignored"):
    codec.encode(jnp.ones(4), jax.random.key(0))
  with pytest.raises(ValueError, match="needs a key"):
    dataclasses.replace(codec, rounding=Stochastic()).encode(jnp.ones(4))
  with pytest.raises(ValueError, match="stored this moment"):
    mc.MomentCodec("scaled", "int8", 32).decode(codec.encode(jnp.ones(4)))
  with pytest.raises(ValueError, match="unknown state format"):
    mc.state_format("int3")
  with pytest.raises(ValueError, match="no blocks"):
    mc.state_format("fp32", block_size=64)
  with pytest.raises(ValueError, match="unsigned"):
    mc.StateFormat("x", mc.MomentCodec("scaled", "int8", 8),
                   mc.MomentCodec("scaled", "int8", 8))
