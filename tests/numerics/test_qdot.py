"""quantized_dot_general: each GEMM against the same quantization done by hand.

GEMM outputs of the MX recipes are compared bit for bit. So that this does not depend
on XLA's accumulation order, the by-hand tests draw magnitudes in [1, 1.75] (random
signs): dequantized MX operands then have few significant bits and every partial sum
is exact in float32. The recipes with float32 tensor scales (fp8, nvfp4) make
dequantized values arbitrary floats, so there the GEMM is compared to a relative
1e-5 (a wrong quantizer is off by ~10%); their quantizers are bit-exact in
test_blockscale and test_fake_quant. NVFP4 GEMMs apply the tensor scales to their
output, which bounded data check bit for bit against decoded codes.
"""

import functools

import chex
import jax
import jax.numpy as jnp
from jax import lax
import numpy as np
import pytest

from lowprec import numerics
from lowprec.numerics import gemm_operands
from lowprec.numerics import operator_snr
from lowprec.numerics import outlier_data
from lowprec.numerics import qdot
from lowprec.numerics import recipes
from lowprec.numerics.rounding import Nearest, Stochastic, parse
from tests.numerics import hadamard_reference
from tests.numerics import mx_reference as ref

DN = (((1,), (0,)), ((), ()))
BF = jnp.bfloat16


def _mm(a, b):
  return jnp.dot(a.astype(BF), b.astype(BF), preferred_element_type=jnp.float32,
                 precision=lax.Precision.HIGHEST)


def _mm32(a, b):
  return jnp.dot(a, b, preferred_element_type=jnp.float32, precision=lax.Precision.HIGHEST)


def _data(m=64, k=64, n=96, seed=0):
  kx, kw, kg = jax.random.split(jax.random.key(seed), 3)
  return (outlier_data.outlier_data(kx, (m, k), 0.01), outlier_data.outlier_data(kw, (k, n), 0.01),
          outlier_data.outlier_data(kg, (m, n), 0.01))


def _bounded(m=64, k=64, n=96, seed=0):
  def draw(key, shape):
    ks, km = jax.random.split(key)
    v = jax.random.uniform(km, shape, minval=1.0, maxval=1.75)
    v = v.at[(0,) * len(shape)].set(1.75)  # amax 1.75 = 448 / 2^8 = 57344 / 2^15
    return jnp.where(jax.random.bernoulli(ks, 0.5, shape), v, -v)
  kx, kw, kg = jax.random.split(jax.random.key(seed), 3)
  return draw(kx, (m, k)), draw(kw, (k, n)), draw(kg, (m, n))


def _close(a, b):
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5,
                             atol=1e-5 * float(jnp.max(jnp.abs(b))))


def _run(recipe, x, w, g, key):
  f = lambda x, w: qdot.quantized_dot_general(x, w, DN, recipe, key=key,
                                              preferred_element_type=jnp.float32)
  out, vjp = jax.vjp(f, x, w)
  return (out,) + vjp(g)


def _keys(key, gemm):
  k = jax.random.fold_in(key, gemm)
  return [jax.random.fold_in(k, i) for i in range(3)]


@pytest.mark.parametrize("key", [jax.random.key(5), jax.random.PRNGKey(5)],
                         ids=["typed", "raw"])
def test_gemm_keys_are_the_documented_fold_ins(key):
  """The batched derivation gives the module docstring's keys, fold_in(fold_in(key,
  g), j), for typed and raw uint32 keys."""
  data = lambda k: (jax.random.key_data(k)
                    if jnp.issubdtype(k.dtype, jax.dtypes.prng_key) else k)
  got = qdot._gemm_keys(key)  # pylint: disable=protected-access
  for g in range(3):
    for j, want in enumerate(_keys(key, g)):
      chex.assert_trees_all_equal(data(got[g][j]), data(want))


def _mx(x, fmt, key=None, **kw):
  stochastic = dict(key=key) if kw.get("rounding", Nearest()).needs_key else {}
  return numerics.dequantize(numerics.quantize_mx(x, fmt, pad=True, **stochastic, **kw))


def test_bf16_is_plain_dot_general_in_bf16():
  x, w, g = _data()
  loss = lambda f: lambda x, w: jnp.sum(f(x, w).astype(jnp.float32) * g)
  # bf16 operands: exactly lax.dot_general in bf16 (what a Flax bf16 layer computes).
  plain = lambda x, w: lax.dot_general(x, w, DN)
  ours = lambda x, w: qdot.quantized_dot_general(x, w, DN, "bf16")
  xb, wb = x.astype(BF), w.astype(BF)
  chex.assert_trees_all_equal(ours(xb, wb), plain(xb, wb))
  chex.assert_trees_all_equal(jax.grad(loss(ours), (0, 1))(xb, wb),
                              jax.grad(loss(plain), (0, 1))(xb, wb))
  # float32 operands: cast to bf16, accumulated and returned in float32.
  plain32 = lambda x, w: lax.dot_general(x.astype(BF), w.astype(BF), DN,
                                         preferred_element_type=jnp.float32)
  assert ours(x, w).dtype == jnp.float32
  chex.assert_trees_all_equal(ours(x, w), plain32(x, w))
  chex.assert_trees_all_equal(jax.grad(loss(ours), (0, 1))(x, w),
                              jax.grad(loss(plain32), (0, 1))(x, w))


@pytest.mark.parametrize("name", ["mxfp4_1d2d", "mxfp4_rht", "mxfp4"])
def test_mxfp4_alto_by_hand(name):
  x, w, g = _bounded()
  key = jax.random.key(3)
  out, dx, dw = _run(name, x, w, g, key)
  rule = dict(scale_rule="alto")
  # Forward: X 1x32 along K, W 32x32 tiles.
  wq = _mx(w, "e2m1", block_shape=(32, 32), **rule)
  chex.assert_trees_all_equal(out, _mm(_mx(x, "e2m1", axis=-1, **rule), wq))
  # dgrad: dO 1x32 along N (SR in mxfp4), the same quantized W.
  kd = _keys(key, 1)
  sr = name == "mxfp4"
  gq = _mx(g, "e2m1", axis=-1, rounding=parse("stochastic" if sr else "nearest"),
           key=kd[1] if sr else None, **rule)
  chex.assert_trees_all_equal(dx, _mm(gq, wq.T))
  # wgrad: RHT (32, along tokens) on X and dO, then 1x32 blocks along tokens.
  kw = _keys(key, 2)
  xh, gh = x, g
  if name != "mxfp4_1d2d":
    xh = numerics.random_hadamard(x, key=kw[0], block_shape=32, axis=0)
    gh = numerics.random_hadamard(g, key=kw[0], block_shape=32, axis=0)
  xq = _mx(xh, "e2m1", axis=0, **rule)
  gq2 = _mx(gh, "e2m1", axis=0, rounding=parse("stochastic" if sr else "nearest"),
            key=kw[2] if sr else None, **rule)
  chex.assert_trees_all_equal(dw, _mm(xq.T, gq2))


def test_mxfp8_by_hand():
  x, w, g = _bounded(k=80)  # K = 80 is padded to 96 for the 1x32 blocks
  out, dx, dw = _run("mxfp8", x, w, g, None)
  q = lambda a, axis: _mx(a, "e4m3", axis=axis, scale_rule="rceil")
  chex.assert_trees_all_equal(out, _mm(q(x, -1), q(w, 0)))
  chex.assert_trees_all_equal(dx, _mm(q(g, -1), q(w, -1).T))  # W re-quantized along N
  chex.assert_trees_all_equal(dw, _mm(q(x, 0).T, q(g, 0)))


def test_nvfp4_by_hand():
  x, w, g = _data()
  key = jax.random.key(11)
  out, dx, dw = _run("nvfp4", x, w, g, key)
  nv = lambda a, **kw: numerics.dequantize(numerics.quantize_nvfp4(a, **kw))
  wq = nv(w, block_shape=(16, 16))
  _close(out, _mm32(nv(x, axis=-1), wq))
  kd = _keys(key, 1)
  _close(dx, _mm32(nv(g, axis=-1, rounding=Stochastic(), key=kd[1]), wq.T))
  kw = _keys(key, 2)
  xh = numerics.random_hadamard(x, key=kw[0], block_shape=16, axis=0)
  gh = numerics.random_hadamard(g, key=kw[0], block_shape=16, axis=0)
  _close(dw, _mm32(nv(xh, axis=0).T, nv(gh, axis=0, rounding=Stochastic(), key=kw[2])))


def test_nvfp4_gemms_apply_the_tensor_scales_to_the_output():
  """NVFP4 GEMMs multiply block-scaled values (E2M1 x E4M3) and scale the float32
  output by both tensor scales, as NVFP4 tensor cores do. Bounded data keep every
  partial sum of those values exact, so the reference is the exact product of the
  decoded codes (ml_dtypes), rounded to float32, times ``float32(s_x * s_w)``."""
  x, w, g = _bounded()
  key = jax.random.key(12)
  out, dx, _ = _run("nvfp4", x, w, g, key)

  def blocks(a, **kw):
    q = numerics.quantize_nvfp4(a, **kw)
    v = ref.nvfp4_block_values(np.asarray(q.codes), np.asarray(q.scales),
                               block_shape=q.block_shape, axes=q.axes)
    return v.astype(np.float64), np.float32(q.tensor_scale)

  def epilogue(a, b):
    (va, sa), (vb, sb) = a, b
    return (va @ vb).astype(np.float32) * np.float32(sa * sb)

  xq, wq = blocks(x, axis=-1), blocks(w, block_shape=(16, 16))
  want = epilogue(xq, wq)
  np.testing.assert_array_equal(np.asarray(out), want)
  kd = _keys(key, 1)
  gq = blocks(g, axis=-1, rounding=Stochastic(), key=kd[1])
  np.testing.assert_array_equal(np.asarray(dx), epilogue(gq, (wq[0].T, wq[1])))
  # The GEMM of the fully dequantized operands rounds each operand by its tensor scale
  # first: other bits on this data.
  full = lambda v: (v[0] * v[1]).astype(np.float32).astype(np.float64)
  assert np.any((full(xq) @ full(wq)).astype(np.float32) != want)


def test_fp8_tensorwise_by_hand():
  x, w, g = _data()
  out, dx, dw = _run("fp8", x, w, g, None)

  def q(a, fmt):
    a = a.astype(jnp.float32)
    s = jnp.float32(numerics.formats.get(fmt).max) / jnp.max(jnp.abs(a))
    return numerics.cast(a * s, fmt) / s

  _close(out, _mm32(q(x, "e4m3"), q(w, "e4m3")))
  _close(dx, _mm32(q(g, "e5m2"), q(w, "e4m3").T))
  _close(dw, _mm32(q(x, "e4m3").T, q(g, "e5m2")))


def test_general_dimension_numbers_match_flattened():
  # (B, T, K) x (K, H, D): tokens span two dims, features two dims; and a batched form.
  kx, kw = jax.random.split(jax.random.key(0))
  x = jax.random.normal(kx, (2, 16, 64))
  w = jax.random.normal(kw, (64, 4, 8))
  dn = (((2,), (0,)), ((), ()))
  y = qdot.quantized_dot_general(x, w, dn, "mxfp8")
  flat = qdot.quantized_dot_general(x.reshape(32, 64), w.reshape(64, 32), DN, "mxfp8")
  chex.assert_trees_all_equal(y, flat.reshape(2, 16, 4, 8))
  # Batch dims: per-batch GEMMs.
  a = jax.random.normal(kx, (3, 32, 64))
  b = jax.random.normal(kw, (3, 64, 32))
  dnb = (((2,), (1,)), ((0,), (0,)))
  yb = qdot.quantized_dot_general(a, b, dnb, "mxfp8")
  for i in range(3):
    chex.assert_trees_all_equal(yb[i], qdot.quantized_dot_general(a[i], b[i], DN, "mxfp8"))
  gb = jax.grad(lambda a: jnp.sum(qdot.quantized_dot_general(a, b, dnb, "mxfp8")))(a)
  assert gb.shape == a.shape and bool(jnp.all(jnp.isfinite(gb)))


def test_rht_with_ragged_tokens_keeps_wgrad_close():
  x, w, g = _data(m=40)  # 40 tokens: zero-padded to 64 for the 32-point RHT
  _, _, dw = _run("mxfp4", x, w, g, jax.random.key(1))
  assert dw.shape == w.shape
  assert operator_snr.snr_db(x.T @ g, dw) > 8.0


def test_errors():
  x, w, _ = _data()
  with pytest.raises(ValueError, match="needs a PRNG key"):
    qdot.quantized_dot_general(x, w, DN, "mxfp4")
  with pytest.raises(ValueError, match="unknown recipe"):
    qdot.quantized_dot_general(x, w, DN, "int3")
  with pytest.raises(TypeError, match="float"):
    qdot.quantized_dot_general(x.astype(jnp.int32), w, DN, "mxfp8")
  with pytest.raises(ValueError, match="contracting dims differ"):
    qdot.quantized_dot_general(x, w[:32], DN, "mxfp8")
  # Before (issue 51): axis 3 of a rank-2 lhs wrapped to axis 1 and was reported as
  # "contracting dims differ" (or, with equal sizes, contracted the wrong axis).
  with pytest.raises(ValueError, match="axis 3 is out of range for the lhs of rank 2"):
    qdot.quantized_dot_general(x, w, (((3,), (0,)), ((), ())), "mxfp8")
  with pytest.raises(ValueError, match="2D tiles"):
    recipes.replace("mxfp4", name="bad", forward=recipes.GemmRecipe(
        lhs=recipes.MXQuant("e2m1"), rhs=recipes.MXQuant("e2m1")))
  with pytest.raises(ValueError, match="block scaling"):
    recipes.MXQuant("bf16")


def test_jit_and_determinism():
  x, w, g = _data()
  key = jax.random.key(2)
  f = jax.jit(lambda x, w, k: _run("mxfp4", x, w, g, k))
  chex.assert_trees_all_equal(f(x, w, key), _run("mxfp4", x, w, g, key))
  a, b = f(x, w, key), f(x, w, jax.random.key(5))
  chex.assert_trees_all_equal(a[0], b[0])  # forward is deterministic
  assert not np.array_equal(a[1], b[1])    # SR in dgrad depends on the key


def test_custom_recipe_and_registry():
  assert set(recipes.names()) >= {"bf16", "fp8", "mxfp8", "mxfp4", "nvfp4"}
  r = recipes.replace("mxfp8", name="mxfp8_floor", forward=recipes.GemmRecipe(
      lhs=recipes.MXQuant("e4m3"), rhs=recipes.MXQuant("e4m3")))
  x, w, g = _bounded()
  out, _, _ = _run(r, x, w, g, None)
  chex.assert_trees_all_equal(out, _mm(_mx(x, "e4m3", axis=-1), _mx(w, "e4m3", axis=0)))
  assert recipes.get("mxfp4").needs_key and not recipes.get("mxfp8").needs_key
  assert hash(recipes.get("nvfp4")) == hash(recipes.get("nvfp4"))


def test_snr_tool_orders_recipes():
  s = {r: operator_snr.snr(r, tokens=256, k=256, n=256) for r in
       ("bf16", "mxfp8", "mxfp4_1d2d", "mxfp4_rht", "mxfp4")}
  for r in s:
    assert set(s[r]) == {"forward", "dgrad", "wgrad"}
  for gemm in ("forward", "dgrad", "wgrad"):
    assert s["bf16"][gemm] > s["mxfp8"][gemm] > s["mxfp4_1d2d"][gemm] > 5.0
  # RHT only touches wgrad; SR only the gradient operand (dgrad and wgrad).
  assert s["mxfp4_rht"]["forward"] == s["mxfp4_1d2d"]["forward"]
  assert s["mxfp4_rht"]["dgrad"] == s["mxfp4_1d2d"]["dgrad"]
  assert s["mxfp4"]["forward"] == s["mxfp4_rht"]["forward"]


def test_mxfp8_operands_match_jax_scaled_dot_general_quantizer():
  # JAX's own MXFP8 quantizer (behind jax.nn.scaled_dot_general) is RCEIL + clip +
  # RNE: our "mxfp8" operand quantization must agree with it bit for bit.
  sm = pytest.importorskip("jax._src.cudnn.scaled_matmul_stablehlo")
  x = outlier_data.outlier_data(jax.random.key(0), (1, 64, 128), 0.01)
  cfg = jax.nn.get_scaled_dot_general_config("mxfp8")
  q, s = sm.quantize(x, cfg)
  theirs = q.astype(jnp.float32) * jnp.repeat(s.astype(jnp.float32), 32, axis=-1)
  spec = recipes.get("mxfp8").forward.lhs.spec(-1, -2)
  chex.assert_trees_all_equal(numerics.quantizer.quantize_dequantize(x, spec), theirs)


def test_against_scaled_dot_general_on_gpu():
  if jax.default_backend() != "gpu":
    pytest.skip("jax.nn.scaled_dot_general's cuDNN GEMM needs a GPU; on the CPU only "
                "the quantizer is compared (test above)")
  x, w, _ = _data(m=64, k=64, n=64)
  want = jax.nn.scaled_dot_general(x, w, DN, preferred_element_type=jnp.float32)
  ours = qdot.quantized_dot_general(x, w, DN, "mxfp8", preferred_element_type=jnp.float32)
  np.testing.assert_allclose(np.asarray(ours), np.asarray(want), rtol=1e-2, atol=1e-2)


def _grad_of_grad(recipe, x, w):
  def loss(x, w):
    out = qdot.quantized_dot_general(x, w, DN, recipe, key=jax.random.key(3))
    return 0.5 * jnp.sum(out * out)
  return jax.grad(lambda x, w: jnp.sum(jax.grad(loss)(x, w)), argnums=(0, 1))(x, w)


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp4", "fp8", "bf16"])
def test_grad_of_grad_where_the_recipe_allows_it(recipe):
  """Straight-through operands differentiate twice: the backward GEMMs are functions of
  their straight-through fake quantizers."""
  x = jax.random.normal(jax.random.key(0), (64, 64))
  w = jax.random.normal(jax.random.key(1), (64, 32))
  gx, gw = jax.jit(functools.partial(_grad_of_grad, recipe))(x, w)
  assert gx.shape == x.shape and gw.shape == w.shape
  assert bool(jnp.all(jnp.isfinite(gx))) and bool(jnp.any(gx != 0))
  if recipe == "bf16":  # no quantizer: the plain dot_general's second derivative
    def plain(x, w):
      out = lax.dot_general(x.astype(BF), w.astype(BF), DN,
                            preferred_element_type=jnp.float32)
      return 0.5 * jnp.sum(out * out)
    want = jax.jit(jax.grad(lambda x, w: jnp.sum(jax.grad(plain)(x, w)),
                            argnums=(0, 1)))(x, w)
    chex.assert_trees_all_equal((gx, gw), want)


@pytest.mark.parametrize("api", ["quantized_dot_general",
                                 "quantized_dot_general_with_state"])
def test_nvfp4_grad_of_grad_names_the_public_function(api):
  """Issue 35: jax.grad(jax.grad(...)) through the nvfp4 recipe raised a TypeError
  naming quantize_dequantize_nvfp4_blocks, an internal function. Its NVFP4 operands
  enter the GEMMs apart from their tensor scales, so there is no second derivative:
  the error now names the function called and the recipe."""
  x = jax.random.normal(jax.random.key(0), (32, 32))
  w = jax.random.normal(jax.random.key(1), (32, 32))
  key = jax.random.key(2)
  if api == "quantized_dot_general":
    f = lambda x: qdot.quantized_dot_general(x, w, DN, "nvfp4", key=key)
  else:
    state = qdot.init_state("nvfp4")
    f = lambda x: qdot.quantized_dot_general_with_state(x, w, DN, "nvfp4", state,
                                                        key=key)[0]
  jax.grad(lambda x: jnp.sum(f(x) ** 2))(x)  # the first derivative works
  with pytest.raises(TypeError, match=rf"{api} with recipe 'nvfp4' has no second "
                                      rf"derivative") as e:
    jax.grad(lambda x: jnp.sum(jax.grad(lambda x: jnp.sum(f(x) ** 2))(x)))(x)
  assert "quantize_dequantize_nvfp4_blocks" not in str(e.value)


def test_deterministic_hadamard_backward_matches_the_numpy_reference():
  """MXFP4 on the backward GEMMs only, behind the fixed Sylvester transform (arXiv
  2605.09825): every backward operand is H_16 / 4 (blockwise along the contraction)
  then OCP-floor MXFP4 of the NumPy reference, bit for bit; no key is drawn (any key,
  or none, gives the same bits). Integer inputs make H x / 4 exact in float32 whatever
  the summation order."""
  q = recipes.MXQuant(fmt="e2m1", scale_rule="floor")
  gemm = recipes.GemmRecipe(lhs=q, rhs=q, hadamard=16, hadamard_random=False)
  recipe = recipes.Recipe(name="bwd_dh", dgrad=gemm, wgrad=gemm)
  assert not recipe.needs_key
  rng = np.random.default_rng(0)
  x, w, g = (rng.integers(-8, 9, size=s).astype(np.float32)
             for s in ((64, 64), (64, 96), (64, 96)))
  out, dx, dw = _run(recipe, jnp.asarray(x), jnp.asarray(w), jnp.asarray(g), None)
  chex.assert_trees_all_equal(out, _mm(jnp.asarray(x), jnp.asarray(w)))  # forward bf16
  fp4 = lambda a, axis: ref.quantize_mx(a, "e2m1", "floor", axis=axis)[2]
  # dgrad contracts over N: dO's rows and W's rows (W^T's columns), transformed along N.
  gq = fp4(hadamard_reference.sylvester_blocks(g, 1, 16), 1)
  wq = fp4(hadamard_reference.sylvester_blocks(w, 1, 16), 1)
  np.testing.assert_array_equal(np.asarray(dx), np.asarray(_mm(gq, wq.T)))
  # wgrad contracts over tokens (axis 0 of X and dO).
  xq = fp4(hadamard_reference.sylvester_blocks(x, 0, 16), 0)
  gq2 = fp4(hadamard_reference.sylvester_blocks(g, 0, 16), 0)
  np.testing.assert_array_equal(np.asarray(dw), np.asarray(_mm(xq.T, gq2)))
  # The quantization happened.
  assert not np.array_equal(xq, hadamard_reference.sylvester_blocks(x, 0, 16))
  again = _run(recipe, jnp.asarray(x), jnp.asarray(w), jnp.asarray(g), jax.random.key(5))
  chex.assert_trees_all_equal(again, (out, dx, dw))


def test_hadamard_random_must_be_a_bool():
  with pytest.raises(TypeError, match="hadamard_random must be a bool, got 'no'"):
    recipes.GemmRecipe(hadamard=16, hadamard_random="no")


@pytest.mark.parametrize("gemm,axes", [("forward", ((-1, -2), (-2, -1))),
                                       ("wgrad", ((-2, -1), (-2, -1)))])
def test_nvfp4_operands_share_a_scale_chain_with_the_same_bits(gemm, axes):
  """A GEMM whose two operands are NVFP4 (te) splits on the jnp path quantizes them
  together (one scale chain, numerics.kernels.quantize_dequantize_split_many): the
  same operands as quantize_operand's one at a time, telemetry included."""
  recipe = numerics.recipes.get("nvfp4")
  g = getattr(recipe, gemm)
  k = jax.random.split(jax.random.key(2), 3)
  a = jax.random.normal(k[0], (1, 64, 48))
  b = jax.random.normal(k[1], (1, 48, 32)) if gemm == "forward" else \
      jax.random.normal(k[1], (1, 64, 32)) * 1e-3
  keys = (jax.random.fold_in(k[2], 0), k[2], jax.random.fold_in(k[2], 1))
  # pylint: disable=protected-access
  assert gemm_operands._splits_together(a, g.lhs, axes[0], False)
  together = gemm_operands.gemm_operands(a, b, g, axes[0], axes[1], keys, None, True,
                                         gemm, None, natives=(False, False))
  if g.hadamard is not None:  # wgrad's RHT first, as gemm_operands applies it
    a, b = gemm_operands._hadamard_pair(a, b, axes[0][0], axes[1][0], g.hadamard,
                                        keys[0], g.hadamard_random)
  alone = (gemm_operands.quantize_operand(a, g.lhs, *axes[0], keys[1], telemetry=True),
           gemm_operands.quantize_operand(b, g.rhs, *axes[1], keys[2], telemetry=True))
  chex.assert_trees_all_equal(together, alone)
