"""The shipped conformance vectors (lowprec.numerics.conformance): the library
reproduces every one bit for bit; the OCP, TE and torchao ones equal the NumPy
references (tests/numerics/mx_reference.py) and the qwix-convention ones qwix 0.1.8
itself; each vector's dequantized values follow from its codes and scales by the formats'
decoding (NumPy, not the library), and the blocks hit the branches they are meant to.

Cost: about 12 s on one CPU core, mostly compiling the quantizer once per format x
scale rule x convention (the NVFP4 inputs share one shape, so each convention compiles
once).
"""

import jax.numpy as jnp
import numpy as np
import pytest

from lowprec.numerics import conformance, formats, mx, nvfp4
from lowprec.numerics.conformance import generate

from tests.numerics import mx_reference as ref
from tests.numerics import qwix_oracle

VECTORS = conformance.load()


def _bits(a):
  return np.asarray(a, np.float32).view(np.uint32)


def _id(v):
  rule = v["scale_rule"] or ""
  return f"{v['input_name']}-{rule}-{v['convention']}"


def test_the_vectors_cover_every_case():
  got = {(v["kind"], v["fmt"], v["scale_rule"], v["convention"]) for v in VECTORS}
  want = {("mx", f, r, "ocp") for f in generate.MX_FORMATS for r in generate.MX_RULES}
  want |= {("mx", f, "qwix", "qwix") for f in ("e4m3", "e2m1")}
  want |= {("nvfp4", "e2m1", None, c) for c in ("te", "torchao", "qwix")}
  assert got == want
  assert len({v["input_name"] for v in VECTORS if v["kind"] == "nvfp4"}) == 7


@pytest.mark.parametrize("v", [pytest.param(v, id=_id(v)) for v in VECTORS])
def test_library_reproduces_vector(v):
  x = jnp.asarray(v["input"])
  if v["kind"] == "mx":
    kw = dict(convention=v["convention"])
    if v["convention"] == "ocp":
      kw["scale_rule"] = v["scale_rule"]
    q = mx.quantize_mx(x, v["fmt"], **kw)
    deq = mx.quantize_dequantize_mx(x, v["fmt"], **kw)
  else:
    q = nvfp4.quantize_nvfp4(x, convention=v["convention"])
    deq = nvfp4.quantize_dequantize_nvfp4(x, convention=v["convention"])
  np.testing.assert_array_equal(np.asarray(q.codes), v["codes"])
  np.testing.assert_array_equal(np.asarray(q.scales), v["scales"])
  assert _bits(q.tensor_scale) == _bits(v["tensor_scale"])
  np.testing.assert_array_equal(_bits(deq), _bits(v["dequantized"]))


@pytest.mark.parametrize("v", [pytest.param(v, id=_id(v)) for v in VECTORS
                               if v["convention"] != "qwix"])
def test_vectors_equal_the_numpy_references(v):
  """The OCP, TE and torchao vectors against the NumPy transcriptions of the specs
  (tests/numerics/mx_reference.py), independent of the library's code."""
  x = v["input"]
  if v["kind"] == "mx":
    with np.errstate(over="ignore"):  # huge blocks: a rounded-up element * scale is Inf
      codes, scales, deq = ref.quantize_mx(x, v["fmt"], v["scale_rule"])
    ts = np.float32(1.0)
  elif v["convention"] == "te":
    codes, scales, ts, deq = ref.quantize_nvfp4(x)
  else:
    codes, scales, ts, deq = ref.quantize_nvfp4_torchao(x)
  np.testing.assert_array_equal(v["codes"], codes)
  np.testing.assert_array_equal(v["scales"], scales)
  assert _bits(v["tensor_scale"]) == _bits(ts)
  np.testing.assert_array_equal(_bits(v["dequantized"]), _bits(deq))


@pytest.mark.parametrize("v", [pytest.param(v, id=_id(v)) for v in VECTORS
                               if v["convention"] == "qwix"])
def test_qwix_vectors_equal_qwix(v):
  """Rows holding a NaN are compared only where qwix's amax kept the NaN (its max
  reduction drops it in some array shapes; tests/numerics/test_qwix_convention.py)."""
  x = v["input"]
  codes, scales, deq = qwix_oracle.quantize(x, qwix_oracle.QTYPES[v["kind"], v["fmt"]])
  nan_row = np.isnan(x).any(axis=1)
  kept = nan_row & np.all(np.isnan(deq), axis=1)
  same = ~nan_row | kept
  if v["kind"] == "mx":
    # MX Inf/NaN blocks: qwix's scale is Inf/NaN (no E8M0 code); both dequantize to NaN.
    special = ~np.isfinite(x).all(axis=1)
    assert np.all(np.isnan(deq[special & same]))
    assert np.all(v["scales"][special] == 255)
    same &= ~special
  np.testing.assert_array_equal(v["codes"][same], codes[same])
  np.testing.assert_array_equal(v["scales"][same, 0], scales[same])
  np.testing.assert_array_equal(_bits(v["dequantized"][same]), _bits(deq[same]))


def _decode(codes, fmt):
  """float64 values of element codes, from the format's fields (not the library)."""
  f = formats.get(fmt)
  sign = np.where(codes >> (f.bits - 1), -1.0, 1.0)
  e = (codes >> f.man_bits) & ((1 << (f.bits - 1 - f.man_bits)) - 1)
  m = codes & ((1 << f.man_bits) - 1)
  mag = np.where(e == 0, m * 2.0 ** (1 - f.bias - f.man_bits),
                 (1 + m / 2.0 ** f.man_bits) * 2.0 ** (e.astype(np.int64) - f.bias))
  return sign * mag


@pytest.mark.parametrize("v", [pytest.param(v, id=_id(v)) for v in VECTORS])
def test_vector_dequantizes_by_the_spec(v):
  """MX: element * 2^(scale - 127), NaN for scale 0xFF. NVFP4: element * E4M3 scale
  (exact), then the tensor scale: TE and qwix one float32 product, torchao
  ``element * (tensor_scale * scale)`` in float32 (its two roundings)."""
  elem = _decode(v["codes"], v["fmt"])
  s = v["scales"].astype(np.int64)
  if v["kind"] == "mx":
    with np.errstate(over="ignore"):  # huge blocks: a rounded-up element * scale is Inf
      want = (elem * 2.0 ** (s - 127)).astype(np.float32)
    want[np.broadcast_to(s == 255, want.shape)] = np.nan
  else:
    scale = _decode(v["scales"], "e4m3")
    nan = np.broadcast_to(v["scales"] == 0x7F, elem.shape)
    ts = np.float32(v["tensor_scale"])
    if v["convention"] == "torchao":
      want = elem.astype(np.float32) * (np.float32(scale) * ts)
    else:
      want = (elem * scale).astype(np.float32) * ts
    want = np.where(nan, np.float32(np.nan), want)
  np.testing.assert_array_equal(_bits(want), _bits(v["dequantized"]))


def _hits(vs, name, top_code=True):
  """Branches hit by vectors ``vs`` (of one element format) together."""
  f = formats.get(vs[0]["fmt"])
  codes = np.concatenate([v["codes"].reshape(-1) for v in vs])
  scales = np.concatenate([v["scales"].reshape(-1) for v in vs])
  mag = codes & ((1 << (f.bits - 1)) - 1)
  top = np.nonzero(_decode(np.arange(1 << (f.bits - 1)), f.name) == f.max)[0]
  assert (mag == top).any() or not top_code, name  # saturation (or an exact max)
  assert ((mag > 0) & (mag < (1 << f.man_bits))).any(), name  # element subnormals
  assert (codes == 1 << (f.bits - 1)).any(), name  # -0
  assert (scales == (255 if vs[0]["kind"] == "mx" else 0x7F)).any(), name  # NaN block
  return scales


def test_vectors_hit_the_branches():
  """Each MX vector: saturated (``ceil`` and ``alto`` rarely can), subnormal and signed-zero
  elements and a NaN scale; floor's E8M0 clamp at 2^-127 (code 0). Each NVFP4 convention over its tensors: the
  same, the 448 scale, and (TE, qwix) zero and subnormal E4M3 scales (TE: blocks far
  below the tensor amax; qwix: amax below 6 * 2^-10)."""
  for v in VECTORS:
    if v["kind"] == "mx":
      # ceil, and alto where max's mantissa rounds up, never reach max.
      reach = v["scale_rule"] != "ceil" and (v["scale_rule"] != "alto"
                                             or v["fmt"] == "e2m1")
      scales = _hits([v], _id(v), top_code=reach)
      assert v["scale_rule"] != "floor" or (scales == 0).any(), _id(v)
  for conv in ("te", "torchao", "qwix"):
    scales = _hits([v for v in VECTORS if v["convention"] == conv], conv)
    assert (scales == 0x7E).any(), conv
    if conv != "torchao":  # torchao clamps its block scale at 2^-6
      assert (scales == 0).any() and ((scales > 0) & (scales < 8)).any(), conv
