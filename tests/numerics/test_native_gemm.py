"""Native GEMMs (issue 53 item 1): recipes.with_native_gemm and numerics.native_gemm.

Three properties. (1) Which GEMMs a recipe can run natively, and the refusals. (2) On
the CPU, a native recipe's output, gradients and next state are the emulated recipe's,
bit for bit (the program holds the emulated GEMM there). (3) The native branch itself
(what a ``cuda`` program runs), executed here by forcing the switch and evaluating
``jax.nn.scaled_matmul`` by its documented definition (``a * repeat(a_scales)`` times
``b * repeat(b_scales)``, float32 accumulation): its storage-form operands decoded by
ml_dtypes reproduce the quantized values, and its GEMMs equal a float64 product of
those values, bit for bit on data whose partial sums are exact.
"""

import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from lowprec.numerics import native_gemm
from lowprec.numerics import qdot
from lowprec.numerics import recipes
from lowprec.numerics.rounding import Stochastic

DN = (((2,), (0,)), ((), ()))  # x (B, M, K) . w (K, N)
NATIVE = ("fp8", "fp8_delayed", "mxfp8", "nvfp4")


def _custom(name: str) -> recipes.Recipe:
  """Layouts the built-ins lack: MXFP8 with 32 x 32 weight tiles reused in dgrad and
  stochastically rounded gradients; NVFP4 in qwix's convention (no tensor scale)."""
  if name == "mxfp8_tiles":
    x = recipes.MXQuant(fmt="e4m3", scale_rule="rceil")
    w = recipes.MXQuant(fmt="e4m3", scale_rule="rceil", block_shape=(32, 32))
    g = recipes.MXQuant(fmt="e5m2", scale_rule="rceil",
                        rounding=Stochastic())
    return recipes.Recipe(name=name, forward=recipes.GemmRecipe(lhs=x, rhs=w),
                          dgrad=recipes.GemmRecipe(lhs=g), reuse_forward_weight=True,
                          wgrad=recipes.GemmRecipe(lhs=x, rhs=g))
  q = recipes.NVFP4Quant(convention="qwix")
  gemm = recipes.GemmRecipe(lhs=q, rhs=q)
  return recipes.Recipe(name=name, forward=gemm, dgrad=gemm, wgrad=gemm)


CUSTOM = ("mxfp8_tiles", "nvfp4_qwix")


@pytest.fixture(autouse=True)
def _quiet():
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", native_gemm.NativeGemmFallback)
    yield


def test_with_native_gemm_marks_every_gemm_of_the_native_recipes():
  for name in NATIVE:
    r = recipes.with_native_gemm(name)
    assert r.name == f"{name}+native"
    assert [g.native for g in r.gemms] == [True, True, True], name
    # Nothing else changes: the emulated recipe with native turned off again.
    off = {n: g.__class__(**{**g.__dict__, "native": False})
           for n, g in zip(recipes.GEMM_NAMES, r.gemms)}
    assert recipes.replace(r, name=name, **off) == recipes.get(name)


@pytest.mark.parametrize("name", ["fp32", "bf16", "mxfp4_1d2d", "mxfp4_rht", "mxfp4"])
def test_recipes_without_a_native_gemm_are_refused_by_name(name):
  with pytest.raises(ValueError, match=rf"recipe '{name}' has no GEMM with a native form"):
    recipes.with_native_gemm(name)


def test_only_gemms_with_a_common_native_form_become_native():
  mx8 = recipes.MXQuant(fmt="e4m3", scale_rule="rceil")
  r = recipes.Recipe(name="mixed", forward=recipes.GemmRecipe(lhs=mx8, rhs=mx8),
                     dgrad=recipes.GemmRecipe(lhs=mx8, rhs=None),
                     wgrad=recipes.GemmRecipe(lhs=mx8, rhs=recipes.NVFP4Quant()))
  assert [g.native for g in recipes.with_native_gemm(r).gemms] == [True, False, False]


def test_an_inconsistent_native_gemm_is_refused_at_construction():
  t = recipes.TensorQuant(fmt="e4m3")
  with pytest.raises(ValueError, match=r"forward GEMM is native but its operands "
                                       r"\(TensorQuant, MXQuant\)"):
    recipes.Recipe(name="x", forward=recipes.GemmRecipe(
        lhs=t, rhs=recipes.MXQuant(fmt="e4m3"), native=True))
  with pytest.raises(ValueError, match="emulated accumulation cannot be native"):
    recipes.with_accumulation(recipes.with_native_gemm("fp8"),
                              qdot.accumulation_lib.Accumulation(fraction_bits=13))
  with pytest.raises(TypeError, match="native must be a bool, got 1"):
    recipes.GemmRecipe(lhs=t, rhs=t, native=1)
  # e2m1 MX blocks and torchao's NVFP4 decode have no native form.
  assert native_gemm.kind(recipes.MXQuant(fmt="e2m1")) is None
  assert native_gemm.kind(recipes.NVFP4Quant(convention="torchao")) is None
  assert native_gemm.kind(recipes.MXQuant(fmt="e4m3", block_shape=(32, 32))) == "mxfp8"


def _data(shape, seed, integer=False):
  k = jax.random.key(seed)
  if integer:  # magnitudes 1..7: every quantized value and partial sum exact
    return jax.random.randint(k, shape, -7, 8).astype(jnp.float32)
  return jax.random.normal(k, shape, jnp.float32) * 3.0


def _step(recipe, x, w, g, key):
  """(output, dx, dw, next state) of one GEMM call with a cotangent g."""
  r = _custom(recipe) if recipe in CUSTOM else recipes.get(recipe)
  state = qdot.init_state(r)

  def loss(x, w, state):
    out, _ = qdot.quantized_dot_general_with_state(x, w, DN, r, state, key=key,
                                                   preferred_element_type=jnp.float32)
    return jnp.sum(out * g), out

  (grads, out) = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(x, w, state)
  return out, grads


@pytest.mark.parametrize("name", NATIVE + CUSTOM)
def test_on_the_cpu_a_native_recipe_gives_the_emulated_bits(name):
  """Issue 53 item 1: the CPU program holds the emulated GEMM, and the native path's
  quantizers (codes and scales, decoded exactly) give the emulated quantizers' values:
  output, dx, dw and the next delayed-scaling state equal bit for bit (K = 80 pads
  the 32-blocks; nvfp4's wgrad RHT and SR draw from the key)."""
  x, w, g = _data((2, 24, 80), 1), _data((80, 48), 2), _data((2, 24, 48), 3)
  key = jax.random.key(7)
  want = _step(name, x, w, g, key)
  native = recipes.with_native_gemm(_custom(name) if name in CUSTOM else name)
  assert all(g.native for g in native.gemms)
  got = _step(native, x, w, g, key)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _scaled_matmul_by_definition(a, b, a_scales, b_scales, preferred_element_type):
  """jax.nn.scaled_matmul's documented semantics, float32 accumulation."""
  def scaled(c, s):
    rep = c.shape[-1] // s.shape[-1]
    return c.astype(jnp.float32) * jnp.repeat(s.astype(jnp.float32), rep, axis=-1)
  return jnp.einsum("bmk,bnk->bmn", scaled(a, a_scales), scaled(b, b_scales),
                    preferred_element_type=preferred_element_type,
                    precision=jax.lax.Precision.HIGHEST)


@pytest.fixture
def native_branch(monkeypatch):
  """Runs the cuda branch on the CPU; records (at run time) what each native GEMM
  consumed: ``{gemm: {"operands": (a, b), "emulated": (...), "scaled_matmul": (...)}}``
  keyed by "forward", "dgrad", "wgrad"."""
  seen, current = {}, []

  def record(gemm, field, tree):
    def put(*leaves):
      seen.setdefault(gemm, {})[field] = jax.tree.unflatten(
          treedef, [np.asarray(v) for v in leaves])
    leaves, treedef = jax.tree.flatten(tree)
    jax.debug.callback(put, *leaves)

  def switch(native, native_args, emulated, emulated_args, what):
    del emulated
    gemm = what.split(", ")[-1].split(" ")[0]
    current[:] = [gemm]
    record(gemm, "operands", native_args)
    record(gemm, "emulated", emulated_args)
    return native(*native_args)

  def scaled_matmul(a, b, sa, sb, preferred_element_type):
    record(current[0], "scaled_matmul", (a, b, sa, sb))
    return _scaled_matmul_by_definition(a, b, sa, sb, preferred_element_type)

  monkeypatch.setattr(native_gemm, "switch", switch)
  monkeypatch.setattr(jax.nn, "scaled_matmul", scaled_matmul)
  return seen


_ML = {"float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2,
       "float4_e2m1fn": ml_dtypes.float4_e2m1fn, "float8_e8m0fnu": ml_dtypes.float8_e8m0fnu}


def _decode(a) -> np.ndarray:
  """float64 values of a storage-dtype array, decoded by ml_dtypes from its bytes."""
  a = np.asarray(a)
  bits = a.view(np.uint8)
  return bits.view(_ML[a.dtype.name]).astype(np.float64)


@pytest.mark.parametrize("name", ["mxfp8", "nvfp4"])
def test_the_native_block_scaled_gemm_consumes_the_quantized_operands(name, native_branch):
  """Forward GEMM: codes x repeated scales (decoded by ml_dtypes) x tensor scales are
  the emulated operands' values, in scaled_matmul's (B, M, K) x (B, N, K) layout."""
  x, w = _data((2, 24, 64), 4), _data((64, 32), 5)  # canonical X (1, 48, 64), W (1, 64, 32)
  r = recipes.with_native_gemm(name)
  jax.jit(lambda x, w: qdot.quantized_dot_general(
      x, w, DN, r, key=jax.random.key(0)))(x, w)
  fwd = native_branch["forward"]
  (a_nat, b_nat), (a_q, b_q, a_s, b_s) = fwd["operands"], fwd["emulated"]
  a, b, sa, sb = fwd["scaled_matmul"]
  block = 32 if name == "mxfp8" else 16
  assert a.dtype == b.dtype == (jnp.float8_e4m3fn if name == "mxfp8" else jnp.float4_e2m1fn)
  assert sa.dtype == (jnp.float8_e8m0fnu if name == "mxfp8" else jnp.float8_e4m3fn)
  assert a.shape == (1, 48, 64) and sa.shape == (1, 48, 64 // block)
  assert b.shape == (1, 32, 64) and sb.shape == (1, 32, 64 // block)
  dec = lambda c, s: _decode(c) * np.repeat(_decode(s), block, axis=-1)
  tensor = lambda s: 1.0 if s is None else float(s)
  np.testing.assert_array_equal(dec(a, sa) * tensor(a_nat.decode),
                                np.asarray(a_q, np.float64) * tensor(a_s))
  w_q = np.asarray(b_q, np.float64) * tensor(b_s)  # (1, K, N)
  np.testing.assert_array_equal(dec(b, sb) * tensor(b_nat.decode),
                                np.swapaxes(w_q, -1, -2))


def _values(op: native_gemm.Operand) -> np.ndarray:
  """float64 codes x block scales of a storage-form operand (ml_dtypes decoding)."""
  v = _decode(op.codes)
  if op.scales is None:
    return v
  s = _decode(op.scales)
  for axis, e in enumerate(op.extents):
    s = np.repeat(s, e, axis=axis)
  return v * s


# Contraction axes of (lhs, rhs) in each canonical GEMM: X (B, M, K) W (B, K, N)
# forward; dO (B, M, N) W (B, K, N) dgrad; X, dO wgrad (over the tokens M).
_EINSUM = ("bmk,bkn->bmn", "bmn,bkn->bmk", "bmk,bmn->bkn")


@pytest.mark.parametrize("name", ("fp8", "mxfp8", "nvfp4") + CUSTOM)
def test_the_native_gemms_equal_the_exact_product_of_their_storage_operands(
    name, native_branch):
  """Output, dx and dw of the native branch: the exact (float64) product of each GEMM's
  storage-form operands, decoded by ml_dtypes, rounded once to float32 and multiplied
  by the float32 product of the decode scales, bit for bit. The data are integers of
  magnitude <= 7 (amax 7): FP8 tensor scales are then powers of two, and every partial
  sum is exact in float32, so any order of accumulation gives these bits. A wrong
  layout, block or scale is off by O(1)."""
  x, w, g = _data((2, 24, 64), 6, True), _data((64, 48), 7, True), _data((2, 24, 48), 8, True)
  x, w, g = x.at[0, 0, 0].set(7.0), w.at[0, 0].set(-7.0), g.at[0, 0, 0].set(7.0)
  native = recipes.with_native_gemm(_custom(name) if name in CUSTOM else name)
  out, (dx, dw, _) = _step(native, x, w, g, jax.random.key(3))
  assert sorted(native_branch) == ["dgrad", "forward", "wgrad"]  # each ran natively
  canonical = ((1, 48, 48), (1, 48, 64), (1, 64, 48))  # (B, M, N), (B, M, K), (B, K, N)
  for got, shape, spec, gemm in zip((out, dx, dw), canonical, _EINSUM, recipes.GEMM_NAMES):
    got = np.asarray(got).reshape(shape)
    a, b = native_branch[gemm]["operands"]
    acc = np.einsum(spec, _values(a), _values(b))
    scale = np.float32(np.float32(a.decode) * np.float32(b.decode))
    want = (acc.astype(np.float32) * scale)[..., :got.shape[-2], :got.shape[-1]]
    np.testing.assert_array_equal(got, want, err_msg=gemm)


def test_tracing_for_a_backend_without_native_gemms_says_so():
  x, w = _data((1, 8, 32), 9), _data((32, 16), 10)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", native_gemm.NativeGemmFallback)
    qdot.quantized_dot_general(x, w, DN, recipes.with_native_gemm("mxfp8"))
  said = [str(c.message) for c in caught if c.category is native_gemm.NativeGemmFallback]
  assert said and said[0].startswith("recipe 'mxfp8+native', forward GEMM: no native "
                                     "GEMM on the default backend 'cpu'")


@pytest.mark.parametrize("name", ["fp8", "mxfp8"])
def test_a_second_derivative_through_native_gemms_is_refused_by_name(name):
  x, w = _data((1, 8, 32), 11), _data((32, 16), 12)
  r = recipes.with_native_gemm(name)
  f = lambda x: jnp.sum(jax.grad(lambda x: jnp.sum(qdot.quantized_dot_general(
      x, w, DN, r) ** 2))(x) ** 2)
  with pytest.raises(TypeError, match=rf"quantized_dot_general with recipe "
                                      rf"'{name}\+native' has no second derivative"):
    jax.grad(f)(x)


def test_has_native_gemm_says_whether_with_native_gemm_accepts_the_recipe():
  for name in recipes.names():
    assert recipes.has_native_gemm(name) == (name in NATIVE), name
