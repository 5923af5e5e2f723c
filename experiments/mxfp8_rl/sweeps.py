"""The ``mxfp8_rl`` sweep: learner x sampler precision in {bf16, mxfp8}^2.

    python -m launch.sweep --sweep=mxfp8_rl --sweep_dir=experiments/mxfp8_rl/report \
        --parallel=2

GRPO on 3-digit addition (:mod:`experiments.mxfp8_rl`), sampler synced every update,
token-level TIS, the seven weight-sync checks at every sync. 3 seeds, 128 updates.
The appendix (:mod:`experiments.mxfp8_rl.appendix`) tabulates the sampler-learner
mismatch over training (on the sampled tokens, and right after each sync on the fixed
probe batch) and the reward.
"""

from __future__ import annotations

from experiments.common.sweep_spec import Arm, Sweep
from experiments.mxfp8_rl.experiment import MXFP8RLConfig

SEEDS = (0, 1, 2)
PAIRS = (("bf16", "bf16"), ("mxfp8", "mxfp8"), ("bf16", "mxfp8"), ("mxfp8", "bf16"))
BASELINE = "L-bf16_S-bf16"


def mxfp8_rl() -> Sweep:
  """The four (learner, sampler) recipe pairs, 3 seeds."""
  base = MXFP8RLConfig(num_updates=128, eval_every=16)
  arms = tuple(Arm(f"L-{lr}_S-{sr}", {"learner_recipe": lr, "sampler_recipe": sr})
               for lr, sr in PAIRS)
  return Sweep(
      name="mxfp8_rl", module="experiments.mxfp8_rl", base=base, arms=arms, seeds=SEEDS,
      baseline=BASELINE,
      metrics=("train/mismatch_k3", "sync/k3", "reward/mean_over_training",
               "eval/greedy_accuracy"),
      higher_is_better=("reward/mean_over_training", "eval/greedy_accuracy"),
      curves=("train/mismatch_k3", "sync/k3", "eval/greedy_accuracy"),
      appendix="experiments.mxfp8_rl.appendix:mxfp8_rl_appendix",
      description="MXFP8 RL in miniature: the learner trains in one recipe and the "
      "sampler serves in another (MXFP8: the projections' kernels quantized at each "
      "sync, 1x32 blocks along the contraction axis; head bf16; embeddings and norms "
      "float32). Arms are L-<learner>_S-<sampler>.",
      report_dir="experiments/mxfp8_rl/report")
