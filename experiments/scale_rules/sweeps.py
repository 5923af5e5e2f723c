"""The scale-rule study's sweeps (issue 54): MX scale rules and NVFP4 as post-training
quantization of the char-level LM.

    python -m launch.sweep --sweep=scale_rules_ptq --sweep_dir=experiments/scale_rules/report
"""

from __future__ import annotations

from experiments.common.sweeps.sequential import SequentialPlan
from experiments.common.sweeps.sweep_spec import Arm, Claim, Sweep
from experiments.scale_rules.experiment import ScaleRulesConfig

# The base: experiments.lm's lm_recipes model (d 64, 2 layers, 800 steps at lr 1e-2,
# which gets past the bigram plateau), trained in float32; 16 validation batches of
# 32 windows of 64 characters.
BASE = ScaleRulesConfig(num_steps=800, warmup_steps=50, learning_rate=1e-2, seq_len=64,
                        d_model=64, num_layers=2, num_heads=4, d_ff=256, eval_batches=16)
LOSS = "eval/loss"
BASELINE = "bf16"
ARMS = (
    Arm("bf16", {"fmt": "bf16", "scale_rule": "none"}),
    Arm("mxfp8_floor", {"fmt": "e4m3", "scale_rule": "floor"}),
    Arm("mxfp8_rceil", {"fmt": "e4m3", "scale_rule": "rceil"}),
    Arm("mxfp8_qwix", {"fmt": "e4m3", "scale_rule": "qwix"}),
    Arm("mxfp4_floor", {"fmt": "e2m1", "scale_rule": "floor"}),
    Arm("mxfp4_rceil", {"fmt": "e2m1", "scale_rule": "rceil"}),
    Arm("mxfp4_even", {"fmt": "e2m1", "scale_rule": "even"}),
    Arm("mxfp4_qwix", {"fmt": "e2m1", "scale_rule": "qwix"}),
    Arm("nvfp4", {"fmt": "nvfp4", "scale_rule": "none"}),
)
# Fresh seeds (no other sweep trains this base from them); 0 and 1 were the
# calibration probe (every arm on their bases), never evaluated here.
SEEDS = tuple(range(501, 517))
CALIBRATION_SEEDS = (0, 1)
PLAN = SequentialPlan(batch=8, cap=16)  # looks at 8 and 16 seeds
QWIX_MARGIN = 0.002
_MXFP8 = "Mishra et al., Recipes for Pre-training LLMs with MXFP8 (arXiv 2506.08027)"
_THREAD = ("an inference engine's issue thread: three MXFP4 scale rules, perplexities "
           "21.94 / 22.50 / 23.54, floor worst (secondary)")
_NVFP4 = "NVIDIA, Pretraining LLMs with NVFP4 (arXiv 2509.25149); arXiv 2603.08713"
CLAIMS = (
    Claim("MXFP8: rounding the scale up (rceil) loses less than OCP's floor", "better",
          "mxfp8_rceil", "mxfp8_floor", LOSS, source=_MXFP8),
    Claim("MXFP4: rceil loses less than OCP's floor", "better", "mxfp4_rceil",
          "mxfp4_floor", LOSS, source=_THREAD),
    Claim("MXFP4: the nearest power of two (even) loses less than rceil", "better",
          "mxfp4_even", "mxfp4_rceil", LOSS, source=_THREAD),
    Claim("MXFP4: qwix's scale is rceil's (equivalent within 0.002 nats)", "equivalent",
          "mxfp4_qwix", "mxfp4_rceil", LOSS, margin=QWIX_MARGIN,
          source="qwix 0.1.8's compute_scale_zero_point (docs/api.md, Conventions)"),
    Claim("MXFP8: qwix's scale is rceil's (equivalent within 0.002 nats)", "equivalent",
          "mxfp8_qwix", "mxfp8_rceil", LOSS, margin=QWIX_MARGIN,
          source="qwix 0.1.8's compute_scale_zero_point (docs/api.md, Conventions)"),
    Claim("NVFP4 (E4M3 scales over 16) loses less than MXFP4 at its better OCP rule "
          "(rceil)", "better", "nvfp4", "mxfp4_rceil", LOSS, source=_NVFP4),
)


def scale_rules_ptq() -> Sweep:
  """MX scale rules and NVFP4 as post-training quantization of the char LM."""
  return Sweep(
      name="scale_rules_ptq", module="experiments.scale_rules", base=BASE, arms=ARMS,
      seeds=SEEDS, calibration_seeds=CALIBRATION_SEEDS, baseline=BASELINE,
      claims=CLAIMS, sequential=PLAN,
      metrics=(LOSS, "eval/accuracy", "ptq/loss_increase", "ptq/saturated_act",
               "ptq/saturated_weight", "ptq/sqnr_db_act", "ptq/sqnr_db_weight"),
      higher_is_better=("eval/accuracy", "ptq/sqnr_db_act", "ptq/sqnr_db_weight"),
      curves=(),
      description=(
          "Which block-scale rule loses least when the same trained weights are "
          "quantized? (issue 54; ../shared/papers-field.md, Scale rules.) Post-training "
          "quantization of the char-level LM (`experiments/lm`'s lm_recipes model: d 64, "
          "2 layers, 800 float32 steps; one base per seed, cached): every projection of "
          "the blocks (both operands) fake-quantized to MXFP8 (e4m3) or MXFP4 (e2m1) "
          "with E8M0 scales over 32 elements under OCP's floor, rceil, the nearest "
          "power of two (even) and qwix 0.1.8's rule, or to NVFP4 (TE convention); the "
          "attention products and head bf16; the baseline the same model with bf16 "
          "projections. Metric: validation loss on 16 x 32 fixed windows (and "
          "saturation and SQNR of the quantized operands). **Claims** (declared "
          "before any run): the ordering of the rules, as better/worse by the paired "
          "difference (either direction decides); qwix's rule equivalent to rceil "
          f"within {QWIX_MARGIN} nats (it differs only at exact powers of two); NVFP4 "
          "beats MXFP4-rceil. **Plan**: O'Brien-Fleming-type spending at level 0.05, "
          "looks at 8 and 16 fresh seeds (501-516). **Sizing** (calibration seeds 0 "
          "and 1, never evaluated): loss increases over bf16 of +0.016/+0.020 "
          "(MXFP8 floor), +0.011/+0.013 (rceil), +0.198/+0.230 (MXFP4 floor), "
          "+0.197/+0.244 (rceil), +0.174/+0.216 (even), +0.120/+0.129 (NVFP4); "
          "qwix's rule gave rceil's loss bit for bit on both seeds and both formats "
          "(the powers of two where they differ did not occur): "
          "MXFP8 rceil−floor −0.005/−0.007 and NVFP4−MXFP4 about −0.08/−0.12 "
          "should decide at the first look; MXFP4 rceil−floor changed sign between the "
          "two seeds (−0.002/+0.015) and may stay undecided. A base trains in 42 s, "
          "an evaluation run takes 5-15 s with its process start: 9 arms x 16 seeds "
          "= 144 runs and 16 bases, about 25-35 min at --parallel=2. The model is "
          "the lm sweep's; nothing was shrunk."),
      report_dir="experiments/scale_rules/report")
