"""One-command accelerator check: kernel tests compiled on the device, then throughput.

    python -m numerics.kernels.check              # on a GPU/TPU machine
    python -m numerics.kernels.check --interpret  # anywhere: interpret-mode smoke run

Runs tests/numerics/kernels with NUMERICS_KERNEL_COMPILED=1 (kernels compiled, not
interpreted), then times the kernels on the device. Throughput is reported as a
fraction of the device's measured copy bandwidth (``x + 1`` on a float32 array of the
same size, timed in the same run) and, for the matmul, in TFLOP/s.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

import numerics
from numerics import benchmarking
from numerics import kernels

_INTERPRET = flags.DEFINE_bool("interpret", False, "interpret mode (no accelerator)")
_ROWS = flags.DEFINE_integer("rows", 8192, "rows of the quantized array")
_COLS = flags.DEFINE_integer("cols", 8192, "columns of the quantized array")
_MM = flags.DEFINE_integer("mm", 4096, "M = N = K of the timed matmul")
_SKIP_TESTS = flags.DEFINE_bool("skip_tests", False, "only time the kernels")


def _time(fn, *args):
  return benchmarking.best_time(fn, *args, repeats=10)


def run_tests(interpret: bool) -> int:
  env = dict(os.environ)
  if not interpret:
    env["NUMERICS_KERNEL_COMPILED"] = "1"
  root = pathlib.Path(__file__).resolve().parents[2]
  cmd = [sys.executable, "-m", "pytest", "-q", str(root / "tests/numerics/kernels")]
  return subprocess.call(cmd, env=env, cwd=root)


def main(argv):
  del argv
  interpret = _INTERPRET.value
  dev = jax.devices()[0]
  print(f"device: {dev.device_kind} ({jax.default_backend()}), interpret={interpret}")
  if not interpret and jax.default_backend() not in ("gpu", "tpu"):
    print("no accelerator: run with --interpret for a CPU smoke run")
    return 1
  if not _SKIP_TESTS.value:
    rc = run_tests(interpret)
    print(f"kernel tests exit code: {rc}")
    if rc:
      return rc
  rows, cols = (256, 512) if interpret else (_ROWS.value, _COLS.value)
  mode = dict(interpret=True) if interpret else dict(use_kernel=True)
  x = jax.random.normal(jax.random.key(0), (rows, cols), jnp.float32)
  key = jax.random.key(1)
  copy = _time(jax.jit(lambda x: x + 1.0), x)
  copy_bw = 8 * x.size / copy
  print(f"copy: {copy * 1e3:.3f} ms, {copy_bw / 1e9:.1f} GB/s (read + write)")
  for rounding in ("nearest", "stochastic"):
    f = jax.jit(lambda x, k: kernels.mx_quantize(x, "e4m3", rounding=rounding, key=k,
                                                 **mode))
    t = _time(f, x, key)
    moved = x.size * (4 + 1) + x.size // 32  # f32 in, uint8 codes and scales out
    print(f"mx_quantize e4m3 {rounding}: {t * 1e3:.3f} ms, {moved / t / 1e9:.1f} GB/s "
          f"= {moved / t / copy_bw:.2f} of copy bandwidth")
  n = 256 if interpret else _MM.value
  qa = numerics.quantize_mx(jax.random.normal(key, (n, n)), "e4m3")
  qb = numerics.quantize_mx(jax.random.normal(key, (n, n)), "e4m3", axis=0)
  t = _time(jax.jit(lambda a, b: kernels.mx_matmul(a, b, **mode)), qa, qb)
  print(f"mx_matmul {n}^3: {t * 1e3:.3f} ms, {2 * n ** 3 / t / 1e12:.2f} TFLOP/s")
  return 0


if __name__ == "__main__":
  app.run(main)
