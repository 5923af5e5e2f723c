"""The ``alto`` sweep: ALTO's recipe ladder and negative results on a small MoE LM.

    python -m launch.sweep --sweep=alto --sweep_dir=experiments/alto/report --parallel=2

Scaled down from the paper (a ~1B-parameter MoE, 16k steps of GBS 16 on web text) to
fit about an hour on 2 shared CPU cores: a char-level MoE LM on Shakespeare (2 blocks,
d_model 128, 8 experts of width 128, top-2; 0.69M parameters), 500 steps of 32 x 64
tokens, 2 seeds. The de-oscillation schedule is scaled from (start 2000, period 200 of
16k steps) to start 60 of 500 (the same 12%) with period 25 (TetraJet-v2's default;
200/16k of 500 would be a 6-step window) and ALTO's ratio 4.

The appendix (:mod:`experiments.alto.appendix`) gives the convergence overhead,
validation loss at 50/75/100% of training and ALTO's operator-level SNR table.
"""

from __future__ import annotations

from experiments.alto.experiment import AltoConfig
from experiments.common.sweep_spec import Arm, Sweep

SEEDS = (0, 1)
BASELINE = "bf16"
_RHT_SR = {"recipe": "mxfp4"}


def alto() -> Sweep:
  """bf16; MXFP4 1d2d, + RHT, + RHT + SR, + de-oscillation; NVFP4; negative results."""
  # lr 1e-2 as in lm_recipes, where 3e-3 stayed on the bigram plateau at this length.
  base = AltoConfig(num_steps=500, warmup_steps=25, learning_rate=1e-2, seq_len=64,
                    batch_size=32, d_model=128, num_layers=2, num_heads=4, d_ff=128,
                    eval_every=25, eval_batches=8, log_every=10, checkpoint_every=0,
                    histogram_every=0, progress_every_s=30.0, deosc_start=60,
                    deosc_period=25, deosc_ratio=4.0)
  arms = (
      Arm("bf16", {"recipe": "bf16"}),
      Arm("mxfp4_1d2d", {"recipe": "mxfp4_1d2d"}),
      Arm("mxfp4_rht", {"recipe": "mxfp4_rht"}),
      Arm("mxfp4_rht_sr", dict(_RHT_SR)),
      Arm("mxfp4_rht_sr_deosc", {**_RHT_SR, "deoscillation": True}),
      Arm("nvfp4_rht_sr", {"recipe": "nvfp4"}),
      Arm("neg_dge", {**_RHT_SR, "recipe_options": "dge"}),
      Arm("neg_dynamic_clip", {**_RHT_SR, "recipe_options": "dynamic_clip"}),
      Arm("neg_static_clip", {**_RHT_SR, "recipe_options": "static_clip"}),
      Arm("neg_macro_block", {**_RHT_SR, "recipe_options": "macro_block"}),
  )
  return Sweep(
      name="alto", module="experiments.alto", base=base, arms=arms, seeds=SEEDS,
      baseline=BASELINE, metrics=("eval/loss", "eval/accuracy", "train/next_token_loss",
                                  "train/sown/moe_dropped"),
      higher_is_better=("eval/accuracy",), curves=("eval/loss", "train/next_token_loss"),
      appendix="experiments.alto.appendix:alto_appendix",
      description="ALTO in miniature: MXFP4 training recipes on a small MoE char-LM "
      "(Shakespeare). The recipe quantizes attention projections and the grouped expert "
      "GEMMs; router, attention products and LM head stay bf16. The neg_* arms add one "
      "option to mxfp4 + RHT + SR (ALTO's base for its negative results).",
      report_dir="experiments/alto/report")
