"""The one place a ``--recipe`` name becomes the ``dot_general`` injected into a model.

With ``numerics.recipes`` and ``numerics.qdot`` importable, every name they know goes
through ``numerics.qdot.quantized_dot_general`` (a custom_vjp quantized GEMM). Without
them only the two built-in recipes work: ``fp32`` and ``bf16`` (bf16 inputs, fp32
accumulation via ``preferred_element_type``).
"""

from __future__ import annotations

import importlib
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

from models.transformer import DotGeneral, DimensionNumbers, fp32_dot_general

BUILTIN_RECIPES = ("fp32", "bf16")


def bf16_dot_general(lhs: jax.Array, rhs: jax.Array, dimension_numbers: DimensionNumbers,
                     key: jax.Array | None) -> jax.Array:
  """bf16 x bf16 -> fp32 accumulation. ``key`` is unused (deterministic rounding)."""
  del key
  return lax.dot_general(lhs.astype(jnp.bfloat16), rhs.astype(jnp.bfloat16),
                         dimension_numbers, preferred_element_type=jnp.float32)


def _numerics_modules():
  """(recipes, qdot) modules, or (None, error) when they cannot be imported."""
  try:
    recipes = importlib.import_module("numerics.recipes")
    qdot = importlib.import_module("numerics.qdot")
  except ImportError as e:
    return None, e
  return recipes, qdot


def available_recipes() -> tuple[str, ...]:
  """Every recipe name ``make_dot_general`` accepts in this environment."""
  recipes, _ = _numerics_modules()
  names = list(BUILTIN_RECIPES)
  if recipes is not None:
    names += [n for n in recipes.names() if n not in names]
  return tuple(names)


def make_dot_general(recipe_name: "str | numerics.recipes.Recipe") -> DotGeneral:
  """``dot_general(lhs, rhs, dimension_numbers, key) -> float32`` for ``recipe_name``
  (a name, or a ``numerics.recipes.Recipe`` object such as an ALTO option variant).

  Raises:
    ValueError: unknown recipe, or a quantized recipe while ``numerics.recipes`` /
      ``numerics.qdot`` are not importable (the message says which import failed).
  """
  if recipe_name == "fp32":
    return fp32_dot_general
  recipes, qdot_or_error = _numerics_modules()
  if not isinstance(recipe_name, str):
    if recipes is None or not isinstance(recipe_name, recipes.Recipe):
      raise ValueError(f"recipe must be a name or a numerics.recipes.Recipe, got "
                       f"{type(recipe_name).__name__}")
    return _quantized(qdot_or_error, recipe_name)
  if recipes is None:
    if recipe_name == "bf16":
      return bf16_dot_general
    raise ValueError(
        f"recipe {recipe_name!r} needs numerics.recipes and numerics.qdot, which failed to "
        f"import ({qdot_or_error}); available without them: {', '.join(BUILTIN_RECIPES)}")
  if recipe_name not in recipes.names():
    if recipe_name == "bf16":
      return bf16_dot_general
    raise ValueError(f"unknown recipe {recipe_name!r}; available: "
                     f"{', '.join(available_recipes())}")
  return _quantized(qdot_or_error, recipes.get(recipe_name))


def _quantized(qdot, recipe) -> DotGeneral:
  quantized: Callable = qdot.quantized_dot_general

  def dot_general(lhs, rhs, dimension_numbers, key):
    # Without preferred_element_type an unquantized recipe (bf16) would return -- and
    # accumulate in -- bf16; every recipe here accumulates and returns float32.
    return quantized(lhs, rhs, dimension_numbers, recipe, key,
                     preferred_element_type=jnp.float32)

  return dot_general


def make_model_dot_generals(recipe_name: "str | numerics.recipes.Recipe"
                            ) -> dict[str, DotGeneral]:
  """``DecoderLM`` keyword arguments for ``recipe_name``, ALTO's/TE's convention.

  The recipe quantizes the linear projections (q/k/v/output, feed-forward and the
  grouped expert GEMMs); the two attention products, the MoE router and the LM head
  stay in bf16 (fp32 for recipe ``fp32``).
  """
  plain = fp32_dot_general if recipe_name == "fp32" else bf16_dot_general
  return dict(dot_general=make_dot_general(recipe_name), attention_dot_general=plain,
              head_dot_general=plain, router_dot_general=plain)
