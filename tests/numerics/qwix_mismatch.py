"""How often each convention's dequantized values differ from qwix 0.1.8 (the numbers in
docs/api.md, "Conventions"). Needs qwix (the ``dev`` extra); about a minute on a CPU.

    python -m tests.numerics.qwix_mismatch
"""

import jax.numpy as jnp
import numpy as np

from lowprec.numerics import mx, nvfp4

from tests.numerics import qwix_oracle

ROWS, COLS = 1024, 256


def inputs() -> dict[str, np.ndarray]:
  """N(0, 1); rows scaled by 2^-40..2^40 with max * 2^k and 6 * 2^k amaxes (normal,
  tiny, huge and power-of-two-edge blocks); the same over 2^-70..2^120."""
  rng = np.random.default_rng(0)
  out = {"normal": rng.standard_normal((ROWS, COLS)).astype(np.float32)}
  for name, lo, hi in (("mixed 2^-40..2^40", -40, 40), ("wide 2^-70..2^120", -70, 120)):
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    sc = np.ldexp(np.float32(1), rng.integers(lo, hi, (ROWS, 1))).astype(np.float32)
    x = x * sc
    x[::4, 0] = np.float32(448) * sc[::4, 0]
    x[1::4, 0] = np.float32(6) * sc[1::4, 0]
    out[name] = x
  return out


def rates() -> list[tuple[str, str, str, float]]:
  """(input, qwix qtype, our setting, fraction of elements whose bits differ)."""
  out = []
  for name, x in inputs().items():
    xj = jnp.asarray(x)
    for qtype, fmt in (("mxfp8", "e4m3"), ("mxfp4", "e2m1")):
      _, _, ref = qwix_oracle.quantize(x, qtype)
      for label, kw in (("floor (default)", dict(scale_rule="floor")),
                        ("rceil", dict(scale_rule="rceil")),
                        ("convention=qwix", dict(convention="qwix"))):
        ours = np.asarray(mx.quantize_dequantize_mx(xj, fmt, **kw))
        out.append((name, qtype, label, float(np.mean(ours.view(np.uint32)
                                                      != ref.view(np.uint32)))))
    _, _, ref = qwix_oracle.quantize(x, "nvfp4")
    for conv in ("te", "torchao", "qwix"):
      ours = np.asarray(nvfp4.quantize_dequantize_nvfp4(xj, convention=conv))
      label = f"convention={conv}" + (" (default)" if conv == "te" else "")
      out.append((name, "nvfp4", label, float(np.mean(ours.view(np.uint32)
                                                      != ref.view(np.uint32)))))
  return out


if __name__ == "__main__":
  for name, qtype, label, r in rates():
    print(f"{name:20s} {qtype:6s} {label:22s} {100 * r:7.3f}%")
