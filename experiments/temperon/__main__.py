"""``python -m experiments.temperon``: one run (see :mod:`experiments.temperon.experiment`)."""

from experiments.common.harness import script
from experiments.temperon import experiment

__doc__ = experiment.__doc__  # what --help prints first

if __name__ == "__main__":
  script.run(experiment.TemperonConfig, experiment.EXPERIMENT, experiment.train_and_evaluate)
