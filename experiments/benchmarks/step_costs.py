"""The per-target cost table of the LM's compiled training step: estimates, not timings.

    python -m experiments.benchmarks.step_compile --size=table --native \\
        --json=docs/benchmarks/step_costs.json --costs=docs/benchmarks/step_costs.md
    python -m experiments.benchmarks.step_costs --json=docs/benchmarks/step_costs.json \\
        --out=docs/benchmarks/step_costs.md      # the table again, from the JSON

For each one-device target and recipe: the compiled step's FLOPs and HBM bytes (XLA's
cost analysis, plus the Pallas kernels' and library GEMMs' operand and result bytes,
``step_compile._costs``) and the roofline estimate ``max(FLOPs / bf16 peak, bytes / HBM
bandwidth)`` with the figures of :data:`numerics.kernels.compile_check.TARGETS`, divided
by the bf16 step's estimate on the same target.
"""

from __future__ import annotations

import json
import sys
from typing import Sequence

from absl import app
from absl import flags

from experiments.common.harness.config_flags import parse_flags
from lowprec.numerics.kernels import compile_check


def estimate_us(result: dict, target: compile_check.Target) -> tuple[float, str]:
  """The roofline step time in microseconds and what bounds it ("compute"/"memory")."""
  compute = result["flops"] / target.bf16_flops_per_s
  memory = result["bytes"] / target.hbm_bytes_per_s
  return 1e6 * max(compute, memory), "compute" if compute >= memory else "memory"


def _fmt(x: float) -> str:
  return f"{x:.3g}" if x < 1e4 else f"{x:.2e}".replace("e+0", "e").replace("e+", "e")


def target_table(results: Sequence[dict], target: compile_check.Target) -> list[str]:
  """The markdown lines of one target's table."""
  rows = [r for r in results if r["target"] == target.name and r["layout"] == "single"]
  base = next((r for r in rows if r["recipe"] == "bf16" and not r["native"] and r["ok"]),
              None)
  base_us = estimate_us(base, target)[0] if base else None
  lines = [f"### {target.name}", "",
           "| recipe | GEMM | FLOPs | HBM bytes | of which kernel calls | estimate, us | "
           "bound | / bf16 (estimate) | compile, CPU s |", "|---" * 9 + "|"]
  for r in rows:
    gemm = "native" if r["native"] else "emulated"
    if not r["ok"]:
      lines.append(f"| {r['recipe']} | {gemm} | does not compile: {r['error']} "
                   "| | | | | | |")
      continue
    us, bound = estimate_us(r, target)
    ratio = f"{us / base_us:.2f}" if base_us else "-"
    lines.append(f"| {r['recipe']} | {gemm} | {_fmt(r['flops'])} | {_fmt(r['bytes'])} | "
                 f"{_fmt(r['kernel_bytes'])} | {us:.1f} | {bound} | {ratio} | "
                 f"{r['cpu_s']:.1f} |")
  return lines + [""]


def markdown(report: dict) -> str:
  """The document for a report of ``step_compile`` (its ``--json``): how the figures
  were made, then one table per target."""
  results = report["results"]
  size_text = ", ".join(f"{k} {v}" for k, v in report["size"].items())
  ok = [r for r in results if r["ok"] and r["layout"] == "single"]
  memory_bound = sum(estimate_us(r, t)[1] == "memory" for r in ok
                     for t in compile_check.TARGETS if t.name == r["target"])
  lines = [
      "# Estimated step cost per target (deviceless compiles; estimates, not timings)",
      "",
      f"Compiled on {report['date']} with jax {report['jax']}, without a device, by:",
      "",
      "```bash",
      report["command"],
      "```",
      "",
      "Every figure below is an **estimate** from the compiled program, not a "
      "measurement on the accelerator. The program: the LM's whole training step "
      "(`experiments/benchmarks/step_compile.py`: forward, backward, AdamW; "
      f"{size_text}; the Pallas kernels on), compiled for each target by the real "
      "backend compiler. FLOPs and HBM bytes per step: the TPU compiler's "
      "`cost_analysis()`; on the GPUs, where it returns nothing without a device, "
      "XLA's generic HLO cost analysis of the optimized module; plus the operand and "
      "result bytes of "
      "every kernel call (Mosaic or Triton custom calls, which XLA counts as unknown: "
      "the Pallas kernels, and on TPU any Mosaic call XLA emits itself) and of every "
      "cuBLAS GEMM call, with its FLOPs. Bytes count each instruction's operands and "
      "results, as if nothing stayed on chip; a loop body counts once.",
      "",
      "Estimate = max(FLOPs / dense BF16 peak, bytes / HBM bandwidth), the roofline of "
      "`numerics/kernels/compile_check.py` (`TARGETS`). Every FLOP is priced at the "
      "BF16 peak: float32 GEMMs (`fp32`; `fp8` and `fp8_delayed` emulate in float32) "
      "run slower than that and native FP8 GEMMs faster (2x on H200 and B200); "
      f"{memory_bound} of the {len(ok)} rows below are memory-bound by this count. "
      "*Emulated* GEMMs quantize, "
      "dequantize and multiply in bf16/float32 (`qdot`); *native* ones "
      "(`recipes.with_native_gemm`, GPU targets only) take per-tensor FP8 operands as "
      "`f8 x f8 -> f32` GEMMs, and MXFP8/NVFP4 operands through "
      "`jax.nn.scaled_matmul`, which compiles without a device to its fallback "
      "(operands dequantized to float32, then cuBLASLt; cuDNN's block-scaled GEMM is "
      "chosen only on a Blackwell device), quantized by the jnp path rather than the "
      "kernels: those native rows describe the fallback, not the device's program.",
      "",
      "Targets: " + "; ".join(t.source for t in compile_check.TARGETS) + ".",
      ""]
  for target in compile_check.TARGETS:
    if any(r["target"] == target.name for r in results):
      lines += target_table(results, target)
  return "\n".join(lines).rstrip() + "\n"


def define_flags() -> None:
  """This script's flags (defined only when it runs as a script)."""
  flags.DEFINE_string("json", None, "A report of step_compile (its --json).")
  flags.DEFINE_string("out", None, "Write the markdown here (default: print it).")


def main(argv: Sequence[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  try:
    with open(f.json or "") as source:
      report = json.load(source)
    text = markdown(report)
  except (OSError, ValueError, KeyError, TypeError) as e:
    print(f"error: --json={f.json!r} is not a step_compile report: "
          f"{type(e).__name__}: {e}", file=sys.stderr)
    return 2
  if f.out:
    with open(f.out, "w") as out:
      out.write(text)
  else:
    print(text, end="")
  return 0


if __name__ == "__main__":
  define_flags()
  app.run(lambda argv: sys.exit(main(argv)), flags_parser=parse_flags)
