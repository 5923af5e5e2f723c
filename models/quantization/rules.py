"""Rules: which recipe the contractions of the matching modules run with.

A :class:`Rule` pairs a regular expression on module paths with a recipe (or ``None``:
keep the ops as written) and the op kinds it applies to. :func:`projections_only` is
the preset most training recipes use: the projections quantized, the attention products
and the output head in bf16 (as Transformer Engine's recipes and ALTO run them).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from lowprec.numerics import recipes as recipes_lib

# The op kinds a quantized model intercepts (see the package docstring):
# lax.dot_general (lax.dot, batch_matmul); jnp.einsum; x @ w and the jnp products
# (models/quantization/products.py; jnp.outer and multi_dot are recorded as matmul, never
# quantized); lax.conv_general_dilated;
# the attention products (QK^T and AV) of Flax's attention functions and of
# jax.nn.dot_product_attention.
OPS = ("dot_general", "einsum", "matmul", "conv", "attention")
PROJECTIONS = ("dot_general", "einsum", "matmul", "conv")


@dataclasses.dataclass(frozen=True)
class Rule:
  """Which recipe the contractions of the matching modules run with.

  Attributes:
    module_path: a regular expression matched against the whole ``/``-joined module
      path (``""`` is the quantized model itself): ``"head"``, ``"block_\\d+/.*"``.
    recipe: a :mod:`lowprec.numerics.recipes` name or Recipe; ``None`` keeps the matched
      ops as the model wrote them (for "this layer stays in high precision" overrides).
    ops: the op kinds the rule applies to, a subset of :data:`OPS` (default: all).
    required: whether a rule that matches no op is reported (``quantize_model``'s
      ``unused_rules``); False for rules a preset or a rule list for a family of models
      includes in case the model has such ops (an attention, an MoE router).
  """

  module_path: str
  recipe: str | recipes_lib.Recipe | None
  ops: tuple[str, ...] = OPS
  required: bool = True

  def __post_init__(self):
    if not isinstance(self.module_path, str):
      raise TypeError(f"module_path must be a regular expression string, got "
                      f"{self.module_path!r}")
    try:
      re.compile(self.module_path)
    except re.error as e:
      raise ValueError(f"module_path {self.module_path!r} is not a regular expression: "
                       f"{e}") from None
    if self.recipe is not None:
      recipes_lib.get(self.recipe)  # unknown names raise, listing the known ones
    ops = (self.ops,) if isinstance(self.ops, str) else tuple(self.ops)
    if not ops or set(ops) - set(OPS):
      raise ValueError(f"ops must be a non-empty subset of {OPS}, got {self.ops!r}")
    object.__setattr__(self, "ops", ops)

  def matches(self, path: str, op: str) -> bool:
    return op in self.ops and re.fullmatch(self.module_path, path) is not None

  @property
  def recipe_name(self) -> str | None:
    return None if self.recipe is None else recipes_lib.get(self.recipe).name


def check_rules(rules: Sequence[Rule] | Rule) -> tuple[Rule, ...]:
  """``rules`` as a tuple, each a :class:`Rule` (a clear TypeError otherwise)."""
  if isinstance(rules, Rule):
    rules = (rules,)
  rules = tuple(rules)
  for r in rules:
    if not isinstance(r, Rule):
      raise TypeError(f"rules must be lowprec.models.Rule objects, got {type(r).__name__}")
  return rules


def projections_only(recipe: str | recipes_lib.Recipe, *,
                     head: str | None = r"(.*/)?(head|lm_head|classifier|logits)",
                     keep: str = "bf16") -> tuple[Rule, ...]:
  """The usual training convention: projections in ``recipe``, the rest in ``keep``.

  Every projection (``dot_general``, ``einsum``, ``@``/``matmul``/``dot`` and
  ``conv`` ops) runs with ``recipe``, except in the modules whose path matches
  ``head`` (the output head; ``None``: no head rule), which run with ``keep``; the
  attention products (QK^T and AV, in linen and NNX alike) run with ``keep``. ``keep``
  is a recipe name (``"bf16"``: bf16 operands, float32 accumulation) or ``None`` for the
  model's own precision. The head and attention rules are not ``required`` (a model
  may have neither).
  """
  rules = []
  if head is not None:
    rules.append(Rule(head, keep, required=False))
  rules += [Rule(".*", keep, ops=("attention",), required=False),
            Rule(".*", recipe, ops=PROJECTIONS)]
  return tuple(rules)
