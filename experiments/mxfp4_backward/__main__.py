"""``python -m experiments.mxfp4_backward``: one run (see :mod:`experiments.mxfp4_backward.experiment`)."""

from experiments.common.harness import script
from experiments.mxfp4_backward import experiment

__doc__ = experiment.__doc__  # what --help prints first

if __name__ == "__main__":
  script.run(experiment.Mxfp4BackwardConfig, experiment.EXPERIMENT,
             experiment.train_and_evaluate)
