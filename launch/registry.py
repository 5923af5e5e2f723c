"""The registry of declared sweeps: ``name -> "module:function"`` in the papers' folders.

Each paper declares its sweeps in ``experiments/<paper>/sweeps.py`` (functions returning
an :class:`experiments.common.sweeps.sweep_spec.Sweep`); this table names them. A declaration
is imported only when its sweep is asked for, never at the top of ``launch``.
"""

from __future__ import annotations

import importlib
from typing import Callable

from experiments.common.sweeps.sweep_spec import Sweep

_REGISTRY: dict[str, str] = {
    "lm_recipes": "experiments.lm.sweeps:lm_recipes",
    "lm_builtin_recipes": "experiments.lm.sweeps:lm_builtin_recipes",
    "alto": "experiments.alto.sweeps:alto",
    "alto_negative": "experiments.alto.sweeps:alto_negative",
    "fair_cast": "experiments.fair_cast.sweeps:fair_cast",
    "mxfp8_rl": "experiments.mxfp8_rl.sweeps:mxfp8_rl",
    "mxfp8_rl_faults": "experiments.mxfp8_rl.sweeps:mxfp8_rl_faults",
    "stale_sampler": "experiments.stale_sampler.sweeps:stale_sampler",
    "temperon": "experiments.temperon.sweeps:temperon",
    "memoir": "experiments.memoir.sweeps:memoir",
    "memoir_long": "experiments.memoir.sweeps:memoir_long",
    "kv_cache": "experiments.kv_cache.sweeps:kv_cache",
    "optimizer_state": "experiments.optimizer_state.sweeps:optimizer_state",
    "looped_rl": "experiments.looped_rl.sweeps:looped_rl",
    "qlora": "experiments.qlora.sweeps:qlora",
    # The confirmatory round (issue 36): the pilots' undecided claims on fresh seeds.
    "alto_confirm": "experiments.alto.sweeps:alto_confirm",
    "alto_confirm2": "experiments.alto.sweeps:alto_confirm2",
    "alto_untested": "experiments.alto.sweeps:alto_untested",
    "stale_sampler_confirm": "experiments.stale_sampler.sweeps:stale_sampler_confirm",
    "optimizer_state_confirm": "experiments.optimizer_state.sweeps:optimizer_state_confirm",
    "mxfp8_rl_confirm": "experiments.mxfp8_rl.sweeps:mxfp8_rl_confirm",
    "looped_rl_confirm": "experiments.looped_rl.sweeps:looped_rl_confirm",
    "fair_cast_confirm": "experiments.fair_cast.sweeps:fair_cast_confirm",
    "kv_cache_confirm": "experiments.kv_cache.sweeps:kv_cache_confirm",
    "memoir_confirm": "experiments.memoir.sweeps:memoir_confirm",
    "memoir_energy": "experiments.memoir.sweeps:memoir_energy",
    "temperon_confirm": "experiments.temperon.sweeps:temperon_confirm",
    # The second round (issue 50): the claims that only ever had a pilot.
    "temperon_confirm2": "experiments.temperon.sweeps:temperon_confirm2",
    "mxfp8_rl_faults_confirm": "experiments.mxfp8_rl.sweeps:mxfp8_rl_faults_confirm",
    # Untested claims of the seed papers, in miniature (issue 50).
    "kv_cache_weights": "experiments.kv_cache.sweeps:kv_cache_weights",
    # The field's recipe questions (issue 54).
    "scale_rules_ptq": "experiments.scale_rules.sweeps:scale_rules_ptq",
    "mxfp4_backward": "experiments.mxfp4_backward.sweeps:mxfp4_backward",
    "nvfp4_recipe": "experiments.nvfp4_recipe.sweeps:nvfp4_recipe",
}


def names() -> tuple[str, ...]:
  return tuple(sorted(_REGISTRY))


def appendix_function(spec: str) -> Callable[[str], str]:
  """The function a declaration's ``appendix`` (``"module:function"``) names. Only a
  :class:`Sweep` declared in the repository supplies ``spec``, never a sweep
  directory's data (:func:`launch.report.registered_appendix`)."""
  module, function = spec.split(":")
  return getattr(importlib.import_module(module), function)


def get(name: str) -> Sweep:
  """The sweep registered as ``name``."""
  if name not in _REGISTRY:
    raise KeyError(f"unknown sweep {name!r}; known: {', '.join(names())}")
  module, function = _REGISTRY[name].split(":")
  sweep = getattr(importlib.import_module(module), function)()
  if sweep.name != name:
    raise ValueError(f"{_REGISTRY[name]} declares sweep {sweep.name!r}, registered as "
                     f"{name!r}")
  return sweep
