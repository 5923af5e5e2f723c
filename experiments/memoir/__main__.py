"""``python -m experiments.memoir``: one run (see :mod:`experiments.memoir.experiment`)."""

from experiments.common.harness import script
from experiments.memoir import experiment

__doc__ = experiment.__doc__  # what --help prints first

if __name__ == "__main__":
  script.run(experiment.MemoirExperimentConfig, experiment.EXPERIMENT,
             experiment.train_and_evaluate)
