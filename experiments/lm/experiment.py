"""Char-level decoder-only transformer LM on Shakespeare, with a ``--recipe`` per run.

    python -m experiments.lm                   # ~6 min on 2 CPU cores (measured)
    python -m experiments.lm --recipe=mxfp8    # into runs/lm/recipe=mxfp8
    python -m experiments.lm --recipe=mxfp8 --resume   # continue a killed run

Writes TensorBoard events, ``config.json`` (config + git commit), orbax checkpoints under
``<workdir>/checkpoints`` and, when the run completes, one row in ``--results_file``.
The default workdir is ``runs/lm/<flags that differ from the defaults>``. The trainer
is the harness's :mod:`experiments.common.trainers.lm_trainer`, which ALTO, the optimizer-state
study and QLoRA build on too.
"""

from __future__ import annotations

from typing import Any

from experiments.common.harness.run_options import RunOptions
from experiments.common.trainers import lm_trainer
from experiments.common.trainers.lm_trainer import LMConfig

EXPERIMENT = "lm"
__all__ = ["EXPERIMENT", "LMConfig", "train_and_evaluate"]


def train_and_evaluate(config: LMConfig, options: RunOptions) -> dict[str, Any]:
  """Trains and evaluates one LM run; returns its summary (metrics and paths)."""
  return lm_trainer.train_and_evaluate(config, options, experiment=EXPERIMENT)
