"""numerics.rl: pure-JAX pieces of GRPO with a mismatched sampler.

A *sampler* (behaviour policy: possibly stale, tempered or lower precision) produced the
tokens and recorded their log-probs; the *learner* computes the loss. All per-token
arrays are ``[B, T]`` float32 with a ``mask`` ``[B, T]`` (1 = completion token that counts).

    advantages.group_advantages(rewards, group_size)       # GRPO advantages
    importance.TokenTIS(cap=2.0).weights(log_ratio, mask)   # TIS / MIS / IcePop weights
    importance.is_statistics(w, mask)                       # mean, ESS, clip/drop fractions
    policy_loss.grpo_loss(learner_logp, behaviour_logp, adv, mask,
                          correction=importance.TokenTIS(2.0), ...)
    mismatch.mismatch_kl(learner_logp, behaviour_logp, mask)
    sampler_copy.maybe_refresh(copy, learner_params, step, interval, export)

The weight-sync checks, serving plans and calibrated parity tolerances of MXFP8 RL live
with that paper (``experiments/mxfp8_rl/``): they are research infrastructure, not
arithmetic.
"""

from lowprec.numerics.rl import advantages
from lowprec.numerics.rl import importance
from lowprec.numerics.rl import mismatch
from lowprec.numerics.rl import policy_loss
from lowprec.numerics.rl import sampler_copy
from lowprec.numerics.rl.advantages import group_advantages
from lowprec.numerics.rl.importance import ISWeights, importance_weights, is_statistics, log_ratio
from lowprec.numerics.rl.mismatch import mismatch_kl
from lowprec.numerics.rl.policy_loss import grpo_loss, normalize_loss, ppo_clip_objective

__all__ = [
    "advantages", "importance", "mismatch", "policy_loss", "sampler_copy",
    "group_advantages", "ISWeights",
    "importance_weights", "is_statistics", "log_ratio", "mismatch_kl", "grpo_loss",
    "normalize_loss", "ppo_clip_objective",
]
