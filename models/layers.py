"""Quantized Flax layers: the recipe is injected into Flax's own layers.

Linen: :class:`QDense`, :class:`QDenseGeneral`, :class:`QEinsum` are ``nn.Dense``,
``nn.DenseGeneral`` and ``nn.Einsum`` with one extra field, ``recipe`` (a
:class:`numerics.recipes.Recipe` or its name), and ``rng_collection`` (default
``"quant"``): recipes that round stochastically or draw a Hadamard transform take a
fresh key per call from that RNG collection (``apply(..., rngs={"quant": key})``).
The parameter tree is exactly the plain layer's.

NNX: :class:`QLinear`, :class:`QLinearGeneral`, :class:`QEinsumNNX` are ``nnx.Linear``,
``nnx.LinearGeneral`` and ``nnx.Einsum`` with a ``recipe`` argument; the key comes from
the ``quant`` stream of the ``rngs`` given at construction (falling back to
``default``).

With recipe ``bf16`` each layer computes exactly what the plain Flax layer computes
with ``dtype=jnp.bfloat16`` (tested), since the recipe then reduces to a plain
``lax.dot_general``.
"""

from __future__ import annotations

import functools
from typing import Any

from flax import linen as nn
from flax import nnx
import jax
import jax.numpy as jnp

from numerics import qdot
from numerics import recipes as recipes_lib

RecipeLike = Any  # str | numerics.recipes.Recipe


class QuantDotGeneral(nn.Module):
  """A linen ``dot_general`` that quantizes per ``recipe`` (a submodule, no params)."""

  recipe: RecipeLike = "bf16"
  rng_collection: str = "quant"

  def __call__(self, lhs, rhs, dimension_numbers, precision=None,
               preferred_element_type=None, **unused):
    r = recipes_lib.get(self.recipe)
    key = self.make_rng(self.rng_collection) if r.needs_key else None
    return qdot.make_dot_general(r, key)(lhs, rhs, dimension_numbers, precision,
                                         preferred_element_type, **unused)


def _inject(module, recipe, rng_collection):
  recipes_lib.get(recipe)  # fail early on unknown names
  object.__setattr__(module, "dot_general_cls", functools.partial(
      QuantDotGeneral, recipe=recipe, rng_collection=rng_collection))


class QDense(nn.Dense):
  """``nn.Dense`` whose matmul is quantized per ``recipe``."""

  recipe: RecipeLike = "bf16"
  rng_collection: str = "quant"

  def __post_init__(self):
    _inject(self, self.recipe, self.rng_collection)
    super().__post_init__()


class QDenseGeneral(nn.DenseGeneral):
  """``nn.DenseGeneral`` whose matmul is quantized per ``recipe``."""

  recipe: RecipeLike = "bf16"
  rng_collection: str = "quant"

  def __post_init__(self):
    _inject(self, self.recipe, self.rng_collection)
    super().__post_init__()


class QEinsum(nn.Einsum):
  """``nn.Einsum`` whose contraction is quantized per ``recipe``.

  ``nn.Einsum`` calls ``jnp.einsum`` directly, so ``__call__`` repeats its few lines
  with ``jnp.einsum(..., _dot_general=...)``.
  """

  recipe: RecipeLike = "bf16"
  rng_collection: str = "quant"

  @nn.compact
  def __call__(self, inputs, einsum_str: str | None = None):
    einsum_str = nn.module.merge_param("einsum_str", self.einsum_str, einsum_str)
    einsum_str = einsum_str.replace(" ", "")
    if "->" not in einsum_str or einsum_str.count(",") != 1:
      raise ValueError(f"QEinsum needs an explicit two-operand equation, got "
                       f"{einsum_str!r}")
    kernel = self.param("kernel", self.kernel_init, self.shape, self.param_dtype)
    if self.use_bias:
      bias_shape, broadcasted_bias_shape = self._get_bias_shape(einsum_str, inputs,
                                                                kernel)
      bias = self.param("bias", self.bias_init, bias_shape, self.param_dtype)
    else:
      bias = None
    inputs, kernel, bias = self.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
    r = recipes_lib.get(self.recipe)
    key = self.make_rng(self.rng_collection) if r.needs_key else None
    # jnp.einsum takes _dot_general as a static argument: pass a closure, not a module.
    y = jnp.einsum(einsum_str, inputs, kernel, precision=self.precision,
                   preferred_element_type=self.preferred_element_type,
                   _dot_general=qdot.make_dot_general(r, key))
    if bias is not None:
      y += jnp.reshape(bias, broadcasted_bias_shape)
    return y


class QuantDotGeneralNNX(nnx.Module):
  """An NNX ``dot_general`` that quantizes per ``recipe``, keyed from ``rngs``."""

  def __init__(self, recipe: RecipeLike, rngs: nnx.Rngs | None = None,
               stream: str = "quant"):
    self.recipe = recipes_lib.get(recipe)
    if self.recipe.needs_key and rngs is None:
      raise ValueError(f"recipe {self.recipe.name!r} needs rngs for its random keys")
    self.rngs = rngs if self.recipe.needs_key else None
    self.stream = stream

  def key(self) -> jax.Array | None:
    if self.rngs is None:
      return None
    return self.rngs[self.stream]() if self.stream in self.rngs else self.rngs()

  def __call__(self, lhs, rhs, dimension_numbers, precision=None,
               preferred_element_type=None, **unused):
    return qdot.make_dot_general(self.recipe, self.key())(
        lhs, rhs, dimension_numbers, precision, preferred_element_type, **unused)


class _QuantEinsumOp(nnx.Module):
  """An NNX ``einsum_op`` for ``nnx.Einsum`` that quantizes its contraction."""

  def __init__(self, dot_general: QuantDotGeneralNNX):
    self.dot_general = dot_general

  def __call__(self, einsum_str, a, b, *, precision=None, preferred_element_type=None,
               out_sharding=None):
    del out_sharding
    dg = qdot.make_dot_general(self.dot_general.recipe, self.dot_general.key())
    return jnp.einsum(einsum_str, a, b, precision=precision,
                      preferred_element_type=preferred_element_type, _dot_general=dg)


class QLinear(nnx.Linear):
  """``nnx.Linear`` whose matmul is quantized per ``recipe``."""

  def __init__(self, in_features: int, out_features: int, *, recipe: RecipeLike = "bf16",
               rngs: nnx.Rngs, **kwargs):
    super().__init__(in_features, out_features,
                     dot_general=QuantDotGeneralNNX(recipe, rngs), rngs=rngs, **kwargs)


class QLinearGeneral(nnx.LinearGeneral):
  """``nnx.LinearGeneral`` whose matmul is quantized per ``recipe``."""

  def __init__(self, in_features, out_features, *, recipe: RecipeLike = "bf16",
               rngs: nnx.Rngs, **kwargs):
    super().__init__(in_features, out_features,
                     dot_general=QuantDotGeneralNNX(recipe, rngs), rngs=rngs, **kwargs)


class QEinsumNNX(nnx.Einsum):
  """``nnx.Einsum`` whose contraction is quantized per ``recipe``."""

  def __init__(self, einsum_str: str, kernel_shape, bias_shape=None, *,
               recipe: RecipeLike = "bf16", rngs: nnx.Rngs, **kwargs):
    super().__init__(einsum_str, kernel_shape, bias_shape,
                     einsum_op=_QuantEinsumOp(QuantDotGeneralNNX(recipe, rngs)),
                     rngs=rngs, **kwargs)
