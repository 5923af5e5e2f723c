"""Weight histograms and the recipe's quantization error on each weight matrix.

The error of a recipe on a kernel ``W[in, out]`` is measured through the recipe's own
``dot_general`` as ``dot_general(I_in, W) - W``: with an identity left operand (exactly
representable in every format, block scale 1) each output is one product accumulated in
fp32, so the result is the forward GEMM's view of ``W`` after quantization. Recipes that
transform operands (e.g. Hadamard rotations) give the error of the whole GEMM on ``W``.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from lowprec.models.transformer import DotGeneral
from lowprec.numerics import tree_paths


def make_inspector(dot_general: DotGeneral, *, max_kernel_dim: int = 4096,
                   skip_prefixes: tuple[str, ...] = (), skip_names: tuple[str, ...] = ()
                   ) -> Callable[[Any], tuple[dict[str, np.ndarray], dict[str, float]]]:
  """``inspect(params) -> (histograms, scalars)`` for the train loop.

  Histograms: ``params/<path>`` for every leaf, ``numerics/weight_quant_error/<path>`` for
  every 2-D kernel (fan-in <= ``max_kernel_dim``, to bound the identity's size) whose
  path does not start with one of ``skip_prefixes`` (kernels the recipe does not
  quantize, e.g. a bf16 LM head) and none of whose path components is in ``skip_names``
  (e.g. every MoE ``router``). Scalars:
  ``numerics/weight_quant_rel_error/<path>`` = ||Q(W) - W|| / ||W||.
  """

  @jax.jit
  def errors(params):
    out = {}
    for path, w in jax.tree_util.tree_flatten_with_path(params)[0]:
      name = tree_paths.path_name(path)
      if (w.ndim != 2 or w.shape[0] > max_kernel_dim or not name.endswith("kernel")
          or name.startswith(skip_prefixes) or set(name.split("/")) & set(skip_names)):
        continue
      eye = jnp.eye(w.shape[0], dtype=jnp.float32)
      q = dot_general(eye, w, (((1,), (0,)), ((), ())), jax.random.PRNGKey(0))
      out[tree_paths.path_name(path)] = q - w
    return out

  def inspect(params):
    errs = jax.device_get(errors(params))
    host = jax.device_get(params)
    histograms = {f"params/{tree_paths.path_name(p)}": np.asarray(v)
                  for p, v in jax.tree_util.tree_flatten_with_path(host)[0]}
    scalars = {}
    flat = {tree_paths.path_name(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(host)[0]}
    for name, err in errs.items():
      histograms[f"numerics/weight_quant_error/{name}"] = np.asarray(err)
      norm = float(np.linalg.norm(flat[name]))
      scalars[f"numerics/weight_quant_rel_error/{name}"] = (
          float(np.linalg.norm(err)) / norm if norm > 0 else 0.0)
    return histograms, scalars

  return inspect
