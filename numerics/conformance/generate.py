"""Writes the conformance vectors (``vectors.json.gz`` next to this file).

    python -m lowprec.numerics.conformance.generate [--out PATH]

Every input tensor of :mod:`numerics.conformance.inputs` is quantized by this library
for every element format x scale rule x convention, and the exact element codes, scale
codes, tensor scale and dequantized values are stored. The vectors are regenerated
only when a quantizer's bits change on purpose; ``tests/numerics/test_conformance.py``
holds the library to the stored file and the qwix-convention vectors to qwix itself.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys

import jax.numpy as jnp
import numpy as np

from lowprec.numerics import mx, nvfp4
from lowprec.numerics.conformance import inputs as inputs_lib

MX_FORMATS = ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")
MX_RULES = ("floor", "ceil", "rceil", "even", "alto")
QWIX_MX_FORMATS = ("e4m3", "e2m1")
NVFP4_CONVENTIONS = ("te", "torchao", "qwix")
DEFAULT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                            "vectors.json.gz")


def hex_u32(a: np.ndarray) -> str:
  """Big-endian hex of float32 (or uint32) values, 8 digits each."""
  return np.ascontiguousarray(a, np.float32).view(np.uint32).astype(">u4").tobytes().hex()


def hex_u8(a: np.ndarray) -> str:
  return np.asarray(a, np.uint8).tobytes().hex()


def cases() -> list[dict]:
  """Every (input, format, scale rule, convention) combination, as quantizer kwargs."""
  out = []
  for fmt in MX_FORMATS:
    for rule in MX_RULES:
      out.append(dict(input=f"mx/{fmt}", kind="mx", fmt=fmt, scale_rule=rule,
                      convention="ocp"))
    if fmt in QWIX_MX_FORMATS:
      out.append(dict(input=f"mx/{fmt}", kind="mx", fmt=fmt, scale_rule="qwix",
                      convention="qwix"))
  for name in inputs_lib.nvfp4_inputs():
    for conv in NVFP4_CONVENTIONS:
      out.append(dict(input=f"nvfp4/{name}", kind="nvfp4", fmt="e2m1",
                      scale_rule=None, convention=conv))
  return out


def all_inputs() -> dict[str, np.ndarray]:
  tensors = {f"mx/{fmt}": inputs_lib.mx_inputs(fmt) for fmt in MX_FORMATS}
  tensors.update({f"nvfp4/{k}": v for k, v in inputs_lib.nvfp4_inputs().items()})
  return tensors


def quantize_case(case: dict, x: np.ndarray):
  """(codes, scales, tensor_scale, dequantized) of this library for one case."""
  xj = jnp.asarray(x)
  if case["kind"] == "mx":
    kw = dict(convention=case["convention"])
    if case["convention"] == "ocp":
      kw["scale_rule"] = case["scale_rule"]
    q = mx.quantize_mx(xj, case["fmt"], **kw)
    deq = mx.quantize_dequantize_mx(xj, case["fmt"], **kw)
  else:
    q = nvfp4.quantize_nvfp4(xj, convention=case["convention"])
    deq = nvfp4.quantize_dequantize_nvfp4(xj, convention=case["convention"])
  return (np.asarray(q.codes), np.asarray(q.scales), np.float32(q.tensor_scale),
          np.asarray(deq))


def build() -> dict:
  tensors = all_inputs()
  doc = {
      "about": ("lowprec-numerics block quantization conformance vectors. Inputs: float32 "
                "bits, big-endian hex, row-major; each row is one block (32 for MX, 16 for "
                "NVFP4) along the last axis. Per vector: element codes and scale codes "
                "(hex, one byte each: OCP E8M0 for MX, E4M3 for NVFP4), the float32 "
                "tensor scale (NVFP4: decode multiplier) and the dequantized float32 "
                "values (bits, hex). See docs/api.md, 'Conventions'."),
      "version": 1,
      "inputs": {k: {"shape": list(v.shape), "bits": hex_u32(v)}
                 for k, v in tensors.items()},
      "vectors": [],
  }
  for case in cases():
    codes, scales, ts, deq = quantize_case(case, tensors[case["input"]])
    doc["vectors"].append(dict(case, codes=hex_u8(codes), scales=hex_u8(scales),
                               tensor_scale=hex_u32(np.array([ts])),
                               dequantized=hex_u32(deq)))
  return doc


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", default=DEFAULT_PATH)
  args = p.parse_args(argv)
  doc = build()
  data = json.dumps(doc, separators=(",", ":")).encode("ascii")
  with open(args.out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                   filename="") as fh:
    fh.write(data)  # mtime=0: the same vectors give the same bytes
  print(f"wrote {len(doc['vectors'])} vectors over {len(doc['inputs'])} inputs to "
        f"{args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
