"""How a sampler serves the learner's weights: the layer plan and MX weights.

A served copy keeps each parameter in a recipe: ``fp32`` (norms, embeddings), ``bf16``
(layers named by glob patterns, e.g. the LM head) or an MX recipe, whose kernels are
quantized on the fly at each sync the way a serving engine loads them: 1 x 32 blocks
along the contraction axis, E8M0 scales, the axis zero-padded to a multiple of the block
(:func:`served_mx_weight`). :func:`resolve_layer_plan` maps every parameter to its
recipe; a known silent failure is that the learner and the sampler resolve the lists
differently (fused ``qkv`` against unfused ``query`` names), which
:func:`experiments.mxfp8_rl.weight_sync.check_plan` catches.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from lowprec.numerics import blockscale
from lowprec.numerics import tree_paths
from lowprec.numerics.blockscale import MX_BLOCK

RECIPES = ("fp32", "bf16", "mxfp8")
# Served MX recipes: (element format, scale rule) -- as numerics.recipes' "mxfp8".
MX_SERVED_FORMATS: Mapping[str, tuple[str, str]] = {"mxfp8": ("e4m3", "rceil")}


def resolve_layer_plan(params: Any, default: str, keep: tuple[str, ...] = (), *,
                       keep_fp32: tuple[str, ...] = (), strict: bool = False
                       ) -> dict[str, str]:
  """``{path: recipe}``: ``"bf16"`` where the path matches a ``keep`` glob, else
  ``default``.

  Patterns are ``fnmatch`` globs on the ``'/'``-joined path (``*`` also crosses
  ``/``), e.g. ``"*/qkv/*"``. ``keep_fp32`` globs (checked first) map to ``"fp32"``:
  parameters served in full precision (norms, embeddings). With ``strict`` a pattern
  that matches no path raises :class:`WeightSyncError` (an exclusion written for other
  names, e.g. unfused ``query`` against a fused ``qkv``, silently keeps nothing).
  """
  paths = list(tree_paths.named_leaves(params))
  plan = {}
  for p in paths:
    if any(fnmatch.fnmatchcase(p, g) for g in keep_fp32):
      plan[p] = "fp32"
    elif any(fnmatch.fnmatchcase(p, g) for g in keep):
      plan[p] = "bf16"
    else:
      plan[p] = default
  if strict:
    unused = [g for g in tuple(keep_fp32) + tuple(keep)
              if not any(fnmatch.fnmatchcase(p, g) for p in paths)]
    if unused:
      raise ValueError(f"layer plan: pattern(s) {unused} match no parameter of "
                       f"{len(paths)} (names look like {paths[0]!r})")
  return plan


def served_mx_weight(w: jax.Array, axis: int, fmt: str = "e4m3", *,
                     scale_rule: str = "rceil", block_shape: int = MX_BLOCK) -> jax.Array:
  """The MX-served weight: float32 values of ``w`` quantized-dequantized in 1 x
  ``block_shape`` blocks along the contraction ``axis`` (E8M0 scales), the axis
  zero-padded to a multiple of the block first and cropped back after.

  The default rule (RCEIL) and format (E4M3) are those of the ``mxfp8`` recipe, so
  its forward GEMM re-quantizes the served weight to the same values.
  """
  w = jnp.asarray(w)
  return blockscale.quantize_dequantize_mx(w, fmt, block_shape=block_shape, axis=axis % w.ndim,
                                           scale_rule=scale_rule, pad=True)
