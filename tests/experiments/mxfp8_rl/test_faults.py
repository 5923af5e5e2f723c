"""experiments.mxfp8_rl: faults planted through the sync path, caught at run time by the
intended check in record mode (tiny runs)."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import optax
import pytest

from experiments.common.evidence.tensorboard_reader import read_scalars
from experiments.common.harness.run_options import RunOptions
from experiments.common.trainers.rl.config import make_model
from experiments.common.trainers.rl.warm_start import warm_start
from experiments.mxfp8_rl import experiment as mxfp8_rl
from experiments.mxfp8_rl.sweeps import INTENDED_CHECK
from experiments.mxfp8_rl import weight_sync
from tests import compile_cache

FAULT_UPDATE = 2


class Drifting(mxfp8_rl.MXFP8RLConfig):
  """Every update moves every master weight by +0.01 whatever the gradient (a tiny
  policy often draws groups of equal rewards: zero advantages, no step), so that
  consecutive syncs always differ."""

  def optimizer(self):
    return optax.GradientTransformation(
        lambda params: optax.EmptyState(),
        lambda grads, state, params=None: (jax.tree.map(
            lambda g: jnp.full_like(g, 0.01), grads), state))


# The eight runs here trace the same loop (a planted fault changes only the export and
# the host-side checks); XLA compiles were ~12 of a fault run's ~14 s. The faulty
# exports still compile: their programs differ.
_compile_each_program_once = compile_cache.module_fixture()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  return Drifting(
      digits=2, d_model=48, num_layers=1, num_heads=2, d_ff=64, pretrain_steps=150,
      pretrain_batch=32, pretrain_lr=1e-2, num_updates=4, prompts_per_update=4,
      group_size=4, learning_rate=1e-3, eval_every=4, eval_problems=32, probe_problems=4,
      sync_checks="record", fault_update=FAULT_UPDATE,
      pretrain_dir=str(tmp_path_factory.mktemp("pretrain")))


def _run(config, workdir):
  summary = mxfp8_rl.train_and_evaluate(config, RunOptions(workdir=str(workdir)))
  assert summary["completed"]
  return summary["metrics"], read_scalars(str(workdir))


def test_clean_run_records_every_statistic_and_fires_nothing(tiny, tmp_path):
  metrics, s = _run(tiny, tmp_path / "clean")
  for check in weight_sync.CHECKS:
    assert [v for _, v in s[f"sync/fired/{check}"]] == [0.0] * 4, check
    assert metrics[f"faults/fired_fraction/{check}"] == 0.0
    assert math.isnan(metrics[f"faults/first_fired/{check}"])
  assert [v for _, v in s["sync/stat/bitwise_differing"]] == [0.0] * 4
  assert [v for _, v in s["sync/stat/version_offset"]] == [0.0] * 4
  assert [v for _, v in s["sync/stat/parity_k3"]] == [0.0] * 4  # same recipe: exact
  assert metrics["faults/max_after/parity_k3"] == 0.0
  assert "mismatch/k3_mean_over_training" in metrics


@pytest.mark.parametrize("fault", [f for f in mxfp8_rl.PLANTED_FAULTS if f != "none"])
def test_planted_fault_is_caught_by_the_intended_check_at_its_update(tiny, tmp_path,
                                                                      fault):
  metrics, s = _run(dataclasses.replace(tiny, planted_fault=fault), tmp_path / fault)
  intended = INTENDED_CHECK[fault]
  if intended is None:  # transposed_block_axis: E4M3 serves the same bits here
    assert metrics["faults/max_after/bitwise_differing"] == 0
    assert all(metrics[f"faults/fired_fraction/{c}"] == 0 for c in weight_sync.CHECKS)
    return
  # Before the fault every check is silent; from the fault's sync on the intended fires.
  fired = {u: v for u, v in ((mxfp8_rl.sync_update(st), v)
                             for st, v in s[f"sync/fired/{intended}"])}
  assert [fired[u] for u in range(FAULT_UPDATE)] == [0.0] * FAULT_UPDATE
  assert metrics[f"faults/first_fired/{intended}"] == FAULT_UPDATE
  for check in weight_sync.CHECKS:
    assert all(v == 0.0 for st, v in s[f"sync/fired/{check}"]
               if mxfp8_rl.sync_update(st) < FAULT_UPDATE), (fault, check)
  assert metrics["faults/max_after/bitwise_differing"] > 0
  if fault.startswith("stale_sync"):  # the version is reported as current: a lie
    assert metrics["faults/fired_fraction/version"] == 0.0


def test_fault_validation(tiny):
  with pytest.raises(ValueError, match="needs sampler_recipe='mxfp8'"):
    dataclasses.replace(tiny, planted_fault="floor_vs_rceil", sampler_recipe="bf16")
  with pytest.raises(ValueError, match="planted_fault"):
    dataclasses.replace(tiny, planted_fault="bit_rot")
  bad = dataclasses.replace(tiny, planted_fault="dropped_tensor", fault_tensor="head/kernel")
  params = bad.initial_master(warm_start(bad, make_model(bad))[0])
  with pytest.raises(ValueError, match="MX-served kernel"):
    bad.exporter().init(params)
