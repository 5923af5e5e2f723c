"""Tests for experiments.common.harness.config_flags."""

import dataclasses

import pytest
from absl import flags

from experiments.common.harness.config_flags import (config_field, config_from_flags,
                                                     config_to_flags, define_flags, parse_override,
                                                     replace_checked)


@dataclasses.dataclass(frozen=True)
class Toy:
  lr: float = config_field(0.1, "learning rate")
  steps: int = config_field(5, "steps")
  name: str = config_field("a", "name", choices=("a", "b"))
  flag: bool = config_field(False, "a switch")


def _fresh():
  fv = flags.FlagValues()
  define_flags(Toy, fv)
  return fv


def test_roundtrip_through_flags():
  fv = _fresh()
  cfg = Toy(lr=0.5, steps=7, name="b", flag=True)
  fv(["prog", *config_to_flags(cfg)])
  assert config_from_flags(Toy, fv) == cfg


def test_defaults_and_help():
  fv = _fresh()
  fv(["prog"])
  assert config_from_flags(Toy, fv) == Toy()
  for f in dataclasses.fields(Toy):
    assert fv[f.name].help.endswith(f.metadata["help"])


def test_choices_enforced():
  fv = _fresh()
  with pytest.raises(flags.IllegalFlagValueError):
    fv(["prog", "--name=c"])


def test_missing_help_and_bad_types():
  @dataclasses.dataclass(frozen=True)
  class NoHelp:
    x: int = 1

  with pytest.raises(ValueError, match="help"):
    define_flags(NoHelp, flags.FlagValues())

  @dataclasses.dataclass
  class NotFrozen:
    x: int = config_field(1, "x")

  with pytest.raises(TypeError, match="frozen"):
    define_flags(NotFrozen, flags.FlagValues())
  with pytest.raises(ValueError):
    config_field("z", "bad default", choices=("a",))


def test_replace_checked():
  cfg = replace_checked(Toy(), {"lr": 1, "steps": 3})
  assert cfg.lr == 1.0 and isinstance(cfg.lr, float) and cfg.steps == 3
  with pytest.raises(ValueError, match="no field"):
    replace_checked(Toy(), {"nope": 1})
  with pytest.raises(TypeError, match="steps"):
    replace_checked(Toy(), {"steps": "3"})
  with pytest.raises(TypeError):
    replace_checked(Toy(), {"steps": True})


def test_parse_override():
  assert parse_override("steps=9", Toy()) == ("steps", 9)
  assert parse_override("lr=1e-3", Toy()) == ("lr", 1e-3)
  assert parse_override("flag=true", Toy()) == ("flag", True)
  with pytest.raises(ValueError):
    parse_override("flag=maybe", Toy())
  with pytest.raises(ValueError):
    parse_override("steps", Toy())
  with pytest.raises(ValueError, match="no field"):
    parse_override("x=1", Toy())


def test_every_entry_point_parses_flags_with_the_scripts_exit_statuses():
  """Before (issue 51 row 16): ``--help`` exited 1 and a refused flag value was absl's
  FATAL banner with exit 1, at every entry point (``parse_flags``' statuses are tested in
  test_script_exits and, through two entry points, test_sweep_spec). The library's own
  tools (numerics/) do not import the experiments and are left out."""
  import ast  # pylint: disable=import-outside-toplevel
  import pathlib  # pylint: disable=import-outside-toplevel
  from experiments.common.harness.repo_paths import REPO_DIR  # pylint: disable=import-outside-toplevel
  calls, plain = 0, []
  for top in ("experiments", "launch"):
    for path in sorted(pathlib.Path(REPO_DIR, top).rglob("*.py")):
      for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "run" and getattr(node.func.value, "id", None) == "app"):
          calls += 1
          if not any(k.arg == "flags_parser" and getattr(k.value, "id", None) == "parse_flags"
                     for k in node.keywords):
            plain.append(f"{path.relative_to(REPO_DIR)}:{node.lineno}")
  assert calls > 10 and not plain, plain
