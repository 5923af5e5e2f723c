"""The char-level LM's sweeps: recipes compared on one small model.

    python -m launch.sweep --sweep=lm_recipes --sweep_dir=experiments/lm/report
"""

from __future__ import annotations

from experiments.common.sweeps.sweep_spec import Arm, Sweep
from experiments.lm.experiment import LMConfig


def lm_recipes() -> Sweep:
  """bf16 vs mxfp8 training of the char-level LM, 2 seeds."""
  return Sweep(
      name="lm_recipes", module="experiments.lm",
      # Smaller than the experiment's default so 4 runs finish in minutes on 2 CPU cores
      # (mxfp8's quantize/dequantize costs several times a bf16 GEMM there).
      # lr 1e-2 was measured to get past the bigram plateau (eval loss 1.86 at step 800
      # vs 2.19 with 3e-3) in the same steps.
      base=LMConfig(num_steps=800, warmup_steps=50, learning_rate=1e-2, seq_len=64,
                    d_model=64, num_layers=2, num_heads=4, d_ff=256, eval_every=200,
                    checkpoint_every=400, histogram_every=400, log_every=10),
      arms=(Arm("bf16", {"recipe": "bf16"}), Arm("mxfp8", {"recipe": "mxfp8"})),
      seeds=(0, 1), baseline="bf16",
      metrics=("eval/loss", "eval/accuracy", "train/loss"),
      higher_is_better=("eval/accuracy",),
      description="Does mxfp8 (MX block-scaled e4m3) training match bf16 on a tiny LM?",
      report_dir="experiments/lm/report")


def lm_builtin_recipes() -> Sweep:
  """fp32 vs bf16 on a tiny LM, 2 seeds: a quick check of the whole launch/report path."""
  return Sweep(
      name="lm_builtin_recipes", module="experiments.lm",
      base=LMConfig(num_steps=40, warmup_steps=5, seq_len=32, batch_size=8, d_model=32,
                    num_layers=1, num_heads=2, d_ff=64, eval_every=20, eval_batches=2,
                    log_every=5, checkpoint_every=20, histogram_every=20,
                    max_chars=200_000, progress_every_s=5.0),
      arms=(Arm("fp32", {"recipe": "fp32"}), Arm("bf16", {"recipe": "bf16"})),
      seeds=(0, 1), baseline="fp32",
      metrics=("eval/loss", "eval/accuracy", "train/loss"),
      higher_is_better=("eval/accuracy",),
      description="fp32 vs bf16; exercises the whole launch/report path quickly.")
