"""``python -m experiments.optimizer_state``: one run (see
:mod:`experiments.optimizer_state.experiment`)."""

from experiments.common.harness import script
from experiments.optimizer_state import experiment

__doc__ = experiment.__doc__  # what --help prints first

if __name__ == "__main__":
  script.run(experiment.OptimizerStateConfig, experiment.EXPERIMENT,
             experiment.train_and_evaluate)
