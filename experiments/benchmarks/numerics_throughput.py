"""Throughput of cast and block quantization, as ratios to a plain copy in the same run.

    python -m experiments.bench_numerics            # 16M float32 elements
    python -m experiments.bench_numerics --size=1048576 --repeats=3

Every figure is time(op) / time(copy) measured in this process (min over repeats, after
a warm-up call), so machine load cancels to first order; `copy` is `x + 1` on the same
float32 array (one read, one write). Lower is better; 1.0 means as fast as a copy.
"""

from __future__ import annotations

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from experiments.common.harness.config_flags import parse_flags
from lowprec import numerics
from lowprec.numerics import benchmarking
from lowprec.numerics.rounding import Stochastic


def _time(fn, *args, repeats: int) -> float:
  return benchmarking.best_time(jax.jit(fn), *args, repeats=repeats)


def run(size: int, repeats: int) -> tuple[list[tuple[str, float]], float]:
  """Returns (op name, time / copy time) rows and the copy time in seconds."""
  x = jax.random.normal(jax.random.key(0), (size // 32, 32), jnp.float32)
  key = jax.random.key(1)
  ops = {
      "copy (x + 1)": lambda x, k: x + 1.0,
      "astype bf16 (XLA)": lambda x, k: x.astype(jnp.bfloat16),
      "cast bf16 nearest": lambda x, k: numerics.cast(x, "bf16"),
      "cast bf16 stochastic (hash)": lambda x, k: numerics.cast(
          x, "bf16", rounding=Stochastic(), key=k),
      "cast bf16 stochastic (threefry)": lambda x, k: numerics.cast(
          x, "bf16", rounding=Stochastic(rng="threefry"), key=k),
      "cast e4m3 nearest": lambda x, k: numerics.cast(x, "e4m3"),
      "cast e4m3 stochastic (hash)": lambda x, k: numerics.cast(
          x, "e4m3", rounding=Stochastic(), key=k),
      "cast e4m3 stochastic (threefry)": lambda x, k: numerics.cast(
          x, "e4m3", rounding=Stochastic(rng="threefry"), key=k),
      "quantize_mx e4m3 (1x32)": lambda x, k: numerics.quantize_mx(x, "e4m3"),
      "quantize_mx e2m1 (1x32) stochastic": lambda x, k: numerics.quantize_mx(
          x, "e2m1", rounding=Stochastic(), key=k),
      "quantize_nvfp4 (1x16)": lambda x, k: numerics.quantize_nvfp4(x),
      "dequantize mx e4m3": None,
  }
  q = numerics.quantize_mx(x, "e4m3")
  base = _time(ops["copy (x + 1)"], x, key, repeats=repeats)
  times = {}
  for name, fn in ops.items():
    if name == "dequantize mx e4m3":
      times[name] = _time(numerics.dequantize, q, repeats=repeats)
    else:
      times[name] = _time(fn, x, key, repeats=repeats)
  base = min(base, times["copy (x + 1)"])  # the copy was timed twice: keep the best
  return [(name, t / base) for name, t in times.items()], base


def define_flags() -> None:
  """Defines this script's flags; called only when it runs as a script, so that
  importing the module (a test, another script) defines no flag names."""
  flags.DEFINE_integer("size", 16 * 1024 * 1024, "number of float32 elements")
  flags.DEFINE_integer("repeats", 7, "timed calls per op (the minimum is kept)")


def main(argv):
  del argv
  rows, base = run(flags.FLAGS.size, flags.FLAGS.repeats)
  print(f"{flags.FLAGS.size} float32 elements; copy takes {base * 1e3:.1f} ms "
        f"({2 * 4 * flags.FLAGS.size / base / 1e9:.2f} GB/s read+write) on "
        f"{jax.devices()[0].platform}")
  print(f"{'op':40s} {'time / copy':>12s} {'copy / time':>12s}")
  for name, r in rows:
    print(f"{name:40s} {r:12.2f} {1 / r:12.2f}")
  d = dict(rows)
  for fmt in ("bf16", "e4m3"):
    print(f"stochastic (hash) / nearest, {fmt}: "
          f"{d[f'cast {fmt} stochastic (hash)'] / d[f'cast {fmt} nearest']:.2f}; "
          f"threefry / nearest: "
          f"{d[f'cast {fmt} stochastic (threefry)'] / d[f'cast {fmt} nearest']:.2f}")


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=parse_flags)
