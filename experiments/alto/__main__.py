"""``python -m experiments.alto``: one run (see :mod:`experiments.alto.experiment`)."""

from experiments.common.harness import script
from experiments.alto import experiment

__doc__ = experiment.__doc__  # what --help prints first

if __name__ == "__main__":
  script.run(experiment.AltoConfig, experiment.EXPERIMENT, experiment.train_and_evaluate)
