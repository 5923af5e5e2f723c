"""The one place a ``--recipe`` flag becomes quantization of the experiments' model.

The experiments quantize :class:`models.transformer.DecoderLM` like any other Flax
model, with :func:`models.quantize_model` and a rule list. :func:`model_rules` is the
convention every experiment uses (ALTO's and Transformer Engine's): the recipe runs
the linear projections (q/k/v/output, feed-forward) and the grouped expert GEMMs; the
MoE router, the two attention products and the LM head stay in bf16; ``fp32`` leaves
every matmul in float32. Recipes are :mod:`numerics.recipes` names (``fp32``
included) or Recipe objects (e.g. an ALTO option variant).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from lowprec.models import quantization
from lowprec.models.transformer import DotGeneral, fp32_dot_general
from lowprec.numerics import qdot
from lowprec.numerics import recipes as recipes_lib


def available_recipes() -> tuple[str, ...]:
  """Every recipe name the flag accepts (``numerics.recipes.names()``)."""
  return tuple(recipes_lib.names())


def _recipe(recipe: str | recipes_lib.Recipe) -> recipes_lib.Recipe:
  if isinstance(recipe, str):
    if recipe not in recipes_lib.names():
      raise ValueError(f"unknown recipe {recipe!r}; available: "
                       f"{', '.join(available_recipes())}")
  elif not isinstance(recipe, recipes_lib.Recipe):
    raise ValueError(f"recipe must be a name or a numerics.recipes.Recipe, got "
                     f"{type(recipe).__name__}")
  return recipes_lib.get(recipe)


def model_rules(recipe: str | recipes_lib.Recipe) -> tuple[quantization.Rule, ...]:
  """The experiments' rule list for ``recipe`` (module paths of ``DecoderLM``).

  Router, attention products (issued by ``block_<i>`` itself) and LM head in bf16, the
  rest in ``recipe``; ``fp32`` (a recipe that quantizes nothing in float32) gives no
  rules, so every matmul stays the model's own float32 one.

  Raises:
    ValueError: an unknown recipe name (the message lists the known ones).
  """
  r = _recipe(recipe)
  if r == recipes_lib.get("fp32"):
    return ()
  return (quantization.Rule(r"(.*/)?router", "bf16", required=False),  # MoE models only
          quantization.Rule(r"block_\d+", "bf16"),
          quantization.Rule("head", "bf16"),
          quantization.Rule(".*", r))


def looped_rules(recipe: str | recipes_lib.Recipe) -> tuple[quantization.Rule, ...]:
  """:func:`model_rules` for ``models.looped.LoopedLM``: its exit gate stays in bf16
  too (a head-like projection to one logit)."""
  rules = model_rules(recipe)
  return (quantization.Rule("exit_gate", "bf16"),) + rules if rules else ()


def quantized_model(model: Any, recipe: str | recipes_lib.Recipe, *,
                    telemetry: bool = False) -> Any:
  """``model`` (a ``DecoderLM``) quantized by :func:`model_rules` (``recipe``)."""
  return quantization.quantize_model(model, model_rules(recipe), telemetry=telemetry)


def recipe_dot_general(recipe: str | recipes_lib.Recipe) -> DotGeneral:
  """``dot_general(lhs, rhs, dimension_numbers, key) -> float32`` for ``recipe``: the
  recipe's quantized GEMM on its own, keyed per call (for tools that apply one GEMM,
  e.g. the weight-quantization-error inspector; models use :func:`quantized_model`).

  Raises:
    ValueError: an unknown recipe name (the message lists the known ones).
  """
  r = _recipe(recipe)
  if r == recipes_lib.get("fp32"):
    return fp32_dot_general

  def dot_general(lhs: jax.Array, rhs: jax.Array, dimension_numbers, key) -> jax.Array:
    # Without preferred_element_type an unquantized recipe (bf16) would return -- and
    # accumulate in -- bf16; every recipe here accumulates and returns float32.
    return qdot.quantized_dot_general(lhs, rhs, dimension_numbers, r, key=key,
                                      preferred_element_type=jnp.float32)

  return dot_general
