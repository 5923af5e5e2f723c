"""The small mixture-of-experts char-LM on Shakespeare that ALTO and the
optimizer-state study train: the LM trainer's config with a top-k MoE feed-forward in
every block and the model and schedule those studies share.

A paper composes it with its own fields (ALTO: recipe options and de-oscillation;
optimizer_state: the stored moments' format); ``--num_experts=0`` gives the dense
control with feed-forward width ``d_ff``. Training, logging, checkpointing and resume
are :func:`experiments.common.trainers.lm_trainer.train_and_evaluate`'s.
"""

from __future__ import annotations

import dataclasses

from experiments.common.harness.config_flags import config_field
from experiments.common.harness.train_loop import periodic_field
from experiments.common.trainers import lm_trainer
from lowprec.models.transformer import TransformerConfig


@dataclasses.dataclass(frozen=True)
class MoELMConfig(lm_trainer.LMConfig):
  """An LM run with an MoE feed-forward in every block (the LM run's other fields)."""

  seq_len: int = config_field(64, "Tokens per training window.", domain="[1, inf)")
  d_model: int = config_field(128, "Model width.", domain="[1, inf)")
  num_layers: int = config_field(2, "Transformer blocks (each with an MoE feed-forward).",
                                 domain="[1, inf)")
  d_ff: int = config_field(128, "Hidden width of each expert.", domain="[1, inf)")
  num_steps: int = config_field(600, "Training steps.", domain="[1, inf)")
  learning_rate: float = config_field(3e-3, "Peak AdamW learning rate.", domain="(0, inf)")
  warmup_steps: int = config_field(50, "Linear warmup steps, then cosine decay to 10%.",
                                   domain="[0, inf)")
  eval_every: int = periodic_field("eval_every", 50)
  histogram_every: int = periodic_field("histogram_every", 0)
  num_experts: int = config_field(8, "Experts per MoE feed-forward (0: a dense feed-forward "
                                  "of width d_ff, the dense control of a derived study).",
                                  domain="[0, inf)")
  experts_per_token: int = config_field(2, "Top-k experts per token.", domain="[1, inf)")
  moe_capacity_factor: float = config_field(1.25, "Expert slots = factor * tokens * k / E.",
                                            domain="(0, inf)")
  moe_balance_coef: float = config_field(0.01, "Weight of the load-balancing loss.",
                                         domain="[0, inf)")

  def transformer_config(self, vocab_size: int) -> TransformerConfig:
    return dataclasses.replace(
        super().transformer_config(vocab_size), num_experts=self.num_experts,
        experts_per_token=self.experts_per_token,
        moe_capacity_factor=self.moe_capacity_factor,
        moe_balance_coef=self.moe_balance_coef)
