"""``python -m experiments.scale_rules``: one run (see :mod:`experiments.scale_rules.experiment`)."""

from experiments.common.harness import script
from experiments.scale_rules import experiment

__doc__ = experiment.__doc__  # what --help prints first

if __name__ == "__main__":
  script.run(experiment.ScaleRulesConfig, experiment.EXPERIMENT,
             experiment.train_and_evaluate)
