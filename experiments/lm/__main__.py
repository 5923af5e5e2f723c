"""``python -m experiments.lm``: one run (see :mod:`experiments.lm.experiment`)."""

from experiments.common.harness import script
from experiments.lm import experiment

__doc__ = experiment.__doc__  # what --help prints first

if __name__ == "__main__":
  script.run(experiment.LMConfig, experiment.EXPERIMENT, experiment.train_and_evaluate)
