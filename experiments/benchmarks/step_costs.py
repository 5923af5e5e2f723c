"""The per-target cost table of the LM's compiled training step: estimates, not timings.

Written by ``python -m experiments.benchmarks.step_compile --costs=FILE`` (see
docs/benchmarks/step_costs.md). For each one-device target and recipe: the compiled
step's FLOPs and HBM bytes (XLA's cost analysis, plus the Pallas kernels' and library
GEMMs' operand and result bytes, :func:`experiments.benchmarks.step_compile._costs`)
and the roofline estimate ``max(FLOPs / bf16 peak, bytes / HBM bandwidth)`` with the
figures of :data:`numerics.kernels.compile_check.TARGETS`, divided by the bf16 step's
estimate on the same target.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, Sequence

from lowprec.numerics.kernels import compile_check


def estimate_us(result: dict, target: compile_check.Target) -> tuple[float, str]:
  """The roofline step time in microseconds and what bounds it ("compute"/"memory")."""
  compute = result["flops"] / target.bf16_flops_per_s
  memory = result["bytes"] / target.hbm_bytes_per_s
  return 1e6 * max(compute, memory), "compute" if compute >= memory else "memory"


def _fmt(x: float) -> str:
  return f"{x:.3g}" if x < 1e4 else f"{x:.2e}".replace("e+0", "e").replace("e+", "e")


def target_table(results: Sequence[dict], target: compile_check.Target) -> list[str]:
  """The markdown rows of one target: recipe | FLOPs | bytes | ... | / bf16."""
  rows = [r for r in results if r["target"] == target.name and r["layout"] == "single"]
  base = next((r for r in rows if r["recipe"] == "bf16" and not r["native"] and r["ok"]),
              None)
  base_us = estimate_us(base, target)[0] if base else None
  lines = [f"### {target.name}", "",
           "| recipe | GEMM | FLOPs | HBM bytes | of which kernels | estimate, us | "
           "bound | / bf16 (estimate) |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    gemm = "native" if r["native"] else "emulated"
    if not r["ok"]:
      lines.append(f"| {r['recipe']} | {gemm} | does not compile: {r['error']} "
                   "| | | | | |")
      continue
    us, bound = estimate_us(r, target)
    ratio = f"{us / base_us:.2f}" if base_us else "-"
    lines.append(f"| {r['recipe']} | {gemm} | {_fmt(r['flops'])} | {_fmt(r['bytes'])} | "
                 f"{_fmt(r['kernel_bytes'])} | {us:.1f} | {bound} | {ratio} |")
  return lines + [""]


def markdown(results: Sequence[dict], *, size: Any, command: str, jax_version: str,
             date: str | None = None) -> str:
  """The whole document: how the figures were made, then one table per target."""
  date = date or datetime.date.today().isoformat()
  size_text = ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(size).items())
  sources = sorted({r["cost_source"] for r in results if r.get("cost_source")})
  lines = [
      "# Estimated step cost per target (deviceless compiles; estimates, not timings)",
      "",
      f"Made on {date} with jax {jax_version}, without a device, by:",
      "",
      "```bash",
      command,
      "```",
      "",
      "Every figure below is an **estimate** from the compiled program, not a "
      "measurement on the accelerator. The program: the LM's whole training step "
      "(`experiments/benchmarks/step_compile.py`: forward, backward, AdamW; "
      f"{size_text}; the Pallas kernels on), compiled for each target by the real "
      "backend compiler. FLOPs and HBM bytes per step: "
      + "; ".join(sources) + " (GPU: XLA's cost analysis returns nothing without a "
      "device, so the generic analysis reads the optimized GPU module), plus the "
      "operand and result bytes of every custom call (the Pallas kernels, which XLA "
      "counts as unknown, in the column *of which kernels*; cuBLAS calls with their "
      "GEMM FLOPs). Bytes count each instruction's operands and results, as if nothing "
      "stayed on chip; a loop body counts once.",
      "",
      "Estimate = max(FLOPs / dense BF16 peak, bytes / HBM bandwidth), the roofline of "
      "`numerics/kernels/compile_check.py` (`TARGETS`). Every FLOP is priced at the "
      "BF16 peak: float32 GEMMs (`fp32`; `fp8` and `fp8_delayed` emulate in float32) "
      "run slower than that, native FP8 GEMMs faster (2x on H200 and B200), so the "
      "ratios of compute-bound rows are rough. *Emulated* GEMMs quantize, dequantize "
      "and multiply in bf16/float32 (`qdot`); *native* ones (`recipes.with_native_gemm`) "
      "take the quantized operands in their storage type on the GPU targets.",
      "",
      "Targets: " + "; ".join(t.source for t in compile_check.TARGETS) + ".",
      ""]
  for target in compile_check.TARGETS:
    if any(r["target"] == target.name for r in results):
      lines += target_table(results, target)
  return "\n".join(lines).rstrip() + "\n"


def write(path: str, results: Sequence[dict], *, size: Any, command: str) -> None:
  """Writes :func:`markdown` to ``path``."""
  import jax  # pylint: disable=g-import-not-at-top
  with open(path, "w") as f:
    f.write(markdown(results, size=size, command=command, jax_version=jax.__version__))
