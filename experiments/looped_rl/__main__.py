"""``python -m experiments.looped_rl``: one run (see :mod:`experiments.looped_rl.experiment`)."""

from experiments.common.harness import script
from experiments.looped_rl import experiment

__doc__ = experiment.__doc__  # what --help prints first

if __name__ == "__main__":
  script.run(experiment.LoopedRLConfig, experiment.EXPERIMENT, experiment.train_and_evaluate)
