"""Benchmark: chunked vs sequential (reference) delta rule, forward time as a ratio.

    python -m experiments.bench_delta_rule                 # Memoir's write: B=64, T=8, d=32
    python -m experiments.bench_delta_rule --seq_len=256 --chunk=32

Prints the median forward time of each jitted form over ``--repeats`` calls (after a
warm-up/compile call) and the ratio reference / chunked (> 1: the chunked form is
faster). A script, not a test: timings on shared CPUs are noisy.
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from experiments.common.harness.config_flags import parse_flags
from lowprec.models import delta_rule

FLAGS = flags.FLAGS


def time_forward(fn, args, repeats: int) -> float:
  """Median seconds of ``fn(*args)`` (blocked until ready) over ``repeats`` calls."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def bench(batch: int, seq_len: int, d_k: int, d_v: int, chunk: int, repeats: int,
          seed: int = 0) -> dict[str, float]:
  """Times both forms on random unit keys; returns seconds and the ratio."""
  ks = jax.random.split(jax.random.PRNGKey(seed), 4)
  k = jax.random.normal(ks[0], (batch, seq_len, d_k))
  k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
  v = jax.random.normal(ks[1], (batch, seq_len, d_v))
  beta = jax.random.uniform(ks[2], (batch, seq_len))
  s0 = jnp.zeros((batch, d_v, d_k))
  ref = jax.jit(delta_rule.delta_rule_reference)
  chunked = jax.jit(lambda q, k, v, b, s: delta_rule.delta_rule_chunked(q, k, v, b, s, chunk))
  args = (k, k, v, beta, s0)
  err = float(jnp.max(jnp.abs(ref(*args)[1] - chunked(*args)[1])))
  t_ref = time_forward(ref, args, repeats)
  t_chunk = time_forward(chunked, args, repeats)
  return {"reference_ms": 1e3 * t_ref, "chunked_ms": 1e3 * t_chunk,
          "ratio": t_ref / t_chunk, "max_abs_diff": err}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  r = bench(FLAGS.batch, FLAGS.seq_len, FLAGS.d_k, FLAGS.d_v, FLAGS.chunk, FLAGS.repeats)
  print(f"delta rule forward, B={FLAGS.batch} T={FLAGS.seq_len} d_k={FLAGS.d_k} "
        f"d_v={FLAGS.d_v} chunk={FLAGS.chunk} on {jax.default_backend()}:")
  print(f"  reference (scan per step): {r['reference_ms']:.3f} ms")
  print(f"  chunked (triangular solve): {r['chunked_ms']:.3f} ms")
  print(f"  ratio reference/chunked:   {r['ratio']:.2f}x  (max |dS| {r['max_abs_diff']:.1e})")
  return 0


if __name__ == "__main__":
  flags.DEFINE_integer("batch", 64, "Samples.")
  flags.DEFINE_integer("seq_len", 8, "Writes per sample.")
  flags.DEFINE_integer("d_k", 32, "Key dimension.")
  flags.DEFINE_integer("d_v", 32, "Value dimension.")
  flags.DEFINE_integer("chunk", 16, "Chunk length of the chunked form.")
  flags.DEFINE_integer("repeats", 50, "Timed calls per form.")
  app.run(lambda argv: sys.exit(main(argv)), flags_parser=parse_flags)
