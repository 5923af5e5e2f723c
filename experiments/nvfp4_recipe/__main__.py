"""``python -m experiments.nvfp4_recipe``: one run (see its ``experiment`` module)."""

from experiments.common.harness import script
from experiments.nvfp4_recipe import experiment

__doc__ = experiment.__doc__  # what --help prints first

if __name__ == "__main__":
  script.run(experiment.Nvfp4RecipeConfig, experiment.EXPERIMENT,
             experiment.train_and_evaluate)
