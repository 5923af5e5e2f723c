"""``python -m experiments.qlora``: one run (see :mod:`experiments.qlora.experiment`)."""

from experiments.common.harness import script
from experiments.qlora import experiment

__doc__ = experiment.__doc__  # what --help prints first

if __name__ == "__main__":
  script.run(experiment.QLoRAConfig, experiment.EXPERIMENT, experiment.train_and_evaluate)
