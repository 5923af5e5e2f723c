"""Lowers every kernel for ``cuda`` and ``tpu`` at production shapes, without a device.

    python -m numerics.kernels.lowering            # prints the kernel | cuda | tpu table

``jax.jit(f).trace(*args).lower(lowering_platforms=(platform,))`` runs the Pallas
backend's own lowering (Triton for ``cuda``, Mosaic for ``tpu``) and its checks --
unsupported ops, block shapes, shared memory and alignment for Mosaic GPU, TPU tiling
-- on this CPU-only jaxlib, without compiling: ptxas, the Triton compiler passes and
Mosaic's TPU layout passes run only on a device. The CI test
(tests/numerics/kernels/test_lowering.py) fails when any case here fails to lower.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from absl import app
import jax
import jax.numpy as jnp

from numerics import blockscale
from numerics.blockscale import MX_BLOCK
from numerics import kernels

PLATFORMS = ("cuda", "tpu")
QUANTIZE_SHAPE = (8192, 4096)
MATMUL_SIZE = 4096

_S = jax.ShapeDtypeStruct


def _x(shape=QUANTIZE_SHAPE, dtype=jnp.float32):
  return _S(shape, dtype)


def _mx_operand(fmt: str, m: int, k: int, axis: int) -> blockscale.QuantizedArray:
  scales = (m, k // MX_BLOCK) if axis == 1 else (m // MX_BLOCK, k)
  return blockscale.QuantizedArray(
      codes=_S((m, k), jnp.uint8), scales=_S(scales, jnp.uint8),
      tensor_scale=_S((), jnp.float32), fmt=fmt, scale_fmt="e8m0", axes=(axis,),
      block_shape=(MX_BLOCK,), shape=(m, k), scale_rule="floor")


def _cases() -> dict[str, tuple[Callable[..., Any], tuple[Any, ...]]]:
  key = jax.random.key(0)
  sr = dict(rounding="stochastic")
  on = dict(use_kernel=True)
  cases = {}
  for fmt in blockscale.MX_ELEMENT_FORMATS:
    cases[f"mx_quantize {fmt} stochastic {QUANTIZE_SHAPE}"] = (
        lambda x, k, fmt=fmt: kernels.mx_quantize(x, fmt, key=k, **sr, **on), (_x(), key))
  cases[f"mx_quantize e4m3 rceil nearest bf16 {QUANTIZE_SHAPE}"] = (
      lambda x: kernels.mx_quantize(x, "e4m3", scale_rule="rceil", **on),
      (_x(dtype=jnp.bfloat16),))
  cases[f"nvfp4_quantize stochastic {QUANTIZE_SHAPE}"] = (
      lambda x, k: kernels.nvfp4_quantize(x, key=k, **sr, **on), (_x(), key))
  qdq = [("e4m3", -1, "nearest", QUANTIZE_SHAPE), ("e4m3", -2, "stochastic", QUANTIZE_SHAPE),
         ("e2m1", -2, "stochastic", (4, 2048, 4096)), ("int8", -1, "nearest", QUANTIZE_SHAPE)]
  for fmt, axis, rounding, shape in qdq:
    cases[f"mx_quantize_dequantize {fmt} axis {axis} {rounding} {shape}"] = (
        lambda x, k, fmt=fmt, axis=axis, rounding=rounding: kernels.mx_quantize_dequantize(
            x, fmt, axis=axis, rounding=rounding,
            **(dict(key=k) if rounding == "stochastic" else {}), **on), (_x(shape), key))
  for axis in (-1, -2):
    cases[f"nvfp4_quantize_dequantize axis {axis} stochastic {QUANTIZE_SHAPE}"] = (
        lambda x, k, axis=axis: kernels.nvfp4_quantize_dequantize(
            x, axis=axis, key=k, **sr, **on), (_x(), key))
  cases[f"nvfp4_quantize_dequantize_blocks axis -2 stochastic {QUANTIZE_SHAPE}"] = (
      lambda x, k: kernels.nvfp4_quantize_dequantize_blocks(x, axis=-2, key=k, **sr, **on),
      (_x(), key))
  n = MATMUL_SIZE
  for fa, fb in (("e4m3", "e4m3"), ("e2m1", "e2m1"), ("int8", "e5m2")):
    cases[f"mx_matmul {fa} x {fb} {n}^3"] = (
        lambda a, b: kernels.mx_matmul(a, b, **on),
        (_mx_operand(fa, n, n, 1), _mx_operand(fb, n, n, 0)))
  return cases


CASES = _cases()


def lower(name: str, platform: str) -> str | None:
  """None when case ``name`` lowers for ``platform``, else the error's first line."""
  fn, args = CASES[name]
  try:
    jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,))
  except Exception as e:  # pylint: disable=broad-except  (reported, not hidden)
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
  return None


def main(argv):
  del argv
  print(f"jax {jax.__version__}; lowering only (no compile, no device)\n")
  print("| kernel | cuda (Triton) | tpu (Mosaic) |")
  print("|---|---|---|")
  failures = 0
  t0 = time.perf_counter()
  for name in CASES:
    cells = []
    for platform in PLATFORMS:
      err = lower(name, platform)
      failures += err is not None
      cells.append("lowers" if err is None else f"FAILS: {err}")
    print(f"| {name} | {cells[0]} | {cells[1]} |")
  print(f"\n{len(CASES) * len(PLATFORMS)} lowerings, {failures} failed, "
        f"{time.perf_counter() - t0:.1f} s")
  return 1 if failures else 0


if __name__ == "__main__":
  app.run(main)
