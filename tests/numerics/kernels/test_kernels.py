"""Pallas kernels against the independent NumPy references, bit for bit.

The references (tests/numerics/mx_reference.py: OCP MX from the spec, TE's NVFP4 chain,
stochastic rounding from its definition with the NumPy transcription of the counter
hash) share no code with numerics/, so a numeric bug common to a kernel and the jnp path
fails here. Each kernel is also held equal to the jnp path.

By default the kernels run in Pallas interpret mode, with the GPU kernels' tiling and
structure and with the TPU kernels' (``interpret_as``), on tiles small enough that every
array spans several tiles with ragged edges. With NUMERICS_KERNEL_COMPILED=1 (set by
``python -m experiments.benchmarks.kernel_check``) they run compiled on the accelerator
instead.
"""

import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec import numerics
from lowprec.numerics import blockscale
from lowprec.numerics import kernels
from lowprec.numerics import qdot
from lowprec.numerics.outlier_data import outlier_data
from lowprec.numerics import quantizer
from lowprec.numerics.kernels import dispatch
from lowprec.numerics.kernels import block_matmul
from lowprec.numerics.kernels import mx_quantizers
from lowprec.numerics.rounding import Stochastic, parse
from tests.numerics import mx_reference as ref
from tests.numerics.hash_reference import hash_words_np

COMPILED = os.environ.get("NUMERICS_KERNEL_COMPILED") == "1"
DEVICE_VARIANT = dispatch.TPU if jax.default_backend() == "tpu" else dispatch.GPU
VARIANTS = (DEVICE_VARIANT,) if COMPILED else dispatch.VARIANTS
FORMATS = ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "int8")
# One scale rule and random-bit count per format: every rule, no extra compilations.
RULES = dict(e4m3="floor", e5m2="rceil", e2m3="even", e3m2="ceil", e2m1="alto",
             int8="floor")
RAND_BITS = dict(e3m2=10, e2m1=3, int8=5)  # None (all 32 bits) for the others



def _sr(rounding, key, rand_bits=None):
  """The rounding named ``rounding``, and its key only when it uses one."""
  if rounding != "stochastic":
    return dict(rounding=parse(rounding))
  return dict(rounding=parse(rounding, bits=rand_bits), key=key)

def mode(variant):
  if COMPILED:
    return dict(use_kernel=True)
  return dict(interpret=True, interpret_as=variant)


def tile(variant, gpu_tile, tpu_tile):
  """Small explicit tiles in interpret mode (several tiles); defaults when compiled."""
  if COMPILED:
    return None
  return gpu_tile if variant == dispatch.GPU else tpu_tile


def _data(shape, seed=0):
  """N(0,1) with 1% N(0,1e4) outliers, a NaN, an Inf, a zero block, subnormals."""
  x = np.asarray(outlier_data(jax.random.key(seed), shape, 0.01))
  x = x.reshape(-1, shape[-1]).copy()
  x[1, 3] = np.nan
  x[2, 40 % shape[-1]] = -np.inf
  x[4, :32] = 0.0
  x[5, :32] = np.float32(3e-39) * np.arange(32)  # float32 subnormals
  x[6, :16] = 448.0 * 2.0 ** np.arange(16)  # block maxima near format boundaries
  return jnp.asarray(x.reshape(shape))


def _bits(a):
  return np.asarray(a, np.float32).view(np.uint32)


def _assert_same_floats(got, want):
  np.testing.assert_array_equal(_bits(got), _bits(want))


# ----------------------------------------------------------------------------- MX quantize


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_mx_quantize_matches_numpy_reference(fmt, rounding, variant):
  if variant == dispatch.TPU and (fmt, rounding) not in (("e4m3", "stochastic"),
                                                         ("int8", "nearest")):
    pytest.skip("TPU tiling: two cases suffice (the kernel body is the GPU one)")
  x = _data((40, 192), seed=1)  # GPU tiles 16 x 64: 3 x 3 tiles, ragged rows
  key = jax.random.key(2)
  rule, rbits = RULES[fmt], RAND_BITS.get(fmt)
  got = kernels.mx_quantize(x, fmt, scale_rule=rule, **_sr(rounding, key, rbits),
                            tile=tile(variant, (16, 64), (32, 192)), **mode(variant))
  words = hash_words_np(key, x.shape) if rounding == "stochastic" else None
  codes, scales, _ = ref.quantize_mx(np.asarray(x), fmt, rule, rounding=rounding,
                                     words=words, rand_bits=rbits)
  np.testing.assert_array_equal(np.asarray(got.codes), codes)
  np.testing.assert_array_equal(np.asarray(got.scales), scales)
  want = numerics.quantize_mx(x, fmt, scale_rule=rule, **_sr(rounding, key, rbits))
  chex.assert_trees_all_equal(got, want)


def test_mx_quantize_tiling_invariant_and_padded():
  x = _data((48, 70), seed=3)  # 70 columns: padded to 96
  key = jax.random.key(5)
  words = hash_words_np(key, (48, 96))
  codes, scales, _ = ref.quantize_mx(np.pad(np.asarray(x), ((0, 0), (0, 26))), "e2m1",
                                     "alto", rounding="stochastic", words=words)
  tiles = [None] if COMPILED else [(8, 32), (64, 128)]
  for t in tiles:
    got = kernels.mx_quantize(x, "e2m1", scale_rule="alto", rounding=Stochastic(),
                              key=key, pad=True, tile=t, **mode(dispatch.GPU))
    np.testing.assert_array_equal(np.asarray(got.codes), codes)
    np.testing.assert_array_equal(np.asarray(got.scales), scales)
    assert got.shape == (48, 70) and got.padded_shape == (48, 96)


# ----------------------------------------------------------------------------- MX fused QDQ


# (fmt, axis, rounding, shape): every format, both blocked axes, 2D and 3D operands.
QDQ_CASES = [
    ("e4m3", -1, "nearest", (40, 192)),
    ("e4m3", -2, "stochastic", (2, 64, 72)),
    ("e5m2", -2, "nearest", (96, 40)),
    ("e2m3", -1, "stochastic", (3, 8, 96)),
    ("e3m2", -1, "toward_zero", (40, 64)),
    ("e2m1", -2, "stochastic", (64, 136)),
    ("int8", -2, "stochastic", (2, 32, 48)),
]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fmt,axis,rounding,shape", QDQ_CASES)
def test_mx_quantize_dequantize_matches_numpy_reference(fmt, axis, rounding, shape,
                                                        variant):
  if variant == dispatch.TPU and fmt not in ("e4m3", "e2m1"):
    pytest.skip("TPU tiling: two cases suffice (the kernel body is the GPU one)")
  x = _data(shape, seed=4)
  key = jax.random.key(6)
  rule, rbits = RULES[fmt], RAND_BITS.get(fmt)
  gpu_tile = (16, 32) if axis == -1 else (32, 16)
  got = kernels.mx_quantize_dequantize(x, fmt, axis=axis, scale_rule=rule,
                                       **_sr(rounding, key, rbits),
                                       tile=tile(variant, gpu_tile, (32, shape[-1])),
                                       **mode(variant))
  words = hash_words_np(key, shape) if rounding == "stochastic" else None
  _, _, deq = ref.quantize_mx(np.asarray(x), fmt, rule, axis=axis, rounding=rounding,
                              words=words, rand_bits=rbits)
  _assert_same_floats(got, deq)
  want = blockscale.quantize_dequantize_mx(x, fmt, axis=axis, scale_rule=rule,
                                           **_sr(rounding, key, rbits))
  _assert_same_floats(got, want)


def test_mx_quantize_dequantize_padded_bfloat16():
  x = _data((40, 70), seed=7).astype(jnp.bfloat16)
  got = kernels.mx_quantize_dequantize(x, "e4m3", pad=True, tile=tile(dispatch.GPU,
                                                                       (16, 64), None),
                                       **mode(dispatch.GPU))
  _, _, deq = ref.quantize_mx(np.pad(np.asarray(x.astype(jnp.float32)), ((0, 0), (0, 26))),
                              "e4m3")
  _assert_same_floats(got, deq[:, :70])
  assert got.dtype == jnp.float32 and got.shape == (40, 70)


# ----------------------------------------------------------------------------- NVFP4


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_nvfp4_quantize_matches_numpy_reference(rounding, variant):
  if variant == dispatch.TPU and rounding == "nearest":
    pytest.skip("TPU tiling: one case suffices")
  x = _data((40, 96), seed=8)
  key = jax.random.key(9)
  got = kernels.nvfp4_quantize(x, **_sr(rounding, key),
                               tile=tile(variant, (16, 32), (32, 96)), **mode(variant))
  words = hash_words_np(key, x.shape) if rounding == "stochastic" else None
  codes, scales, inv, _ = ref.quantize_nvfp4(np.asarray(x), rounding=rounding, words=words)
  np.testing.assert_array_equal(np.asarray(got.codes), codes)
  np.testing.assert_array_equal(np.asarray(got.scales), scales)
  _assert_same_floats(got.tensor_scale, inv)
  chex.assert_trees_all_equal(got, numerics.quantize_nvfp4(x, **_sr(rounding, key)))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("axis,rounding,shape", [(-1, "nearest", (40, 96)),
                                                 (-2, "stochastic", (2, 48, 40))])
def test_nvfp4_quantize_dequantize_matches_numpy_reference(axis, rounding, shape, variant):
  if variant == dispatch.TPU and axis == -1:
    pytest.skip("TPU tiling: one case suffices")
  x = _data(shape, seed=10)
  key = jax.random.key(11)
  gpu_tile = (16, 32) if axis == -1 else (32, 16)
  got = kernels.nvfp4_quantize_dequantize(x, axis=axis, **_sr(rounding, key),
                                          tile=tile(variant, gpu_tile, (32, shape[-1])),
                                          **mode(variant))
  words = hash_words_np(key, shape) if rounding == "stochastic" else None
  _, _, _, deq = ref.quantize_nvfp4(np.asarray(x), axis=axis, rounding=rounding,
                                    words=words)
  _assert_same_floats(got, deq)
  want = numerics.dequantize(numerics.quantize_nvfp4(x, axis=axis,
                                                     **_sr(rounding, key)))
  _assert_same_floats(got, want)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("axis,rounding,shape", [(-1, "nearest", (40, 96)),
                                                 (-2, "stochastic", (2, 48, 40))])
def test_nvfp4_quantize_dequantize_blocks_matches_numpy_reference(axis, rounding, shape,
                                                                  variant):
  if variant == dispatch.TPU and axis == -1:
    pytest.skip("TPU tiling: one case suffices")
  x = _data(shape, seed=12)
  key = jax.random.key(13)
  gpu_tile = (16, 32) if axis == -1 else (32, 16)
  values, inv = kernels.nvfp4_quantize_dequantize_blocks(
      x, axis=axis, **_sr(rounding, key),
      tile=tile(variant, gpu_tile, (32, shape[-1])), **mode(variant))
  words = hash_words_np(key, shape) if rounding == "stochastic" else None
  codes, scales, want_inv, deq = ref.quantize_nvfp4(np.asarray(x), axis=axis,
                                                    rounding=rounding, words=words)
  _assert_same_floats(values, ref.nvfp4_block_values(codes, scales, axes=(axis,)))
  assert float(inv) == float(want_inv)
  _assert_same_floats(values * inv, deq)  # the tensor scale completes the dequantization
  with pytest.raises(TypeError, match="nvfp4_quantize_dequantize_blocks has no gradient"):
    jax.grad(lambda x: jnp.sum(kernels.nvfp4_quantize_dequantize_blocks(
        x, axis=axis, **mode(variant))[0]))(jnp.ones((32, 32)))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("amax", [1e-36, 3.9e-39])
def test_nvfp4_kernels_keep_tensors_of_tiny_values(amax, variant):
  """Issue 35: with a tensor amax below 2688 * 2^-126 the tensor scale 1/S_enc is
  subnormal, which XLA:CPU and TPUs read as zero (scales, codes and the dequantized
  values were lost). The kernels form those products in integers behind a scalar
  branch, as the jnp path does: the NumPy reference's codes and values, bit for bit."""
  rng = np.random.default_rng(int(amax * 1e45) % 2 ** 32)
  x = rng.standard_normal((48, 64)).astype(np.float32)
  x = (x / np.abs(x).max() * np.float32(amax)).astype(np.float32)
  with np.errstate(all="ignore"):
    codes, scales, inv, deq = ref.quantize_nvfp4(x)
    _, _, _, deq_cols = ref.quantize_nvfp4(x, axis=0)
  got = kernels.nvfp4_quantize(jnp.asarray(x), tile=tile(variant, (16, 32), (32, 64)),
                               **mode(variant))
  np.testing.assert_array_equal(np.asarray(got.codes), codes)
  np.testing.assert_array_equal(np.asarray(got.scales), scales)
  _assert_same_floats(got.tensor_scale, inv)
  for axis, want in ((-1, deq), (0, deq_cols)):
    gpu_tile = (16, 32) if axis == -1 else (32, 16)
    got = kernels.nvfp4_quantize_dequantize(
        jnp.asarray(x), axis=axis, tile=tile(variant, gpu_tile, (32, 64)),
        **mode(variant))
    _assert_same_floats(got, want)
  assert np.count_nonzero(deq) > 0


# ----------------------------------------------------------------------------- matmul


def _exact_operands(fa, fb, m, k, n, seed=0):
  """MX operands whose every float32 partial sum is exact: element values drawn from
  a few binades and block scales within 2^-1..2^1, so sums stay below 2^24 quanta."""
  rng = np.random.default_rng(seed)
  def make(fmt, shape, axis):
    mags = rng.choice([0.0, 0.5, 1.0, 1.5, 2.0, 3.0], size=shape)
    x = mags * rng.choice([-1.0, 1.0], size=shape)
    s_shape = (shape[0], shape[1] // 32) if axis == 1 else (shape[0] // 32, shape[1])
    block_scale = 2.0 ** rng.integers(-1, 2, size=s_shape)
    x = x * np.repeat(block_scale, 32, axis=axis)
    return numerics.quantize_mx(jnp.asarray(x, jnp.float32), fmt, axis=axis)
  return make(fa, (m, k), 1), make(fb, (k, n), 0)


def _reference_product(qa, qb):
  return ref.mx_matmul(np.asarray(qa.codes), np.asarray(qa.scales), qa.fmt,
                       np.asarray(qb.codes), np.asarray(qb.scales), qb.fmt)


MM_TILES = {dispatch.GPU: dict(block_m=32, block_n=64, block_k=64),
            dispatch.TPU: dict(block_m=32, block_n=128, block_k=128)}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fa,fb", [("e4m3", "e4m3"), ("e2m1", "int8")])
def test_mx_matmul_bit_exact_on_exactly_summable_operands(fa, fb, variant):
  if variant == dispatch.TPU and fa != "e4m3":
    pytest.skip("TPU structure: one case suffices")
  qa, qb = _exact_operands(fa, fb, 80, 512, 160)  # ragged M/N tiles, several K steps
  want = _reference_product(qa, qb).astype(np.float32)
  tiles = {} if COMPILED else MM_TILES[variant]
  _assert_same_floats(kernels.mx_matmul(qa, qb, **tiles, **mode(variant)), want)
  if variant == dispatch.GPU and fa == "e4m3":
    _assert_same_floats(kernels.mx_matmul(qa, qb, use_kernel=False), want)


@pytest.mark.parametrize("variant", VARIANTS)
def test_mx_matmul_matches_reference_within_float32_accumulation(variant):
  a = numerics.quantize_mx(outlier_data(jax.random.key(1), (80, 512)), "e5m2")
  b = numerics.quantize_mx(outlier_data(jax.random.key(2), (512, 160)), "e2m3",
                           axis=0)  # ragged M/N tiles, several K steps
  want = _reference_product(a, b)
  tiles = {} if COMPILED else MM_TILES[variant]
  got = np.asarray(kernels.mx_matmul(a, b, **tiles, **mode(variant)))
  # |error| <= K * eps32 * sum |a||b| per entry (float32 sums in any order).
  abs_a = np.abs(ref.mx_values(np.asarray(a.codes), np.asarray(a.scales), "e5m2", 1))
  abs_b = np.abs(ref.mx_values(np.asarray(b.codes), np.asarray(b.scales), "e2m3", 0))
  bound = 512 * 2.0 ** -24 * (abs_a @ abs_b)
  assert np.all(np.abs(got - want) <= bound)


def test_mx_matmul_decode_equals_reference_decode():
  """The matmul's bf16 decode of every non-special code of every format (and scale
  0xFF -> NaN) equals ml_dtypes' value times the block scale."""
  sizes = dict(e2m3=64, e3m2=64, e2m1=16)
  codes = {n: np.arange(sizes.get(n, 256), dtype=np.uint8) for n in FORMATS}
  scale = 127 + 3

  @jax.jit
  def decode_all(codes):
    return {n: block_matmul.decode_tile(c, jnp.full(c.shape, scale, jnp.uint8),
                                        numerics.formats.get(n)).astype(jnp.float32)
            for n, c in codes.items()}

  got = decode_all({n: jnp.asarray(c) for n, c in codes.items()})
  for name in FORMATS:
    f = numerics.formats.get(name)
    vals = ref.decode_codes(codes[name], name)
    ok = np.isfinite(vals) & ~((name == "int8") & (codes[name] == 128))
    want = vals * 2.0 ** (scale - 127 - (f.emax - f.mx_emax))
    np.testing.assert_array_equal(np.asarray(got[name], np.float64)[ok], want[ok])
  nan = block_matmul.decode_tile(jnp.zeros(4, jnp.uint8), jnp.full(4, 255, jnp.uint8),
                                 numerics.formats.get("e4m3"))
  assert np.all(np.isnan(np.asarray(nan, np.float32)))


def test_mx_matmul_layout_and_tile_errors():
  a = numerics.quantize_mx(jnp.ones((32, 64)), "e4m3")
  with pytest.raises(ValueError, match="axis 0"):
    kernels.mx_matmul(a, numerics.quantize_mx(jnp.ones((64, 32)), "e4m3"), interpret=True)
  with pytest.raises(ValueError, match="padded"):
    kernels.mx_matmul(numerics.quantize_mx(jnp.ones((32, 40)), "e4m3", pad=True),
                      numerics.quantize_mx(jnp.ones((40, 32)), "e4m3", axis=0, pad=True),
                      interpret=True)
  b = numerics.quantize_mx(jnp.ones((64, 32)), "e4m3", axis=0)
  with pytest.raises(ValueError, match="together"):
    kernels.mx_matmul(a, b, block_m=16, interpret=True)
  with pytest.raises(ValueError, match="powers of two"):
    kernels.mx_matmul(a, b, block_m=24, block_n=16, block_k=32, interpret=True)
  with pytest.raises(ValueError, match="multiple of 32 dividing"):
    kernels.mx_matmul(a, b, block_m=16, block_n=16, block_k=48, interpret=True)


# ----------------------------------------------------------------------------- dispatch


def test_dispatch_rule():
  assert dispatch.resolve(True, False) == "pallas"
  assert dispatch.resolve(False, False) == "jnp"
  assert dispatch.resolve(None, True) == "interpret"
  with pytest.raises(ValueError, match="conflicts"):
    dispatch.resolve(False, True)
  with pytest.raises(ValueError, match="configure the kernel"):
    dispatch.resolve(False, False, tile=(16, 64))
  with pytest.raises(ValueError, match="configure the kernel"):
    dispatch.resolve(False, False, interpret_as="tpu")
  with pytest.raises(ValueError, match="interpret_as"):
    dispatch.resolve(None, True, interpret_as="mosaic")
  for value in dispatch.IMPLS:  # the caller's choice, for what its block traces
    with kernels.implementation(value):
      assert dispatch.resolve(None, False) == value
      assert dispatch.resolve(False, False) == "jnp"
      with kernels.implementation("jnp"):  # the innermost block wins
        assert dispatch.resolve(None, False) == "jnp"
      assert dispatch.resolve(None, False) == value
  with pytest.raises(ValueError, match="kernel implementation must be one of"):
    with kernels.implementation("triton"):
      pass


def test_the_environment_variable_is_the_process_default_read_once(monkeypatch):
  assert dispatch.impl_from_environment({}) == "auto"
  for value in dispatch.IMPLS:
    assert dispatch.impl_from_environment({dispatch.ENV_VAR: f" {value.upper()} "}) == value
  with pytest.raises(ValueError, match="NUMERICS_KERNELS"):
    dispatch.impl_from_environment({dispatch.ENV_VAR: "triton"})
  first = dispatch.default_impl()
  monkeypatch.setenv(dispatch.ENV_VAR, "interpret" if first != "interpret" else "jnp")
  assert dispatch.default_impl() == first  # read once: later changes are not seen


def test_auto_on_cpu_is_the_jnp_path():
  if jax.default_backend() != "cpu":
    pytest.skip("CPU dispatch")
  x = _data((8, 64))
  with kernels.implementation("auto"):
    chex.assert_trees_all_equal(kernels.mx_quantize(x, "e4m3"),
                                numerics.quantize_mx(x, "e4m3"))
    jaxpr = str(jax.make_jaxpr(lambda x: kernels.mx_quantize_dequantize(x, "e4m3"))(x))
  assert "pallas_call" not in jaxpr
  jaxpr = str(jax.make_jaxpr(lambda x: kernels.mx_quantize_dequantize(
      x, "e4m3", use_kernel=True))(x))
  assert "pallas_call" in jaxpr


def test_kernel_eligibility():
  spec = quantizer.QuantSpec
  assert kernels.kernel_eligible(spec("e4m3", 32, axis=-1), 3)
  assert kernels.kernel_eligible(spec("e2m1", 32, axis=-2, pad=True), 3)
  assert kernels.kernel_eligible(spec("nvfp4", 16, axis=-2), 2)
  assert not kernels.kernel_eligible(spec("e4m3", 32, axis=0), 3)
  assert not kernels.kernel_eligible(spec("e4m3", 16, axis=-1), 2)
  assert not kernels.kernel_eligible(spec("e4m3", (32, 32), axis=(0, 1)), 2)
  assert not kernels.kernel_eligible(spec("e4m3", 32,
                                          rounding=Stochastic(rng="threefry")), 2)
  assert not kernels.kernel_eligible(spec("e4m3", scaling="none"), 2)  # a cast
  # torchao's NVFP4 convention has no kernel: it routes to the jnp path explicitly.
  assert not kernels.kernel_eligible(spec("nvfp4", 16, axis=-1, convention="torchao"), 2)


def test_input_errors():
  with pytest.raises(ValueError, match="pad=True"):
    kernels.mx_quantize(jnp.ones((4, 40)), "e4m3", interpret=True)
  with pytest.raises(ValueError, match="PRNG key"):
    kernels.mx_quantize(jnp.ones((4, 64)), "e4m3", rounding=Stochastic(), interpret=True)
  with pytest.raises(ValueError, match="MX element format"):
    kernels.mx_quantize(jnp.ones((4, 64)), "bf16", interpret=True)
  with pytest.raises(ValueError, match="second-to-last"):
    kernels.mx_quantize_dequantize(jnp.ones((64, 4, 4)), "e4m3", axis=0, interpret=True)
  with pytest.raises(TypeError, match="float32"):
    kernels.nvfp4_quantize(jnp.ones((4, 64), jnp.int32), interpret=True)
  with pytest.raises(ValueError, match="powers of two"):
    kernels.mx_quantize(jnp.ones((4, 64)), "e4m3", tile=(3, 64), interpret=True)
  with pytest.raises(ValueError, match="whole blocks"):
    kernels.mx_quantize(jnp.ones((4, 64)), "e4m3", tile=(4, 16), interpret=True)


def test_training_path_dispatches_to_the_fused_kernel(monkeypatch):
  """qdot's operand quantizer runs the fused kernel (interpreted, or compiled on a
  device) for all six mxfp8 operands (forward, dgrad, wgrad) and gives the jnp path's
  output and gradients bit for bit."""
  x = outlier_data(jax.random.key(0), (2, 32, 64))
  w = outlier_data(jax.random.key(1), (64, 96))
  dn = (((2,), (0,)), ((), ()))

  def run():
    f = lambda x, w: jnp.sum(qdot.quantized_dot_general(
        x, w, dn, "mxfp8", preferred_element_type=jnp.float32) ** 2)
    return jax.value_and_grad(f, argnums=(0, 1))(x, w)

  calls = []
  kernel = mx_quantizers.mx_quantize_dequantize
  monkeypatch.setattr(mx_quantizers, "mx_quantize_dequantize",
                      lambda *a, **k: calls.append(k.get("axis")) or kernel(*a, **k))
  with kernels.implementation("pallas" if COMPILED else "interpret"):
    got = run()
  assert sorted(calls) == [-2, -2, -2, -1, -1, -1]
  calls.clear()
  with kernels.implementation("jnp"):
    want = run()
  assert not calls
  chex.assert_trees_all_equal(got, want)
