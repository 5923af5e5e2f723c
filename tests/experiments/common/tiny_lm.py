"""The tiny LM run the run-fault tests share: a few steps of a 1-layer, width-16 model."""

import sys

from experiments.common.harness.config_flags import config_to_flags
from experiments.common.harness.run_options import RunOptions
from experiments.lm import experiment as lm

TINY = lm.LMConfig(num_steps=8, warmup_steps=1, seq_len=16, batch_size=4, d_model=16,
                   num_layers=1, num_heads=2, d_ff=32, eval_every=4, eval_batches=1,
                   log_every=1, checkpoint_every=4, histogram_every=0, max_chars=20_000,
                   recipe="fp32")


def run(workdir, config=TINY, **options):
  """One run in this process (``options``: :class:`RunOptions` fields)."""
  return lm.train_and_evaluate(config, RunOptions(workdir=str(workdir), **options))


def cli(workdir, *flags, config=TINY):
  """The command line of the same run (run it from the repository root)."""
  return [sys.executable, "-m", "experiments.lm", *config_to_flags(config),
          f"--workdir={workdir}", *flags]
