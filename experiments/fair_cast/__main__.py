"""``python -m experiments.fair_cast``: one run (see :mod:`experiments.fair_cast.experiment`)."""

from experiments.common.harness import script
from experiments.fair_cast import experiment

__doc__ = experiment.__doc__  # what --help prints first

if __name__ == "__main__":
  script.run(experiment.FairCastConfig, experiment.EXPERIMENT, experiment.train_and_evaluate)
