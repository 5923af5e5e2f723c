"""The one place a ``--recipe`` name becomes the ``dot_general``s injected into a model.

``fp32`` is plain float32 (:func:`models.transformer.fp32_dot_general`); every other
name is a :mod:`numerics.recipes` recipe run through
:func:`numerics.qdot.quantized_dot_general` (a custom-VJP quantized GEMM per recipe).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from models.transformer import DotGeneral, bf16_dot_general, fp32_dot_general
from numerics import qdot
from numerics import recipes as recipes_lib


def available_recipes() -> tuple[str, ...]:
  """Every recipe name ``recipe_dot_general`` accepts: ``fp32`` and the recipes."""
  return ("fp32",) + tuple(recipes_lib.names())


def recipe_dot_general(recipe: str | recipes_lib.Recipe) -> DotGeneral:
  """``dot_general(lhs, rhs, dimension_numbers, key) -> float32`` for ``recipe`` (a
  name, or a :class:`numerics.recipes.Recipe` such as an ALTO option variant): the
  recipe's quantized GEMM, keyed per call, accumulating and returning float32.

  Raises:
    ValueError: an unknown recipe name (the message lists the known ones).
  """
  if isinstance(recipe, str):
    if recipe == "fp32":
      return fp32_dot_general
    if recipe not in recipes_lib.names():
      raise ValueError(f"unknown recipe {recipe!r}; available: "
                       f"{', '.join(available_recipes())}")
  elif not isinstance(recipe, recipes_lib.Recipe):
    raise ValueError(f"recipe must be a name or a numerics.recipes.Recipe, got "
                     f"{type(recipe).__name__}")
  r = recipes_lib.get(recipe)

  def dot_general(lhs: jax.Array, rhs: jax.Array, dimension_numbers, key) -> jax.Array:
    # Without preferred_element_type an unquantized recipe (bf16) would return -- and
    # accumulate in -- bf16; every recipe here accumulates and returns float32.
    return qdot.make_dot_general(r, key)(lhs, rhs, dimension_numbers,
                                         preferred_element_type=jnp.float32)

  return dot_general


def make_model_dot_generals(recipe: str | recipes_lib.Recipe) -> dict[str, DotGeneral]:
  """``DecoderLM`` keyword arguments for ``recipe``, ALTO's/TE's convention.

  The recipe quantizes the linear projections (q/k/v/output, feed-forward and the
  grouped expert GEMMs); the two attention products, the MoE router and the LM head
  stay in bf16 (fp32 for recipe ``fp32``).
  """
  plain = fp32_dot_general if recipe == "fp32" else bf16_dot_general
  return dict(dot_general=recipe_dot_general(recipe), attention_dot_general=plain,
              head_dot_general=plain, router_dot_general=plain)
