"""The quantizers inside ``jax.shard_map`` on 4 CPU devices (issue 35, library boundary).

The device count is fixed when JAX starts, so the cases run in a child pytest process
started with ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (as
``tests/experiments/common/test_distributed.py`` starts its 2-device runs);
``test_cases_on_4_cpu_devices`` is that child's launcher and is the test CI sees. In a
process with fewer than 4 devices the cases skip; with 4 or more they run directly.

Contracts held here (unsharded = the same call on the whole array outside shard_map):

* stochastic rounding (``hash`` words): rows sharded along the leading axis round
  exactly as unsharded, and shards of identical data round differently (before the fix
  every shard drew the same words); other layouts draw disjoint words. ``threefry``:
  shards differ.
* NVFP4 (and tensor scaling) with ``amax_axis_name``: codes, scales, tensor scale and
  values equal the unsharded ones; without it each shard takes its own tensor scale.
* quantized dots (mxfp8, mxfp4, nvfp4, fp8, fp8_delayed): the forward output and dx
  equal the unsharded ones bit for bit (fp8: its quantized operands; its float32 GEMM
  sums in another order), dw is the psum of the shards' partial GEMMs (float32
  reassociation: relative 1e-6), grad of grad where the recipe allows it, and the
  delayed-scaling state's next amax history is the whole operand's.
"""

import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
from jax.sharding import AxisType, PartitionSpec as P
import numpy as np
import pytest

from lowprec import numerics
from lowprec.numerics import blockscale, kernels, qdot, quantizer, random_bits, recipes
from lowprec.numerics.rounding import Stochastic

from experiments.common.harness.repo_paths import REPO_DIR

N_DEVICES = 4
needs_4 = pytest.mark.skipif(
    jax.device_count() < N_DEVICES,
    reason="runs in the 4-device child process (test_cases_on_4_cpu_devices)")


def test_cases_on_4_cpu_devices():
  if jax.device_count() >= N_DEVICES:
    pytest.skip("this process has the devices: the cases run directly")
  flags = os.environ.get("XLA_FLAGS", "")
  env = {**os.environ, "PYTHONPATH": REPO_DIR, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={N_DEVICES}"}
  proc = subprocess.run(
      [sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", "-q",
       "-x", os.path.abspath(__file__), "-k", "not test_cases_on_4_cpu_devices"],
      env=env, cwd=REPO_DIR, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-3000:]
  assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


def _mesh(shape=(N_DEVICES,), names=("d",)):
  # Auto axes: jax.make_mesh defaults to Explicit ones, under which shard_map refuses
  # inputs that are not already sharded (notes-env.md section 2).
  return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))


def _shard_rows(f, mesh=None, spec=P("d"), out_specs=None):
  mesh = mesh or _mesh()
  return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=spec,
                               out_specs=spec if out_specs is None else out_specs))


def _bits(a):
  return np.asarray(a, np.float32).view(np.uint32)


def _equal_bits(a, b):
  np.testing.assert_array_equal(_bits(a), _bits(b))


KEY = jax.random.key(7)


# ----------------------------------------------------------- stochastic rounding words


@needs_4
def test_stochastic_cast_draws_per_shard_words_equal_to_unsharded():
  """Issue 35: every shard indexed its words from 0, so with one key all shards rounded
  with the same words. Identical rows on the 4 shards now round differently, and the
  rows-sharded result is the unsharded one bit for bit."""
  block = np.asarray(jax.random.normal(jax.random.key(0), (8, 64)))
  x = jnp.asarray(np.tile(block, (N_DEVICES, 1)))
  cast = lambda v: numerics.cast(v, "e2m1", rounding=Stochastic(), key=KEY)
  sharded = np.asarray(_shard_rows(cast)(x)).reshape(N_DEVICES, 8, 64)
  for i in range(1, N_DEVICES):
    assert not np.array_equal(sharded[0], sharded[i]), f"shard {i} repeats shard 0"
  _equal_bits(sharded.reshape(x.shape), cast(x))


@needs_4
def test_words_of_every_layout_are_disjoint_and_leading_axis_is_global():
  """The hash words themselves: under rows sharded over a 2x2 mesh (both axes, mesh
  order) they are the global array's; under a 2D layout they are a permutation of
  them (the same stream, no word twice); a replicated array draws the same words on
  every shard."""
  mesh = _mesh((2, 2), ("a", "b"))
  x = jnp.zeros((16, 32), jnp.float32)
  want = np.asarray(random_bits.random_words(KEY, x.shape))
  words = lambda v: random_bits.random_words(KEY, v.shape, shard_of=v)
  rows = _shard_rows(words, mesh, P(("a", "b")))(x)
  np.testing.assert_array_equal(np.asarray(rows), want)
  tiles = np.asarray(_shard_rows(words, mesh, P("a", "b"))(x))
  assert not np.array_equal(tiles, want)
  np.testing.assert_array_equal(np.sort(tiles.ravel()), np.sort(want.ravel()))
  replicated = jax.jit(jax.shard_map(
      lambda v: words(v)[None], mesh=mesh, in_specs=P(),
      out_specs=P(("a", "b"))))(x)
  for w in np.asarray(replicated):
    np.testing.assert_array_equal(w, want)


@needs_4
def test_threefry_words_differ_per_shard():
  x = jnp.zeros((N_DEVICES * 4, 64), jnp.float32)
  words = lambda v: random_bits.random_words(KEY, v.shape, method="threefry", shard_of=v)
  w = np.asarray(_shard_rows(words)(x)).reshape(N_DEVICES, -1)
  assert len({row.tobytes() for row in w}) == N_DEVICES
  # Outside shard_map nothing changes: jax.random.bits of the key.
  np.testing.assert_array_equal(
      np.asarray(random_bits.random_words(KEY, (4, 64), method="threefry", shard_of=x)),
      np.asarray(jax.random.bits(KEY, (4, 64), jnp.uint32)))


@needs_4
@pytest.mark.parametrize("name", ["quantize_mx", "quantize_dequantize_mx", "fake_quant",
                                  "quantize_nvfp4", "fake_quant nvfp4"])
def test_stochastic_block_quantizers_sharded_equal_unsharded(name):
  """Rows sharded: every stochastic quantizer rounds as on the whole array; NVFP4
  with its tensor amax over the mesh axis."""
  x = jax.random.normal(jax.random.key(1), (N_DEVICES * 16, 64)) * 3
  sr = dict(rounding=Stochastic(), key=KEY)
  f = {
      "quantize_mx": lambda v: numerics.quantize_mx(v, "e2m1", **sr).codes,
      "quantize_dequantize_mx": lambda v: blockscale.quantize_dequantize_mx(v, "e2m1",
                                                                             **sr),
      "fake_quant": lambda v: numerics.fake_quant(v, "e4m3", **sr),
      "quantize_nvfp4": lambda v: numerics.quantize_nvfp4(v, amax_axis_name="d",
                                                          **sr).codes,
      "fake_quant nvfp4": lambda v: numerics.fake_quant(v, "nvfp4", amax_axis_name="d",
                                                        **sr),
  }[name]
  # Outside shard_map there is no mesh axis: the same call without amax_axis_name.
  whole = {"quantize_nvfp4": lambda v: numerics.quantize_nvfp4(v, **sr).codes,
           "fake_quant nvfp4": lambda v: numerics.fake_quant(v, "nvfp4", **sr),
           }.get(name, f)
  chex.assert_trees_all_equal(_shard_rows(f)(x), whole(x))


@needs_4
def test_kernel_seeds_carry_the_shard_offset():
  """The Pallas kernels hash each element's index in their (local) array with the
  seeds they are given; blockwise.seeds_of gives them the shard's offset, so a kernel
  inside shard_map draws random_words(..., shard_of=x), the global words here. (Pallas
  interpret mode cannot run inside shard_map with check_vma=True: JAX's interpreter
  raises "Primitive dynamic_slice requires varying manual axes to match"; compiled
  kernels lower there, test_kernels_lower_inside_shard_map.)"""
  from lowprec.numerics.kernels import blockwise
  x = jnp.zeros((N_DEVICES * 8, 64), jnp.float32)

  def words(v):
    s0, s1 = blockwise.seeds_of(KEY, v)
    kernel_words = random_bits.hash_words(random_bits.row_major_index(v.shape), s0, s1)
    return kernel_words, random_bits.random_words(KEY, v.shape, shard_of=v)

  kernel_words, jnp_words = _shard_rows(words)(x)
  want = random_bits.random_words(KEY, x.shape)
  np.testing.assert_array_equal(np.asarray(kernel_words), np.asarray(want))
  np.testing.assert_array_equal(np.asarray(jnp_words), np.asarray(want))


@needs_4
@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_kernels_lower_inside_shard_map(platform):
  """On main a pallas_call could not be traced inside shard_map ("manual_axis_type on
  jax.ShapeDtypeStruct must not be None"), so on GPU/TPU, where quantized dots run the
  fused kernels, even their forward failed there. The kernels' outputs now take their
  inputs' varying axes: every kernel, and the grad of the quantized dots through them
  (kernels.implementation("pallas")), lowers for cuda and tpu inside shard_map (no
  device)."""
  with kernels.implementation("pallas"):
    sr = dict(rounding=Stochastic(), key=KEY, use_kernel=True)
    x = jax.ShapeDtypeStruct((N_DEVICES * 64, 256), jnp.float32)
    calls = [lambda v: kernels.mx_quantize(v, **sr).codes,
             lambda v: kernels.mx_quantize_dequantize(v, "e2m1", axis=-2, **sr),
             lambda v: kernels.nvfp4_quantize(v, amax_axis_name="d", **sr).codes,
             lambda v: kernels.nvfp4_quantize_dequantize(v, amax_axis_name="d", **sr),
             lambda v: kernels.nvfp4_quantize_dequantize_blocks(v, **sr)[0]]
    for f in calls:
      _shard_rows(f).trace(x).lower(lowering_platforms=(platform,))
    w = jax.ShapeDtypeStruct((256, 32), jnp.float32)
    for name in ("mxfp8", "mxfp4", recipes.with_amax_axis_name("nvfp4", "d")):
      lowered = jax.jit(jax.grad(lambda x, w: _data_parallel(name)(x, w)[0], argnums=(0, 1))
                        ).trace(x, w).lower(lowering_platforms=(platform,)).as_text()
      assert ("tpu_custom_call" if platform == "tpu" else "triton") in lowered


# ---------------------------------------------------------------- tensor amax reduction


def _rows_with_unequal_amax():
  x = jax.random.normal(jax.random.key(2), (N_DEVICES * 16, 64))
  return x * jnp.repeat(jnp.array([1.0, 40.0, 0.01, 3.0]), 16)[:, None]


@needs_4
@pytest.mark.parametrize("convention", ["te", "torchao"])
def test_nvfp4_tensor_amax_over_a_mesh_axis(convention):
  """Issue 35: NVFP4 took a tensor scale per shard with no way to ask for the global
  one. amax_axis_name='d' reduces the amax over the mesh axis (lax.pmax): codes,
  scales, tensor scale and dequantized values equal the unsharded tensor's."""
  x = _rows_with_unequal_amax()
  q = numerics.quantize_nvfp4(x, convention=convention)

  def shard(v, axis_name):
    s = numerics.quantize_nvfp4(v, convention=convention, amax_axis_name=axis_name)
    return s.codes, s.scales, s.tensor_scale[None], numerics.dequantize(s)

  codes, scales, ts, values = _shard_rows(lambda v: shard(v, "d"))(x)
  chex.assert_trees_all_equal((codes, scales), (q.codes, q.scales))
  np.testing.assert_array_equal(_bits(ts), np.full(N_DEVICES, _bits(q.tensor_scale)))
  _equal_bits(values, numerics.dequantize(q))
  _equal_bits(_shard_rows(lambda v: blockscale.quantize_dequantize_nvfp4(
      v, convention=convention, amax_axis_name="d"))(x),
              blockscale.quantize_dequantize_nvfp4(x, convention=convention))
  per_shard = _shard_rows(lambda v: shard(v, None))(x)[2]
  assert len(set(np.asarray(per_shard).tolist())) == N_DEVICES  # the old behaviour


@needs_4
def test_nvfp4_blocks_and_tensor_scaling_amax_over_a_mesh_axis():
  x = _rows_with_unequal_amax()
  values, inv = blockscale.quantize_dequantize_nvfp4_blocks(x)
  got_v, got_inv = _shard_rows(
      lambda v: tuple(a if a.ndim else a[None] for a in
                      kernels.nvfp4_quantize_dequantize_blocks(v, amax_axis_name="d")))(x)
  _equal_bits(got_v, values)
  np.testing.assert_array_equal(_bits(got_inv), np.full(N_DEVICES, _bits(inv)))
  spec = quantizer.QuantSpec("e4m3", scaling="tensor", amax_axis_name="d")
  whole = quantizer.QuantSpec("e4m3", scaling="tensor")
  _equal_bits(_shard_rows(lambda v: quantizer.quantize_dequantize(v, spec))(x),
              quantizer.quantize_dequantize(x, whole))


@needs_4
def test_amax_axis_name_outside_shard_map_is_a_clear_error():
  with pytest.raises(ValueError, match="amax_axis_name='d'.*shard_map"):
    numerics.quantize_nvfp4(jnp.ones((4, 16)), amax_axis_name="d")
  with pytest.raises(ValueError, match="only nvfp4 and scaling='tensor'"):
    quantizer.QuantSpec("e4m3", amax_axis_name="d")
  with pytest.raises(ValueError, match="mesh axis name"):
    numerics.quantize_nvfp4(jnp.ones((4, 16)), amax_axis_name=3)


# ------------------------------------------------------------------- quantized dots

DN = (((1,), (0,)), ((), ()))
M, K, N = N_DEVICES * 32, 64, 32  # 32 tokens a shard: wgrad's 1x32 blocks and RHTs fit


def _operands():
  x = jax.random.normal(jax.random.key(3), (M, K)) * jnp.exp(
      jax.random.normal(jax.random.key(4), (M, 1)))
  return x, jax.random.normal(jax.random.key(5), (K, N))


def _loss(x, w, recipe):
  out = qdot.quantized_dot_general(x, w, DN, recipe, key=KEY)
  return 0.5 * jnp.sum(out * out), out


def _data_parallel(recipe):
  """The loss summed over shards (rows of x sharded, w replicated) and the output."""
  def f(x, w):
    loss, out = _loss(x, w, recipe)
    return jax.lax.psum(loss, "d"), out
  return jax.shard_map(f, mesh=_mesh(), in_specs=(P("d"), P()), out_specs=(P(), P("d")))


@needs_4
@pytest.mark.parametrize("name", ["mxfp8", "mxfp4", "nvfp4", "fp8"])
def test_quantized_dot_differentiates_inside_shard_map(name):
  """Issue 35: jax.grad of a quantized dot inside shard_map crashed ("Custom VJP bwd
  rule must produce an output with the same type as the args ... manual axis types do
  not match"): dW of the replicated weight varied over the mesh axis. It is now the
  sum over shards, as JAX's own transpose of the implicit broadcast."""
  x, w = _operands()
  sharded_recipe = (recipes.with_amax_axis_name(name, "d") if name in ("nvfp4", "fp8")
                    else name)
  vg = lambda f: jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))
  (_, out), (dx, dw) = vg(lambda x, w: _loss(x, w, name))(x, w)
  (_, out_s), (dx_s, dw_s) = vg(_data_parallel(sharded_recipe))(x, w)
  if name == "fp8":
    # Its quantized operands are bit-equal (the tensor amax reduced over "d"), but its
    # float32 GEMM of inexact operands sums in another order on 32 rows than on 128,
    # and those last-bit differences in the output move a few E5M2 roundings of dO:
    # the output to float32 roundings, the gradients to a few E5M2 steps.
    spec = quantizer.QuantSpec("e4m3", scaling="tensor")
    spec_d = quantizer.QuantSpec("e4m3", scaling="tensor", amax_axis_name="d")
    _equal_bits(_shard_rows(lambda v: quantizer.quantize_dequantize(v, spec_d))(x),
                quantizer.quantize_dequantize(x, spec))
    np.testing.assert_allclose(out_s, out, rtol=0,
                               atol=1e-6 * float(jnp.max(jnp.abs(out))))
    for got, want in ((dx_s, dx), (dw_s, dw)):
      np.testing.assert_allclose(got, want, rtol=0,
                                 atol=5e-2 * float(jnp.max(jnp.abs(want))))
    return
  _equal_bits(out_s, out)
  _equal_bits(dx_s, dx)
  chex.assert_trees_all_close(dw_s, dw, rtol=1e-6,
                              atol=1e-6 * float(jnp.max(jnp.abs(dw))))


@needs_4
@pytest.mark.parametrize("name", ["mxfp8", "mxfp4", "bf16"])
def test_grad_of_grad_inside_shard_map(name):
  """The second derivative w.r.t. x is the unsharded one bit for bit. W.r.t. the
  replicated w it sums the shards' bf16-rounded partial products, so it differs from
  the unsharded one by bf16 roundings (the plain bf16 dot_general, JAX's own autodiff,
  differs alike): compared to 2% of its largest value (a missing or doubled sum over
  the 4 shards would be off by a factor of 4)."""
  x, w = _operands()
  gg = lambda f: jax.jit(jax.grad(lambda x, w: jnp.sum(jax.grad(
      lambda x, w: f(x, w)[0])(x, w)), argnums=(0, 1)))
  want = gg(lambda x, w: _loss(x, w, name))(x, w)
  got = gg(_data_parallel(name))(x, w)
  _equal_bits(got[0], want[0])
  scale = float(jnp.max(jnp.abs(want[1])))
  np.testing.assert_allclose(got[1], want[1], rtol=0, atol=2e-2 * scale)
  assert scale > 0


@needs_4
def test_nvfp4_grad_of_grad_inside_shard_map_names_the_public_function():
  x, w = _operands()
  f = _data_parallel(recipes.with_amax_axis_name("nvfp4", "d"))
  with pytest.raises(TypeError, match="quantized_dot_general with recipe "
                                      "'nvfp4\\+amax@d' has no second derivative"):
    jax.grad(lambda x: jnp.sum(jax.grad(lambda x: f(x, w)[0])(x)))(x)


@needs_4
def test_delayed_scaling_state_inside_shard_map_is_the_whole_operands():
  """fp8_delayed with a replicated state: the shards' amaxes are maximized over the
  mesh axis, so the next state (the gradient of the state) is the unsharded one."""
  x, w = _operands()
  state = qdot.init_state("fp8_delayed")

  def loss(x, w, state):
    out, _ = qdot.quantized_dot_general_with_state(x, w, DN, "fp8_delayed", state)
    return 0.5 * jnp.sum(out * out)

  sharded = jax.shard_map(lambda x, w, s: jax.lax.psum(loss(x, w, s), "d"), mesh=_mesh(),
                          in_specs=(P("d"), P(), P()), out_specs=P())
  want = jax.jit(jax.grad(loss, argnums=2))(x, w, state)
  got = jax.jit(jax.grad(sharded, argnums=2))(x, w, state)
  chex.assert_trees_all_equal(got, want)
  telemetry = qdot.init_state("fp8_delayed", telemetry=True)
  with pytest.raises(ValueError, match="quantized_dot_general_with_state: the backward "
                                       "telemetry .* per shard"):
    jax.jit(jax.grad(sharded, argnums=2))(x, w, telemetry)


# ------------------------------------------- kernels under jit on a mesh (issue 53 #6)


def _mesh_2x2():
  return jax.make_mesh((2, 2), ("a", "b"), axis_types=(AxisType.Auto,) * 2)


def _kernel_calls(key, **mode):
  sr = dict(rounding=Stochastic(), key=key, **mode)
  return {
      "mx_quantize": lambda v: kernels.mx_quantize(v, "e2m1", **sr),
      "mx_qdq -2": lambda v: kernels.mx_quantize_dequantize(v, "e4m3", axis=-2, **sr),
      "nvfp4_quantize": lambda v: kernels.nvfp4_quantize(v, **sr),
      "nvfp4_blocks -2": lambda v: kernels.nvfp4_quantize_dequantize_blocks(v, axis=-2,
                                                                           **sr),
  }


@needs_4
def test_kernels_under_jit_on_a_mesh_equal_unsharded():
  """Issue 53 item 6: under jit with sharded operands every kernel runs per shard
  (numerics.kernels.partitioning), and its bits -- stochastic rounding's words
  included -- are those of the whole array on one device. The shapes make the kernel
  split rows over one mesh axis and columns over the other (6 rows do not split 4
  ways; 64 rows are 2 blocks of 32 down the rows), the operand arrives split another
  way (resharded), with the GPU kernels' tiling and the TPU kernel's transposed tiles;
  the matmul gathers a split contraction."""
  mesh = _mesh_2x2()
  rows = jax.random.normal(jax.random.key(1), (2, 3, 128)) * 3   # blocks along rows
  cols = jax.random.normal(jax.random.key(2), (64, 96)) * 3      # blocks down columns
  calls = _kernel_calls(KEY, interpret=True)
  cases = [("mx_quantize", calls["mx_quantize"], rows, "u8[1,3,64]"),
           ("mx_quantize tpu", lambda v: kernels.mx_quantize(
               v, "e4m3", interpret=True, interpret_as="tpu"), rows, "u8[1,3,64]"),
           ("mx_qdq -2", calls["mx_qdq -2"], cols, "f32[32,48]"),
           ("nvfp4_blocks -2", calls["nvfp4_blocks -2"], cols, "f32[16,96]")]
  for name, f, x, shard in cases:
    xs = jax.device_put(x, jax.NamedSharding(mesh, P("b")))
    compiled = jax.jit(f).lower(xs).compile()
    assert shard in compiled.as_text(), name  # the kernel ran on this shard's shape
    chex.assert_trees_all_equal(compiled(xs), jax.jit(f)(x), custom_message=name)
  qa = kernels.mx_quantize(cols[:, :64], "e4m3")
  qt = kernels.mx_quantize(cols[:, 32:], "e2m1")  # (N, K), then transposed
  qb = blockscale.QuantizedArray(
      codes=qt.codes.T, scales=qt.scales.T, tensor_scale=qt.tensor_scale, fmt="e2m1",
      scale_fmt="e8m0", axes=(0,), block_shape=(32,), shape=(64, 64), scale_rule="floor")
  mm = jax.jit(lambda a, b: kernels.mx_matmul(a, b, interpret=True))
  put = lambda q, s: jax.tree.map(
      lambda v: jax.device_put(v, jax.NamedSharding(mesh, s if v.ndim else P())), q)
  chex.assert_trees_all_equal(mm(put(qa, P("a", "b")), put(qb, P("b", "a"))), mm(qa, qb))


@needs_4
def test_quantized_dot_with_kernels_under_jit_on_a_mesh_equals_unsharded():
  """The training path on the kernels (interpret mode), batch split over a 2 x 2 mesh:
  the mxfp8 dot's output and dx equal the unsharded ones bit for bit; dw (a float32
  GEMM over the batch, which XLA splits across the shards and sums) and the loss differ
  by float32 reassociation only."""
  x, w = _operands()
  f = jax.jit(jax.value_and_grad(lambda x, w: _loss(x, w, "mxfp8"), argnums=(0, 1),
                                 has_aux=True))
  with kernels.implementation("interpret"):
    (loss, out), (dx, dw) = f(x, w)
    (loss_s, out_s), (dx_s, dw_s) = f(
        jax.device_put(x, jax.NamedSharding(_mesh_2x2(), P(("a", "b")))), w)
  _equal_bits(out_s, out)
  _equal_bits(dx_s, dx)
  np.testing.assert_allclose(dw_s, dw, rtol=0, atol=1e-6 * float(jnp.max(jnp.abs(dw))))
  np.testing.assert_allclose(loss_s, loss, rtol=1e-6)


@needs_4
@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_kernels_lower_under_jit_on_a_mesh(platform):
  """Issue 53 item 6, reproduced without a device: before the fix a Mosaic kernel in a
  jitted program on several devices failed to lower ("Mosaic kernels cannot be
  automatically partitioned. Please wrap the call in a shard_map"), so a quantized
  data-parallel step could not compile on a multi-chip TPU slice. Every kernel, and the
  grad of a quantized dot with the batch sharded, now lowers for tpu and cuda."""
  mesh = _mesh_2x2()
  x = jax.ShapeDtypeStruct((64, 256), jnp.float32,
                           sharding=jax.NamedSharding(mesh, P(("a", "b"))))
  w = jax.ShapeDtypeStruct((256, 64), jnp.float32, sharding=jax.NamedSharding(mesh, P()))
  with kernels.implementation("pallas"):
    for f in _kernel_calls(KEY, use_kernel=True).values():
      jax.jit(f).trace(x).lower(lowering_platforms=(platform,))
    for name in ("mxfp8", "nvfp4"):
      loss = lambda x, w: _loss(x, w, name)[0]
      text = jax.jit(jax.grad(loss, argnums=(0, 1))).trace(x, w).lower(
          lowering_platforms=(platform,)).as_text()
      assert ("tpu_custom_call" if platform == "tpu" else "triton") in text


@needs_4
def test_kernel_lowers_for_tpu_where_the_mesh_comes_from_the_context_or_a_constraint():
  """The trace sees the mesh also through ``jax.set_mesh`` with ``in_shardings`` and
  through a sharding constraint on the operand (docs/kernels.md: where it sees none,
  the Mosaic call cannot be partitioned)."""
  mesh = _mesh_2x2()
  f = lambda v: kernels.mx_quantize_dequantize(v, "e4m3", use_kernel=True)
  x = jax.ShapeDtypeStruct((64, 256), jnp.float32)
  constrained = lambda v: f(jax.lax.with_sharding_constraint(
      v, jax.NamedSharding(mesh, P("a"))) * 2)
  with kernels.implementation("pallas"):
    with jax.set_mesh(mesh):
      jax.jit(f, in_shardings=P("a")).trace(x).lower(lowering_platforms=("tpu",))
    jax.jit(constrained).trace(x).lower(lowering_platforms=("tpu",))


@needs_4
def test_kernels_under_explicit_mesh_axes_follow_the_operand():
  """Under explicit mesh axes the kernel runs in the operand's own layout; a split
  that would cut a block (16 rows a shard, blocks of 32 down the rows) is gathered
  first. The bits are the unsharded ones."""
  mesh = jax.make_mesh((N_DEVICES,), ("d",), axis_types=(AxisType.Explicit,))
  x = jax.random.normal(jax.random.key(1), (64, 128))
  f = lambda v: kernels.mx_quantize_dequantize(v, "e2m1", axis=0, rounding=Stochastic(),
                                               key=KEY, interpret=True)
  want = jax.jit(f)(x)
  with jax.set_mesh(mesh):
    for spec in (P("d"), P(None, "d")):
      got = jax.jit(f)(jax.device_put(x, spec))
      chex.assert_trees_all_equal(np.asarray(got), np.asarray(want))
