"""Lowers every kernel case for ``cuda`` and ``tpu``, without a device or toolchain.

    python -m lowprec.numerics.kernels.lowering            # prints the kernel | cuda | tpu table

``jax.jit(f).trace(*args).lower(lowering_platforms=(platform,))`` runs the Pallas
backend's own lowering (Triton for ``cuda``, Mosaic for ``tpu``) and its checks --
unsupported ops, block shapes, TPU tiling -- with the plain CPU jaxlib. It stops before
the backend compilers: a kernel that lowers can still fail in Triton's passes, ptxas or
Mosaic's layout passes. Those run, also without a device, in
:mod:`numerics.kernels.compile_check` (which needs the compile toolchain). The cases
are :data:`numerics.kernels.cases.CASES`; the CI test
(tests/numerics/kernels/test_lowering.py) fails when any of them fails to lower.
"""

from __future__ import annotations

import time

from absl import app
import jax

from lowprec.numerics.kernels.cases import CASES, MATMUL_SIZE, QUANTIZE_SHAPE  # pylint: disable=unused-import

PLATFORMS = ("cuda", "tpu")


def lower(name: str, platform: str) -> str | None:
  """None when case ``name`` lowers for ``platform``, else the error's first line."""
  case = CASES[name]
  try:
    jax.jit(case.fn).trace(*case.args).lower(lowering_platforms=(platform,))
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
