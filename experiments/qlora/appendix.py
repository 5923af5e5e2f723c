"""The qlora sweep's report appendix: memory by method, losses, the step-time benchmark.

The benchmark sections read ``bench_step.json`` (the sweep's model) and any other
``bench_step*.json`` in the sweep directory (written by ``python -m
experiments.qlora.bench_step [--out=...]``) and apply the speed claims' rules that
:mod:`experiments.qlora.sweeps` states (every round's ratio on one side of the bound).
"""

from __future__ import annotations

import json
import os
from typing import Any

from experiments.common.evidence.results import benchmark_provenance
from experiments.common.evidence.stats import format_spread
from experiments.common.sweeps.sweep_data import evaluation_metrics
from experiments.qlora.experiment import ARCH_FIELDS, QLoRAConfig

BENCH_FILE = "bench_step.json"
NO_SLOWDOWN = 1.02  # "removes the slowdown": at most 2% slower than bf16 LoRA



def _one(seeds: dict[int, dict[str, float]], tag: str) -> str:
  """The value of an exact metric (the same in every seed), or the spread if not."""
  values = {s.get(tag) for s in seeds.values()}
  if len(values) == 1 and None not in values:
    v = values.pop()
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3f}"
  return format_spread([s.get(tag) for s in seeds.values()], 3) + " (varies)"


def speed_verdict(ratios: list[float], bound: float, claim: str) -> str:
  """``slower``: held when every round's ratio > bound, opposite when every one is
  below; ``removes``: held when every round's ratio <= bound, opposite when every one
  is above."""
  if not ratios:
    return "not measured"
  if claim == "slower":
    if min(ratios) > bound:
      return "held"
    return "opposite" if max(ratios) < bound else "not decided"
  if max(ratios) <= bound:
    return "held"
  return "opposite" if min(ratios) > bound else "not decided"


def _per_round_ratios(bench: dict[str, Any], name: str) -> list[float]:
  rounds = bench["per_round_s"]
  return [t / b for t, b in zip(rounds[name], rounds[bench["baseline"]])]


def bench_command(bench: dict[str, Any], file_name: str) -> str:
  """The command that wrote ``bench`` (its flags rebuilt from what it recorded)."""
  default = QLoRAConfig()
  size = [f"{k}={v}" for k, v in bench["config"].items()
          if k in ARCH_FIELDS and v != getattr(default, k)]
  flags = [f"--rounds={bench['rounds']}", f"--repeats={bench['repeats']}"]
  flags += [f"--size={','.join(size)}"] if size else []
  flags += [] if "gemm" in bench else ["--gemms=false"]
  flags += [] if file_name == BENCH_FILE else [f"--out=<sweep_dir>/{file_name}"]
  return " ".join(["python -m experiments.qlora.bench_step"] + flags)


def bench_section(bench: dict[str, Any], file_name: str = BENCH_FILE) -> list[str]:
  """Markdown lines of the benchmark's tables and the speed claims' verdicts."""
  c = bench["config"]
  lines = [f"### `{file_name}`: d_model {c['d_model']}, d_ff {c['d_ff']}", "",
           f"`{bench_command(bench, file_name)}` ({benchmark_provenance(bench)}, "
           f"{bench['backend']}, {bench['cpus']} cores, jax {bench['jax']}): the "
           f"model (d_model {c['d_model']}, {c['num_layers']} blocks, d_ff {c['d_ff']}, "
           f"batch {c['batch_size']} x {c['seq_len']}), each method's jitted train step "
           f"timed interleaved, min of {bench['repeats']} calls per round, "
           f"{bench['rounds']} rounds (load average {bench['load_average_before'][0]} "
           f"before, {bench['load_average_after'][0]} after: the machine is shared). "
           f"Ratio to `{bench['baseline']}` per round: median [min, max].", "",
           "| method | ms / step | ratio to bf16_lora |", "|---|---|---|"]
  for name, s in bench["train_step"].items():
    lines.append(f"| `{name}` | {s['ms']:.1f} | {s['ratio']:.3f} [{s['ratio_min']:.3f}, "
                 f"{s['ratio_max']:.3f}] |")
  slow = _per_round_ratios(bench, "nf4_lora")
  hoisted = _per_round_ratios(bench, "nf4_lora_materialize")
  lines += ["", "| speed claim (rule stated in sweeps.py) | per-round ratios | verdict |",
            "|---|---|---|",
            f"| QLoRA trains more slowly than bf16 LoRA (`nf4_lora` / `bf16_lora` > 1 in "
            f"every round) | {', '.join(f'{r:.3f}' for r in slow)} | "
            f"**{speed_verdict(slow, 1.0, 'slower')}** |",
            f"| dequantizing once per step removes the slowdown (`nf4_lora_materialize` "
            f"/ `bf16_lora` <= {NO_SLOWDOWN} in every round) | "
            f"{', '.join(f'{r:.3f}' for r in hoisted)} | "
            f"**{speed_verdict(hoisted, NO_SLOWDOWN, 'removes')}** |", ""]
  if bench.get("gemm"):
    lines += ["Single projections (`x @ W`, bf16 operands, float32 accumulation; ratio to "
              "the bf16 weight's; *materialized*: the compiled NF4 function writes the "
              "dequantized weight out whole before the GEMM):", "",
              "| GEMM [rows, in, out] | bf16 W (ms) | NF4 dequantize + GEMM | float32 W, no "
              "conversion | NF4 dequantize alone | materialized |",
              "|---|---|---|---|---|---|"]
    for name, g in bench["gemm"].items():
      t = g["times"]
      cell = lambda k: f"{t[k]['ratio']:.2f} [{t[k]['ratio_min']:.2f}, {t[k]['ratio_max']:.2f}]"
      lines.append(f"| {name} {g['shape']} | {t['bf16_weight']['ms']:.3f} | "
                   f"{cell('nf4_dequantize_then_gemm')} | {cell('f32_weight_no_conversion')} "
                   f"| {cell('nf4_dequantize_only')} | {g['dequantize_materialized']} |")
    lines.append("")
  return lines


def qlora_appendix(sweep_dir: str) -> str:
  """Markdown: the memory and loss table by arm, then the benchmark (if committed)."""
  info, runs = evaluation_metrics(sweep_dir)
  col = lambda seeds, tag, d=4: format_spread([s.get(tag) for s in seeds.values()], d)
  lines = ["", "## Memory and loss by method", "",
           "Bytes as stored (`numerics.memory.tree_bytes`; exact, the same in every "
           "seed). *frozen*: the frozen base (NF4 codes + 8-bit scales + their float32 "
           "scales and offset, or bf16 kernels, plus the float32 embeddings, norms and "
           "head); *kernels*: the adapted projections' kernels as stored, and bits per "
           "weight; *trainable*: float32 trained parameters; *optimizer*: AdamW "
           "moments and counters. Losses: mean ± std over seeds, nats per character on "
           "Hamlet's last 15%; *before*: the frozen (for NF4: quantized) base.", "",
           "| arm | frozen | kernels (bits/w) | trainable params | trainable | optimizer "
           "| total | eval loss before | eval loss after |",
           "|---|---|---|---|---|---|---|---|---|"]
  for arm in [a["name"] for a in info["arms"]]:
    seeds = runs.get(arm, {})
    if not seeds:
      lines.append(f"| `{arm}` | no runs | | | | | | | |")
      continue
    lines.append(
        f"| `{arm}` | {_one(seeds, 'mem/frozen_bytes')} | "
        f"{_one(seeds, 'mem/target_kernel_bytes')} ({_one(seeds, 'mem/target_bits_per_weight')}) | "
        f"{_one(seeds, 'mem/trainable_params')} | {_one(seeds, 'mem/trainable_bytes')} | "
        f"{_one(seeds, 'mem/optimizer_bytes')} | "
        f"{_one(seeds, 'mem/weights_and_optimizer_bytes')} | "
        f"{col(seeds, 'finetune/eval_loss_before')} | {col(seeds, 'eval/loss')} |")
  base = {s.get("base/eval_loss") for seeds in runs.values() for s in seeds.values()}
  unchanged = [s.get("base/unchanged") for seeds in runs.values() for s in seeds.values()
               if s.get("mem/frozen_bytes", 0) > 0]
  lines += ["", f"The unquantized pretrained base's eval loss: "
            f"{', '.join(f'{b:.4f}' for b in sorted(x for x in base if x is not None))} "
            f"(one base for every run). Frozen base bit-identical after fine-tuning "
            f"(sha1 of every stored leaf) in {sum(u == 1.0 for u in unchanged)} of "
            f"{len(unchanged)} LoRA runs.", ""]
  benches = sorted(f for f in os.listdir(sweep_dir)
                   if f.startswith("bench_step") and f.endswith(".json"))
  if benches:
    lines += ["## Step time, measured in one process", ""]
  for name in benches:  # bench_step.json (the sweep's model), then larger ones
    with open(os.path.join(sweep_dir, name)) as f:
      lines += bench_section(json.load(f), name)
  if not benches:
    lines += [f"No `{BENCH_FILE}` in the sweep directory: run "
              "`python -m experiments.qlora.bench_step` for the step-time ratios.", ""]
  return "\n".join(lines)
