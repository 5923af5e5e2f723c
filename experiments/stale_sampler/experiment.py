"""GRPO on multi-digit addition with a lagging sampler (Pan, "Cool the Sampler").

    python -m experiments.stale_sampler                                # TIS, K = 8
    python -m experiments.stale_sampler --refresh_interval=32 --sampler_temperature=0.8
    python -m experiments.stale_sampler --is_method=none --workdir=runs/stale/uncorrected

A small decoder LM is first fine-tuned with supervision on the task (cached under
``--pretrain_dir``). RL then runs ``num_updates`` GRPO updates on the shared RL loop
(:mod:`experiments.common.trainers.rl.loop`): the sampler is an explicit copy of the learner's
weights (in ``--sampler_dtype``), refreshed every ``refresh_interval`` updates; each
update samples a group per problem from the (stale) sampler at
``sampler_temperature`` (recording the tempered behaviour log-probs) and takes one
learner step. The learner's policy, like the reference and the importance weights, is
at temperature 1 (decoupled cooling).

Correction arms: ``is_method=token_tis`` (w = min(pi / mu, C) on an on-policy ratio),
``none`` with ``ratio_against=learner`` (no correction: the stale samples are treated
as on-policy), ``none`` with ``ratio_against=sampler`` (PPO clip against the recorded
log-probs), ``masked_is``/``icepop``/``sequence_tis``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from experiments.common.harness.run_options import RunOptions
from experiments.common.trainers.rl import loop
from experiments.common.trainers.rl.config import RLConfig

EXPERIMENT = "stale_sampler"


@dataclasses.dataclass(frozen=True)
class StaleSamplerConfig(RLConfig):
  """Pan's run: the shared RL config with its defaults (TIS, K = 8, lr 1e-4)."""


def train_and_evaluate(config: StaleSamplerConfig, options: RunOptions) -> dict[str, Any]:
  """One stale_sampler run; returns its summary."""
  return loop.train_and_evaluate(config, options, experiment=EXPERIMENT)
