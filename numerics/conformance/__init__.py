"""Conformance vectors for block quantization: inputs that hit every branch, with the
exact codes, scales and dequantized values of every format x scale rule x convention.

The vectors ship with the package (``vectors.json.gz``, gzip-compressed JSON; the
layout is in its ``about`` field and in docs/api.md, "Conventions"). :func:`load` reads
them as NumPy arrays, so another implementation can check itself against them; the
generator is :mod:`numerics.conformance.generate`, the inputs are built by
:mod:`numerics.conformance.inputs`.
"""

from __future__ import annotations

import gzip
import json
import os

import numpy as np

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vectors.json.gz")


def _f32(hexstr: str) -> np.ndarray:
  return np.frombuffer(bytes.fromhex(hexstr), ">u4").astype(np.uint32).view(np.float32)


def _u8(hexstr: str) -> np.ndarray:
  return np.frombuffer(bytes.fromhex(hexstr), np.uint8).copy()


def load(path: str = PATH) -> list[dict]:
  """Every vector as a dict: ``input`` (float32 array), ``kind`` ("mx" or "nvfp4"),
  ``fmt``, ``scale_rule`` (MX; "qwix" under the qwix convention), ``convention``,
  ``codes`` and ``scales`` (uint8, one per element and one per block: each row of
  the input is one block, so ``scales`` is ``(rows, 1)``), ``tensor_scale`` (float32) and ``dequantized`` (float32, the input's
  shape), and ``input_name``."""
  with gzip.open(path, "rt", encoding="ascii") as fh:
    doc = json.load(fh)
  tensors = {k: _f32(v["bits"]).reshape(v["shape"]) for k, v in doc["inputs"].items()}
  out = []
  for v in doc["vectors"]:
    x = tensors[v["input"]]
    out.append(dict(
        input_name=v["input"], input=x, kind=v["kind"], fmt=v["fmt"],
        scale_rule=v["scale_rule"], convention=v["convention"],
        codes=_u8(v["codes"]).reshape(x.shape),
        scales=_u8(v["scales"]).reshape(x.shape[0], 1),
        tensor_scale=_f32(v["tensor_scale"])[0],
        dequantized=_f32(v["dequantized"]).reshape(x.shape)))
  return out
