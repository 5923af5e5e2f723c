"""absl flags generated from a frozen config dataclass, and the config rebuilt from them.

A config is a frozen dataclass whose fields are ``int``, ``float``, ``str`` or ``bool`` and
carry ``metadata={"help": ...}`` and, for numbers, the field's domain (an interval such
as ``"(0, inf)"`` or ``"[0, 1)"``; see :func:`config_field`), and optionally
``"choices"``. One flag is defined per field, so ``--help`` documents every field and
its domain and the dataclass stays the single source of truth. :func:`check_fields`
(every config class calls it in ``__post_init__``) rejects a value outside its domain,
naming the field, so ``--learning_rate=-1`` fails before anything runs. Library code
never reads ``FLAGS``; only an entry point calls :func:`config_from_flags` and passes
the config down.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import typing
from typing import Any, TypeVar

from absl import flags

T = TypeVar("T")
_SCALARS = (bool, int, float, str)


# A seed's domain: jax.random.PRNGKey keeps a seed's low 32 bits (seed 2**32 gives seed
# 0's keys, without a word) and overflows past 2**63, so a seed is a uint32.
SEED_DOMAIN = "[0, 4294967296)"

_INTERVAL = re.compile(r"^([\[(])\s*(-?inf|[-+0-9.e]+)\s*,\s*(-?inf|[-+0-9.e]+)\s*([\])])$")


class ConfigError(ValueError):
  """A config value refused once the data it applies to is known (a ``seq_len`` longer
  than the text): a script reports it like a flag outside its domain (one line, exit 2)."""


def parse_domain(domain: str) -> tuple[float, float, bool, bool]:
  """``"(0, inf)"`` -> ``(low, high, low_closed, high_closed)``."""
  m = _INTERVAL.match(domain.strip())
  if not m:
    raise ValueError(f"domain {domain!r} is not an interval like '[0, inf)' or '(0, 1]'")
  low, high = float(m.group(2)), float(m.group(3))
  if not low < high:
    raise ValueError(f"domain {domain!r} is empty")
  return low, high, m.group(1) == "[", m.group(4) == "]"


def in_domain(value: float, domain: str) -> bool:
  low, high, low_closed, high_closed = parse_domain(domain)
  if not math.isfinite(value) and not (math.isinf(value) and value in (low, high)):
    return False
  above = value >= low if low_closed else value > low
  below = value <= high if high_closed else value < high
  return above and below


def config_field(default: Any, help: str, *, choices: tuple[str, ...] | None = None,
                 domain: str | None = None) -> Any:  # pylint: disable=redefined-builtin
  """A dataclass field with the help text (and choices or numeric domain) its flag
  will show. ``domain`` is an interval, ``[`` / ``]`` closed and ``(`` / ``)`` open,
  ``inf`` allowed: ``"(0, inf)"`` (positive), ``"[0, inf)"``, ``"[0, 1)"``, ``"[1, inf)"``."""
  if not help:
    raise ValueError("every config field needs a help text")
  metadata: dict[str, Any] = {"help": help}
  if choices is not None:
    if default not in choices:
      raise ValueError(f"default {default!r} not in choices {choices}")
    metadata["choices"] = tuple(choices)
  if domain is not None:
    if isinstance(default, (bool, str)) or not in_domain(default, domain):
      raise ValueError(f"default {default!r} is not a number in the domain {domain}")
    metadata["domain"] = domain
    metadata["help"] = f"{help} Domain: {domain}."
  return dataclasses.field(default=default, metadata=metadata)


def check_fields(config: Any) -> None:
  """Raises ValueError for the first field outside its declared domain or choices."""
  for f in dataclasses.fields(config):
    value = getattr(config, f.name)
    domain = f.metadata.get("domain")
    if domain is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                               or not in_domain(value, domain)):
      raise ValueError(f"{type(config).__name__}.{f.name} must be in {domain}, got {value!r}")
    choices = f.metadata.get("choices")
    if choices is not None and value not in choices:
      raise ValueError(f"{type(config).__name__}.{f.name} must be one of {list(choices)}, "
                       f"got {value!r}")


def _field_types(cls: type) -> dict[str, type]:
  hints = typing.get_type_hints(cls)
  out = {}
  for f in dataclasses.fields(cls):
    t = hints[f.name]
    if t not in _SCALARS:
      raise TypeError(f"{cls.__name__}.{f.name}: flag fields must be bool/int/float/str, got {t}")
    out[f.name] = t
  return out


def define_flags(cls: type, flag_values: flags.FlagValues = flags.FLAGS) -> list[str]:
  """Defines one absl flag per field of the frozen dataclass ``cls``; returns their names.

  Raises:
    TypeError: ``cls`` is not a frozen dataclass or has a non-scalar field.
    ValueError: a field lacks a help text.
  """
  if not (dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen):
    raise TypeError(f"{cls!r} is not a frozen dataclass")
  types = _field_types(cls)
  for f in dataclasses.fields(cls):
    help_text = f.metadata.get("help")
    if not help_text:
      raise ValueError(f"{cls.__name__}.{f.name} has no help text (use config_field)")
    t = types[f.name]
    choices = f.metadata.get("choices")
    if choices is not None:
      flags.DEFINE_enum(f.name, f.default, list(choices), help_text, flag_values=flag_values)
    elif t is bool:
      flags.DEFINE_bool(f.name, f.default, help_text, flag_values=flag_values)
    elif t is int:
      flags.DEFINE_integer(f.name, f.default, help_text, flag_values=flag_values)
    elif t is float:
      flags.DEFINE_float(f.name, f.default, help_text, flag_values=flag_values)
    else:
      flags.DEFINE_string(f.name, f.default, help_text, flag_values=flag_values)
  return [f.name for f in dataclasses.fields(cls)]


def config_from_flags(cls: type[T], flag_values: flags.FlagValues = flags.FLAGS) -> T:
  """Builds ``cls`` from parsed flags defined by :func:`define_flags`."""
  return cls(**{f.name: getattr(flag_values, f.name) for f in dataclasses.fields(cls)})


def flag_value(value: Any) -> str:
  """A config value as its flag (and ``--override``) spells it."""
  if isinstance(value, bool):
    return "true" if value else "false"
  return str(value)


def config_to_flags(config: Any) -> list[str]:
  """``--name=value`` for every field of a config instance (what a launcher passes)."""
  return [f"--{f.name}={flag_value(getattr(config, f.name))}"
          for f in dataclasses.fields(config)]


def replace_checked(config: T, overrides: dict[str, Any]) -> T:
  """``dataclasses.replace`` that names unknown fields and coerces int -> float fields."""
  types = _field_types(type(config))
  unknown = sorted(set(overrides) - set(types))
  if unknown:
    raise ValueError(f"{type(config).__name__} has no field(s) {unknown}; known: {sorted(types)}")
  coerced = {}
  for name, value in overrides.items():
    t = types[name]
    if t is float and isinstance(value, int) and not isinstance(value, bool):
      value = float(value)
    if not isinstance(value, t) or (t is int and isinstance(value, bool)):
      raise TypeError(f"{type(config).__name__}.{name} expects {t.__name__}, got {value!r}")
    coerced[name] = value
  return dataclasses.replace(config, **coerced)


def parse_override(text: str, config: Any) -> tuple[str, Any]:
  """Parses ``name=value`` against the field types of ``config``."""
  if "=" not in text:
    raise ValueError(f"override {text!r} is not of the form name=value")
  name, raw = text.split("=", 1)
  types = _field_types(type(config))
  if name not in types:
    raise ValueError(f"{type(config).__name__} has no field {name!r}; known: {sorted(types)}")
  t = types[name]
  if t is bool:
    if raw.lower() not in ("true", "false", "1", "0"):
      raise ValueError(f"{name} expects true/false, got {raw!r}")
    return name, raw.lower() in ("true", "1")
  return name, t(raw)


_HELP_FLAGS = ("-?", "--help", "--helpshort", "--helpfull", "--helpxml")


def parse_flags(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS
                ) -> list[str]:
  """absl's flag parsing with a script's exit statuses: a value a flag refuses (an
  unknown ``--recipe``, a non-number) is one line and exit 2, and ``--help`` exits 0
  (absl exits 1 for both, with a banner)."""
  try:
    return flag_values(argv)
  except flags.Error as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    print(f"error: {first} (--help lists the flags and their values)", file=sys.stderr)
    sys.exit(2)
  except SystemExit as e:
    ours = argv[1:argv.index("--")] if "--" in argv else argv[1:]  # not a command's after --
    if e.code == 1 and any(a.split("=", 1)[0] in _HELP_FLAGS for a in ours):
      sys.exit(0)  # the help was printed: asking for it is not an error
    raise
