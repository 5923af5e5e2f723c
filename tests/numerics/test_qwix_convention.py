"""``convention="qwix"``: MXFP8, MXFP4 and NVFP4 bit for bit with qwix 0.1.8 itself.

qwix is a test dependency (the ``dev`` extra). The conformance edge blocks (zeros,
ties, saturation, power-of-two edges, float32 subnormals, tiny, huge, NaN/Inf) are
held to qwix in tests/numerics/test_conformance.py; here, random blocks of every
magnitude, the special blocks one by one (where qwix's arithmetic leaves the finite
numbers, what it gives and what we give), and the argument checks. About 7 s.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from lowprec import numerics
from lowprec.numerics import blockscale

from tests.numerics import qwix_oracle

CASES = [("mx", "e4m3"), ("mx", "e2m1"), ("nvfp4", "e2m1")]


def _ours(kind, fmt, x):
  xj = jnp.asarray(x)
  if kind == "mx":
    q = numerics.quantize_mx(xj, fmt, convention="qwix")
    deq = blockscale.quantize_dequantize_mx(xj, fmt, convention="qwix")
  else:
    q = numerics.quantize_nvfp4(xj, convention="qwix")
    deq = blockscale.quantize_dequantize_nvfp4(xj, convention="qwix")
  np.testing.assert_array_equal(_bits(numerics.dequantize(q)), _bits(deq))
  return np.asarray(q.codes), np.asarray(q.scales).reshape(-1), np.asarray(deq)


def _bits(a):
  return np.asarray(a, np.float32).view(np.uint32)


def _random_rows(block, seed=0):
  """N(0, 1) rows at scales 2^-70 .. 2^120 (qwix's tiny-block and zero-scale branches,
  saturation), with max * 2^k and 6 * 2^k amaxes and zero half-blocks."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((256, 64)).astype(np.float32)
  sc = np.ldexp(np.float32(1), rng.integers(-70, 120, (256, 1))).astype(np.float32)
  x = x * sc
  x[::4, 0] = np.float32(448) * sc[::4, 0]
  x[1::4, 0] = np.float32(6) * sc[1::4, 0]
  x[2::8, :block // 2] = 0
  return x


@pytest.mark.parametrize("kind,fmt", CASES)
def test_matches_qwix_on_random_blocks_of_every_magnitude(kind, fmt):
  x = _random_rows(16 if kind == "nvfp4" else 32)
  codes, scales, deq = qwix_oracle.quantize(x, qwix_oracle.QTYPES[kind, fmt])
  ours = _ours(kind, fmt, x)
  np.testing.assert_array_equal(ours[0], codes)
  np.testing.assert_array_equal(ours[1], scales)
  np.testing.assert_array_equal(_bits(ours[2]), _bits(deq))


def test_mx_special_blocks_against_qwix():
  """Zero and tiny blocks: qwix's scale 2^0 (code 127), signed zero elements. Inf
  blocks: qwix's scale is +Inf (no E8M0 code), its element codes 0 and NaN; we store
  the E8M0 NaN scale and zero codes; both dequantize the whole block to NaN. NaN
  blocks: whether qwix's amax (a jnp.max) propagates the NaN depends on the array's
  shape (XLA:CPU's vectorized max drops it in arrays of 64 x 64 and more); we poison
  the block as qwix does when it propagates."""
  for fmt in ("e4m3", "e2m1"):
    x = np.zeros((256, 64), np.float32)  # _random_rows' shape: one compilation
    x[0, 1] = -0.0
    x[1, :3] = [1e-30, -2e-25, 3e-20]  # amax / max < 2^-63
    x[2, :2] = [np.nan, 1.0]
    x[3, :2] = [np.inf, -1.0]
    x[4, :2] = [-np.inf, 0.0]
    codes, scales, deq = qwix_oracle.quantize(x, qwix_oracle.QTYPES["mx", fmt])
    ours = _ours("mx", fmt, x)
    np.testing.assert_array_equal(scales[[0, 2]], [127, 127])
    np.testing.assert_array_equal(ours[1][:10:2], [127, 127, 255, 255, 255])
    assert np.all(ours[1][10:] == 127) and np.all(scales[10:] == 127)  # zero blocks
    fin = np.ones(len(x), bool)
    fin[2:5] = False
    np.testing.assert_array_equal(ours[0][fin], codes[fin])
    sign = 0x80 if fmt == "e4m3" else 0x8
    assert ours[0][0, 1] == sign and ours[0][1, 1] == sign  # -0 and -2e-25 -> -0
    assert np.all(np.isnan(deq[3:5, :32])) and np.all(np.isnan(ours[2][2:5, :32]))
    assert not np.all(np.isnan(deq[2, :32]))  # qwix dropped the NaN from its amax
    np.testing.assert_array_equal(_bits(ours[2][fin]), _bits(deq[fin]))


def test_nvfp4_special_blocks_against_qwix():
  """qwix's nvfp4 has no tensor scale: a block with amax below 6 * 2^-10 gets E4M3
  scale 0, so x / 0 is Inf (saturates to +-6) or NaN for x == 0 (E2M1 code 8): the
  block dequantizes to signed zeros. An Inf block gets scale 448 (its Infs saturate).
  We reproduce each, codes included. A NaN block: qwix's amax drops the NaN or not with
  the array's shape (see the MX test), and its E2M1 cast stores a NaN element as code 8
  (-0); we poison the block (E4M3 NaN scale, codes 8), as qwix does when the NaN
  propagates."""
  x = np.zeros((256, 64), np.float32)  # _random_rows' shape: one NVFP4 compilation
  x[0, :4] = [1e-3, -2e-3, 0.0, 5e-4]  # scale rounds to 0
  x[1, :3] = [np.inf, 100.0, -1.0]
  x[2, :2] = [np.nan, 1.0]
  x[3, :2] = [1e5, -3.0]  # amax / 6 > 448: clipped to 448, saturates
  x[4, :2] = [2.0 ** -149, 6 * 2.0 ** -10]  # a float32 subnormal beside a zero scale
  codes, scales, deq = qwix_oracle.quantize(x, "nvfp4")
  ours = _ours("nvfp4", "e2m1", x)
  fin = np.ones(len(x), bool)
  fin[2] = False
  np.testing.assert_array_equal(scales[:20:4][fin[:5]], [0, 0x7E, 0x7E, 0])
  np.testing.assert_array_equal(codes[0, :4], [7, 15, 8, 7])
  np.testing.assert_array_equal(ours[0][fin], codes[fin])
  np.testing.assert_array_equal(ours[1].reshape(len(x), 4)[fin],
                                scales.reshape(len(x), 4)[fin])
  np.testing.assert_array_equal(_bits(ours[2][fin]), _bits(deq[fin]))
  assert ours[1][8] == 0x7F and np.all(ours[0][2, :16] == 8)
  assert np.all(np.isnan(ours[2][2, :16])) and np.isnan(ours[2]).sum() == 16


def test_qwix_convention_differs_from_ocp_where_documented():
  """Power-of-two edges where qwix's float32 log2 is inexact (XLA:CPU's log): amax =
  448 * 2^-13 gets a scale one binade above rceil's; amax just above 448 * 2^-20 gets rceil's binade minus
  one, so the amax saturates to 448."""
  x = np.zeros((2, 32), np.float32)
  x[0, 0] = np.float32(448 * 2.0 ** -13)
  x[1, 0] = np.nextafter(np.float32(448 * 2.0 ** -20), np.float32(1))
  q_rceil = numerics.quantize_mx(jnp.asarray(x), "e4m3", scale_rule="rceil")
  q_qwix = numerics.quantize_mx(jnp.asarray(x), "e4m3", convention="qwix")
  _, scales, _ = qwix_oracle.quantize(x, "mxfp8")
  np.testing.assert_array_equal(np.asarray(q_qwix.scales).reshape(-1), scales)
  diff = (np.asarray(q_qwix.scales).astype(int) - np.asarray(q_rceil.scales).astype(int))
  np.testing.assert_array_equal(diff.reshape(-1), [1, -1])


@pytest.mark.parametrize("call,match", [
    (lambda x: numerics.quantize_mx(x, "e5m2", convention="qwix"), "mxfp8 \\(e4m3\\)"),
    (lambda x: numerics.quantize_mx(x, "e4m3", convention="qwix", scale_rule="floor"),
     "leave scale_rule unset"),
    (lambda x: numerics.quantize_mx(x, "e4m3", convention="QWIX"), "MX convention"),
    (lambda x: blockscale.quantize_dequantize_mx(x, "e4m3", scale_rule="qwix"),
     "unknown scale_rule"),
    (lambda x: numerics.quantize_nvfp4(x, convention="ocp"), "NVFP4 convention"),
])
def test_bad_convention_arguments_raise_one_line(call, match):
  with pytest.raises(ValueError, match=match) as e:
    call(jnp.ones((2, 32), jnp.float32))
  assert "\n" not in str(e.value)


def test_nvfp4_elements_round_as_xla_cpu_divides():
  """XLA:CPU computes qwix's ``x / s`` (s broadcast over the block) as ``x * (1/s)``:
  with s = 0.9375 (amax 5.625), x = 1.171875 is the E2M1 tie 1.25 under IEEE division
  (to even: 1.0, code 2) but 1.2500001 after the reciprocal (1.5, code 3). An IEEE
  division gave code 2 here before the convention modelled the reciprocal."""
  x = np.zeros((256, 64), np.float32)  # _random_rows' shape: one NVFP4 compilation
  x[0, :2] = [5.625, 1.171875]
  codes, scales, deq = qwix_oracle.quantize(x, "nvfp4")
  ours = _ours("nvfp4", "e2m1", x)
  assert scales[0] == 0x37 and codes[0, 1] == 3  # E4M3 0.9375; E2M1 1.5
  assert np.float32(1.171875) / np.float32(0.9375) == np.float32(1.25)
  np.testing.assert_array_equal(ours[0], codes)
  np.testing.assert_array_equal(_bits(ours[2]), _bits(deq))


def test_nvfp4_grid_multipliers_flag_qwix_clamped_blocks():
  """Telemetry: a nonzero block whose qwix scale rounded to zero, or was lowered to 448,
  counts as clamped; elsewhere the multiplier is 1/s."""
  x = np.zeros((256, 64), np.float32)
  x[0, :2] = [1e-3, -2e-3]  # scale 0
  x[1, :2] = [1e5, -3.0]  # amax / 6 > 448
  x[2, :2] = [5.625, 1.0]  # scale 0.9375
  mult, clamped = blockscale.nvfp4_grid_multipliers(jnp.asarray(x), convention="qwix")
  clamped = np.asarray(clamped)
  assert clamped[0, 0] and clamped[1, 0] and clamped.sum() == 2
  assert np.isinf(np.asarray(mult)[0, 0])
  assert np.asarray(mult)[2, 0] == np.float32(1) / np.float32(0.9375)


@pytest.mark.parametrize("fmt,qtype", [("e4m3", "mxfp8"), ("e2m1", "mxfp4")])
def test_the_spec_and_recipe_layers_take_qwix_s_scale(fmt, qtype):
  """``QuantSpec(scale_rule="qwix")`` and ``MXQuant(scale_rule="qwix")`` (what a recipe
  and ``quantize_model`` use) give qwix's own dequantized values, on the jnp path (the
  Pallas MX kernel implements the OCP rules only)."""
  from lowprec.numerics import quantizer, recipes  # pylint: disable=import-outside-toplevel
  from lowprec.numerics.kernels import operand  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(3)
  x = (rng.standard_t(3, size=(8, 64)) * np.exp2(rng.integers(-8, 8, size=(8, 1)))
       ).astype(np.float32)
  want = qwix_oracle.quantize(x, qtype)[2]
  spec = quantizer.QuantSpec(fmt=fmt, scale_rule="qwix", axis=-1)
  got = np.asarray(quantizer.quantize_dequantize(jnp.asarray(x), spec))
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
  assert not operand.kernel_eligible(spec, 2)
  op_spec = recipes.MXQuant(fmt=fmt, scale_rule="qwix").spec(contract_axis=1, free_axis=0)
  got = np.asarray(quantizer.quantize_dequantize(jnp.asarray(x), op_spec))
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
  with pytest.raises(ValueError, match="qwix 0.1.8's MX scale"):
    quantizer.QuantSpec(fmt="e5m2", scale_rule="qwix")
