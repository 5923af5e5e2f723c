"""The memory budget of one MoE training step, line by line: is the optimizer state the
largest line? (issue 50: the paper's "optimizer state is the largest single line item in
the memory budget of mixture-of-experts training", declared here before measuring)

    python -m experiments.optimizer_state.memory_budget             # measure and write
    python -m experiments.optimizer_state.memory_budget --report_only

The ``optimizer_state`` sweep's MoE char-LM (its base config: d_model 64, 2 blocks, 8
experts of width 128, top-2, batch 32 x 64 tokens) and the compiled training step the
runs execute (:func:`experiments.common.harness.train_loop.make_train_step` over
:func:`experiments.common.trainers.lm_trainer.build_lm`), compiled by XLA for this CPU. Lines:

* weights and gradients: the float32 parameters' bytes (the gradient tree is the same);
* optimizer state: the bytes of the AdamW state pytree (:func:`numerics.memory.tree_bytes`)
  for each moment format of the sweep;
* activations and workspace: the compiled step's temporary buffers
  (``compiled.memory_analysis().temp_size_in_bytes``): what the step holds between the
  forward and backward passes plus scratch, as XLA's CPU buffer assignment lays it out.
  A GPU or TPU compiler assigns buffers differently: this line is the CPU compiler's
  figure, an estimate of an accelerator's.

**Claim (declared before the first measurement):** with float32 AdamW moments, at the
sweep's batch, the optimizer state is larger than each other line (weights, gradients,
activations and workspace). Bytes are exact for a given compiler, so the verdict is a
comparison, not a statistic. Beside it, the same lines at batch 8, 128 and 512 (the
activations grow with the batch; the state does not), and the state under each moment
format the sweep compares.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
from absl import app, flags

from experiments.common.data import shakespeare
from experiments.common.harness import run_metadata
from experiments.common.harness.config_flags import parse_flags
from experiments.common.harness.repo_paths import REPO_DIR
from experiments.common.harness.train_loop import init_train_state, make_train_step
from experiments.common.trainers import lm_trainer
from experiments.optimizer_state import sweeps
from lowprec.numerics import memory

OUT_DIR = os.path.join(REPO_DIR, "experiments", "optimizer_state", "report_memory")
JSON_FILE = "memory_budget.json"
BATCHES = (8, 32, 128, 512)
FORMATS = ("fp32", "bf16", "dynamic8", "dynamic4")
CLAIM = ("with float32 AdamW moments, at the sweep's batch, the optimizer state is the "
         "largest line of the training step's memory (larger than the weights, the "
         "gradients, and the step's activations and workspace)")


def step_lines(config: Any, vocab_size: int) -> dict[str, int]:
  """Bytes of each memory line of ``config``'s compiled training step (module doc)."""
  parts = lm_trainer.build_lm(config, vocab_size)
  optimizer = config.optimizer()

  def init():
    params, quant_state = parts.init(jax.random.PRNGKey(0))
    return init_train_state(params, optimizer, quant_state)

  state = jax.eval_shape(init)
  if jax.tree.leaves(state.quant_state):  # no line of the budget holds it
    raise ValueError("a recipe with quantization state is not measured here")
  batch = {k: jax.ShapeDtypeStruct((config.batch_size, config.seq_len), jnp.int32)
           for k in ("inputs", "targets")}
  key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
  step = make_train_step(parts.loss_fn, optimizer, config.optimizer_metrics)
  analysis = step.trace(state, batch, key).lower().compile().memory_analysis()
  weights = memory.tree_bytes(state.params)
  return {"weights": weights, "gradients": weights,
          "optimizer_state": memory.tree_bytes(state.opt_state),
          "activations_and_workspace": int(analysis.temp_size_in_bytes)}


def measure() -> dict[str, Any]:
  """Every line at each batch of :data:`BATCHES` (float32 moments) and the state under
  each format of :data:`FORMATS` at the sweep's batch."""
  base = sweeps.optimizer_state().base
  vocab = shakespeare.load_splits(base.tokenization, base.validation_fraction,
                                  base.max_chars).vocab.size
  by_batch = {b: step_lines(dataclasses.replace(base, batch_size=b, moment_format="fp32"),
                            vocab) for b in BATCHES}
  by_format = {f: step_lines(dataclasses.replace(base, moment_format=f), vocab)
               for f in FORMATS}
  return {"config": {"d_model": base.d_model, "num_layers": base.num_layers,
                     "num_experts": base.num_experts, "d_ff": base.d_ff,
                     "batch_size": base.batch_size, "seq_len": base.seq_len,
                     "vocab_size": vocab},
          "claim": CLAIM, "by_batch": {str(b): v for b, v in by_batch.items()},
          "by_format": by_format, "git": run_metadata.git_state(),
          "backend": jax.default_backend(), "jax": jax.__version__}


def verdict(lines: dict[str, int]) -> str:
  """``held`` when the optimizer state exceeds every other line, else ``not held``
  naming the larger lines."""
  larger = [k.replace("_", " ") for k, v in lines.items() if k != "optimizer_state"
            and v >= lines["optimizer_state"]]
  return "held" if not larger else "not held (" + ", ".join(larger) + " as large or larger)"


def _mb(n: int) -> str:
  return f"{n / 1e6:.3f}"


def build_report(out_dir: str) -> str:
  """Writes ``<out_dir>/REPORT.md`` from the JSON (and ``FINDINGS.md``); returns its path."""
  with open(os.path.join(out_dir, JSON_FILE)) as f:
    record = json.load(f)
  cfg, git = record["config"], record["git"]
  batch = str(cfg["batch_size"])
  at_sweep = record["by_batch"][batch]
  lines = [
      "# The memory budget of an MoE training step (`optimizer_state`)", "",
      "Is the optimizer state the largest line of the memory budget of MoE training "
      "(arXiv 2607.19058, abstract)? The `optimizer_state` sweep's MoE char-LM "
      f"(d_model {cfg['d_model']}, {cfg['num_layers']} blocks, {cfg['num_experts']} "
      f"experts of width {cfg['d_ff']}, top-2, vocabulary {cfg['vocab_size']}) and its "
      "compiled training step; declared in `experiments/optimizer_state/memory_budget.py` "
      "before the first measurement.", "",
      f"- git commit `{git['commit']}`" + (" (**dirty**)" if git.get("dirty") else
                                           " (clean tree)"),
      f"- {record['backend']}, jax {record['jax']}: *activations and workspace* are "
      "XLA's CPU buffer assignment for the step (`memory_analysis().temp_size_in_bytes`), "
      "an estimate of what an accelerator's compiler would allocate", "",
      "## Claim", "",
      "| claim | comparison | measured (MB) | verdict |", "|---|---|---|---|",
      f"| {CLAIM} | optimizer state vs each other line, batch {batch} x "
      f"{cfg['seq_len']}, float32 moments | " + ", ".join(
          f"{k.replace('_', ' ')} {_mb(v)}" for k, v in at_sweep.items())
      + f" | **{verdict(at_sweep)}** |", "",
      "## Every line by batch (float32 moments)", "",
      "| batch | weights MB | gradients MB | optimizer state MB | activations and "
      "workspace MB | largest |", "|---|---|---|---|---|---|"]
  for b, v in sorted(record["by_batch"].items(), key=lambda kv: int(kv[0])):
    largest = max(v, key=v.get).replace("_", " ")
    lines.append(f"| {b} x {cfg['seq_len']} | {_mb(v['weights'])} | "
                 f"{_mb(v['gradients'])} | {_mb(v['optimizer_state'])} | "
                 f"{_mb(v['activations_and_workspace'])} | {largest} |")
  lines += ["", f"## The optimizer state by moment format (batch {batch})", "",
            "| moments | optimizer state MB | share of the four lines | largest |",
            "|---|---|---|---|"]
  for fmt, v in record["by_format"].items():
    share = v["optimizer_state"] / sum(v.values())
    lines.append(f"| `{fmt}` | {_mb(v['optimizer_state'])} | {share:.1%} | "
                 f"{max(v, key=v.get).replace('_', ' ')} |")
  lines += ["", "## Reproduce", "",
            "`python -m experiments.optimizer_state.memory_budget` measures again "
            "(a minute of compiling); `python -m experiments.optimizer_state.memory_budget "
            "--report_only` rebuilds this report from the committed JSON.", ""]
  findings = os.path.join(out_dir, "FINDINGS.md")
  if os.path.exists(findings):
    with open(findings) as f:
      lines += [f.read().rstrip("\n"), ""]
  path = os.path.join(out_dir, "REPORT.md")
  with open(path, "w") as f:
    f.write("\n".join(lines))
  return path


def define_flags() -> None:
  flags.DEFINE_string("out_dir", OUT_DIR, "Where the JSON and REPORT.md go.")
  flags.DEFINE_bool("report_only", False, "Rebuild REPORT.md from the JSON; measure nothing.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  out_dir = flags.FLAGS.out_dir
  if not flags.FLAGS.report_only:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, JSON_FILE), "w") as f:
      json.dump(measure(), f, indent=2, sort_keys=True)
  print(build_report(out_dir))


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=parse_flags)
