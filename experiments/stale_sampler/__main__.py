"""``python -m experiments.stale_sampler``: one run (see :mod:`experiments.stale_sampler.experiment`)."""

from experiments.common.harness import script
from experiments.stale_sampler import experiment

__doc__ = experiment.__doc__  # what --help prints first

if __name__ == "__main__":
  script.run(experiment.StaleSamplerConfig, experiment.EXPERIMENT, experiment.train_and_evaluate)
