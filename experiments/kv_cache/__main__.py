"""``python -m experiments.kv_cache``: one run (see :mod:`experiments.kv_cache.experiment`)."""

from experiments.common.harness import script
from experiments.kv_cache import experiment

__doc__ = experiment.__doc__  # what --help prints first

if __name__ == "__main__":
  script.run(experiment.KVCacheConfig, experiment.EXPERIMENT, experiment.train_and_evaluate)
