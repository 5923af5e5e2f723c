"""experiments.common.harness.train_loop.periodic_field: the loop's five periodic settings,
declared once with a shared help text and domain, and read by Run.settings."""

import dataclasses
import importlib

import pytest

from experiments.common.harness.config_flags import check_fields, config_field
from experiments.common.harness.run import Run
from experiments.common.harness.run_options import RunOptions
from experiments.common.harness.train_loop import (PERIODIC, LoopSettings, periodic_field,
                                                   periodic_settings)


@dataclasses.dataclass(frozen=True)
class _Config:
  seed: int = config_field(0, "Seed.", domain="[0, inf)")
  log_every: int = periodic_field("log_every", 1, unit="update", domain="[1, inf)")
  eval_every: int = periodic_field("eval_every", 5)
  progress_every_s: float = periodic_field("progress_every_s", 2.0)

  def __post_init__(self):
    check_fields(self)


def test_the_shared_help_names_the_unit_and_what_0_does_where_0_is_allowed():
  fields = {f.name: f.metadata for f in dataclasses.fields(_Config)}
  assert fields["eval_every"]["help"] == (
      "Evaluate every N steps, at step 0 and at the end (0: only at step 0 and at the "
      "end). Domain: [0, inf).")
  assert fields["log_every"]["help"] == (
      "Write train metrics every N updates and at the end. Domain: [1, inf).")
  assert fields["progress_every_s"]["domain"] == "(0, inf)"
  with pytest.raises(ValueError, match=r"log_every must be in \[1, inf\)"):
    _Config(log_every=0)
  with pytest.raises(ValueError, match="not a loop setting"):
    periodic_field("eval_batches", 8)


def test_run_settings_reads_the_declared_fields_and_nothing_else():
  """A config without histogram_every draws no histograms; an undeclared setting keeps
  the LoopSettings default."""
  assert periodic_settings(_Config(eval_every=7)) == {
      "log_every": 1, "eval_every": 7, "progress_every_s": 2.0}
  run = Run(experiment="x", config=_Config(eval_every=7), options=RunOptions(workdir="/w"),
            writer=None, checkpointer=None, writer_process=False, hparams=None)
  settings = run.settings(10, max_healthy_loss=3.0)
  assert (settings.log_every, settings.eval_every, settings.histogram_every,
          settings.progress_every_s, settings.max_healthy_loss) == (1, 7, 0, 2.0, 3.0)
  assert settings.checkpoint_every == LoopSettings(num_steps=1).checkpoint_every


def test_a_field_declared_under_another_name_is_refused():
  @dataclasses.dataclass(frozen=True)
  class Misnamed:
    every: int = periodic_field("eval_every", 1)

  with pytest.raises(TypeError, match=r"Misnamed.every is declared as "
                                      r"periodic_field\('eval_every'\)"):
    periodic_settings(Misnamed())


@pytest.mark.parametrize("module, name", [
    ("experiments.common.trainers.lm_trainer", "LMConfig"),
    ("experiments.common.trainers.moe_lm", "MoELMConfig"),
    ("experiments.common.trainers.rl.config", "RLConfig"),
    ("experiments.looped_rl.experiment", "LoopedRLConfig"),
    ("experiments.memoir.experiment", "MemoirExperimentConfig"),
    ("experiments.qlora.experiment", "QLoRAConfig"),
    ("experiments.temperon.experiment", "TemperonConfig")])
def test_every_experiment_declares_its_loop_settings_with_periodic_field(module, name):
  config = getattr(importlib.import_module(module), name)
  declared = [f.name for f in dataclasses.fields(config) if f.name in PERIODIC]
  assert declared and list(periodic_settings(config())) == declared
