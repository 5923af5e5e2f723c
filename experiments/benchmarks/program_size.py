"""The size of a small model's compiled training step per recipe: what compile time follows.

    python -m experiments.benchmarks.program_size                   # ViT and LM, 64 tokens, d 64
    python -m experiments.benchmarks.program_size --models=vit --recipes=bf16,nvfp4

For the models and step of :mod:`experiments.benchmarks.small_models` (one Adam step,
projections quantized by ``quantize_model``), compiles each recipe's step once on this
machine's backend and counts, in the optimized HLO (``compiled.as_text()``): the
instructions (every ``name = ...`` line, fused computations included), the fusions and
the ``while`` loops (on the CPU each threefry hash, a ``fold_in`` or ``split`` of a
PRNG key, is one loop), with the compile's wall and process-CPU seconds. XLA:CPU's
compile time follows the instruction count (docs/benchmarks.md); one compile per arm,
so the seconds are as noisy as the machine, the counts are not.
"""

from __future__ import annotations

import re

from absl import app
from absl import flags

from experiments.benchmarks import small_models
from experiments.common.harness.config_flags import parse_flags


def define_flags() -> None:
  """This script's flags (defined only when it runs as a script)."""
  flags.DEFINE_list("models", ["vit", "lm"], "model families: vit, lm")
  flags.DEFINE_list("recipes", ["bf16", "mxfp8", "mxfp4", "nvfp4"],
                    "recipes (numerics.recipes names)")
  flags.DEFINE_integer("tokens", 64, "tokens per example (a square for vit)")
  flags.DEFINE_integer("width", 64, "model width")


def program_size(text: str) -> dict[str, int]:
  """Instructions, fusions and while loops of an optimized HLO module's text."""
  return dict(
      instructions=sum(1 for line in text.splitlines()
                       if line.startswith("  ") and " = " in line),
      fusions=len(re.findall(r" fusion\(", text)),
      while_loops=len(re.findall(r" while\(", text)))


def measure(family: str, recipe: str, tokens: int = 64, width: int = 64) -> dict:
  """One compile of ``family``'s step under ``recipe``: sizes and seconds."""
  model, x, y = small_models.make_model(family, tokens, width)
  _, compile_seconds, compiled = small_models.train_step(
      small_models.ours(model, recipe), x, y)
  wall, cpu = compile_seconds()
  return dict(model=family, recipe=recipe, **program_size(compiled().as_text()),
              compile_s=wall, compile_cpu_s=cpu)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  print(f"{'model':6s} {'recipe':8s} {'instructions':>12s} {'fusions':>8s} "
        f"{'loops':>6s} {'compile s':>10s} {'cpu s':>7s}")
  for family in f.models:
    for recipe in f.recipes:
      r = measure(family, recipe, f.tokens, f.width)
      print(f"{family:6s} {recipe:8s} {r['instructions']:12,d} {r['fusions']:8d} "
            f"{r['while_loops']:6d} {r['compile_s']:10.2f} {r['compile_cpu_s']:7.2f}",
            flush=True)


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=parse_flags)
