"""``python -m experiments.mxfp8_rl``: one run (see :mod:`experiments.mxfp8_rl.experiment`)."""

from experiments.common.harness import script
from experiments.mxfp8_rl import experiment

__doc__ = experiment.__doc__  # what --help prints first

if __name__ == "__main__":
  script.run(experiment.MXFP8RLConfig, experiment.EXPERIMENT, experiment.train_and_evaluate)
