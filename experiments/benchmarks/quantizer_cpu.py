"""The element-wise quantizers' process CPU time as ratios to a plain copy's.

    python -m experiments.benchmarks.quantizer_cpu                  # 16M float32, 3 rounds
    # before / after a change: alternate processes over two trees (the script runs as a
    # file, so the library comes from PYTHONPATH's tree)
    git archive <commit> | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before python experiments/benchmarks/quantizer_cpu.py --label=before

On 16M float32 (4096 x 4096): ``quantize_mx`` e4m3 and e2m1 with the floor and rceil
scale rules, and ``quantize_nvfp4``, each jitted (codes and scales out), against
``x + 1`` (one read, one write). Each round times every op in turn (the median of
``--calls`` calls' process CPU time, after a warm-up call), so machine load cancels to
first order; one JSON line: per op the ratio of each round.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from experiments.common.harness.config_flags import parse_flags
from lowprec import numerics
from lowprec.numerics import blockscale


def define_flags() -> None:
  """Defines this script's flags (only when run as a script)."""
  flags.DEFINE_integer("size", 16 * 1024 * 1024, "float32 elements (a multiple of 4096)")
  flags.DEFINE_integer("rounds", 3, "interleaved rounds")
  flags.DEFINE_integer("calls", 9, "timed calls per op and round (median)")
  flags.DEFINE_string("label", "", "a label for the JSON line (e.g. the tree)")


def cpu_seconds(f: Callable[..., Any], *args: Any, calls: int) -> float:
  """Median process CPU seconds of ``calls`` calls of ``f(*args)`` after a warm-up."""
  jax.block_until_ready(f(*args))
  ts = []
  for _ in range(calls):
    t = time.process_time()
    jax.block_until_ready(f(*args))
    ts.append(time.process_time() - t)
  return sorted(ts)[len(ts) // 2]


def ops() -> dict[str, Callable[[jax.Array], Any]]:
  """The timed functions of a float32 array (``copy`` first: the baseline)."""
  def mx(fmt, rule):
    return lambda x: (lambda q: (q.codes, q.scales))(
        numerics.quantize_mx(x, fmt, scale_rule=rule))
  return {"copy": lambda x: x + 1.0,
          "mx e4m3 floor": mx("e4m3", "floor"), "mx e4m3 rceil": mx("e4m3", "rceil"),
          "mx e2m1 floor": mx("e2m1", "floor"), "mx e2m1 rceil": mx("e2m1", "rceil"),
          "nvfp4": lambda x: (lambda q: (q.codes, q.scales))(numerics.quantize_nvfp4(x))}


def run(size: int, rounds: int, calls: int) -> dict[str, list[float]]:
  """Per op (not the copy), its CPU time over the copy's in each round."""
  x = jax.random.normal(jax.random.key(0), (size // 4096, 4096), jnp.float32)
  fns = {n: jax.jit(f) for n, f in ops().items()}
  res = {n: [] for n in fns}
  for _ in range(rounds):
    for n, f in fns.items():
      res[n].append(cpu_seconds(f, x, calls=calls))
  return {n: [round(v / c, 3) for v, c in zip(t, res["copy"])]
          for n, t in res.items() if n != "copy"}


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  fl = flags.FLAGS
  print(json.dumps({"label": fl.label, "library": blockscale.__file__,
                    "ratios": run(fl.size, fl.rounds, fl.calls)}), flush=True)


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=parse_flags)
