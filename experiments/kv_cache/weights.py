"""Weight-only post-training quantization of the kv_cache model: FP8 and AWQ-style 4-bit.

The Pareto atlas's "AWQ 4-bit and FP8 weights ... largely keep accuracy", in miniature.
Every ``Linear`` kernel inside the transformer blocks (``block_i/{qkv, attn_out, ff_in,
ff_out}``, float32[in, out]) is replaced by its quantized-then-dequantized value; the
embeddings, positions, norms and the output head stay float32 (AWQ keeps the head too).
The model then runs in float32 on those weights (fake quantization: the arithmetic is
what a dequantize-then-matmul kernel computes).

``--weight_format`` (:func:`parse_weight_format`):

* ``fp32``: unchanged (the baseline).
* ``<fmt>/channel``: one float32 scale per output channel, ``amax / fmt.max`` over the
  input axis (FP8 weights with per-channel scales, as vLLM's FP8 checkpoints).
* ``<fmt>/g<n>``: one float32 scale per group of ``n`` consecutive input channels of
  each output channel (``absmax / fmt.max``; AWQ's and GPTQ's group layout along the
  contraction axis, here with symmetric FP4 elements instead of AWQ's asymmetric int4).
* ``.../awq``: first AWQ's activation-aware scaling (Lin et al. 2024, "AWQ"): per input
  channel ``s_j = a_j^alpha`` with ``a_j`` the mean |activation| of channel ``j`` on a
  calibration batch, normalised by ``sqrt(max s * min s)``; the kernel's rows are
  multiplied by ``s``, quantized, and divided by ``s`` again (AWQ folds the ``1/s`` into
  the op before; here it stays in the weight, the same product). ``alpha`` is chosen per
  kernel from AWQ's grid ``0, 1/20, ..., 19/20`` by the mean squared error of the
  kernel's output on the calibration activations (the first minimum; ``alpha = 0`` is
  plain quantization, so the search never loses on the calibration batch). AWQ's
  weight-clipping search is not done.

Formats are the library's element formats (``e4m3``, ``e5m2``, ``e2m1``, ``int8``),
rounded by :func:`numerics.cast` (round to nearest even, saturating). A scale is
``amax * fl32(1 / fmt.max)`` and elements are scaled by ``w * fl32(1 / scale)`` (XLA
rewrites divisions into these reciprocal multiplies; spelling them out keeps the
NumPy reference equal), and decoded as
``q * scale`` (one float32 multiply each), so jit, eager and the NumPy reference agree
bit for bit; a group whose absmax is 0 (or below 2^-126) gets scale 1.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lowprec import numerics
from lowprec.models.transformer import Linear

WEIGHT_FORMATS = ("e4m3", "e5m2", "e2m1", "int8")
AWQ_GRID = tuple(i / 20 for i in range(20))  # AWQ's auto_scale grid (n_grid = 20)
# The kernels quantized: every Linear inside a transformer block.
QUANTIZED_PATH = re.compile(r"block_\d+/(qkv|attn_out|ff_in|ff_out)")
_MIN_NORMAL = np.float32(2.0 ** -126)


@dataclasses.dataclass(frozen=True)
class WeightSpec:
  """A weight quantizer: ``fmt`` (None: fp32), ``group`` (0: per output channel),
  ``awq`` (activation-aware scaling first)."""

  fmt: str | None = None
  group: int = 0
  awq: bool = False

  def __post_init__(self):
    if self.fmt is None and (self.group or self.awq):
      raise ValueError("fp32 weights take no group or awq")
    if self.fmt is not None and self.fmt not in WEIGHT_FORMATS:
      raise ValueError(f"unknown weight format {self.fmt!r}; known: fp32, "
                       f"{', '.join(WEIGHT_FORMATS)}")
    if self.group < 0:
      raise ValueError(f"group must be >= 0, got {self.group}")


def parse_weight_format(text: str) -> WeightSpec:
  """``fp32`` | ``<fmt>/channel[/awq]`` | ``<fmt>/g<n>[/awq]`` -> :class:`WeightSpec`."""
  parts = text.split("/")
  if parts == ["fp32"]:
    return WeightSpec()
  if parts[0] not in WEIGHT_FORMATS:
    raise ValueError(f"weight format {text!r}: unknown format {parts[0]!r}; known: fp32, "
                     f"{', '.join(WEIGHT_FORMATS)}")
  if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "awq"):
    raise ValueError(f"weight format {text!r}: expected <fmt>/channel or <fmt>/g<n>, "
                     "optionally followed by /awq")
  if parts[1] == "channel":
    group = 0
  elif re.fullmatch(r"g[1-9]\d*", parts[1]):
    group = int(parts[1][1:])
  else:
    raise ValueError(f"weight format {text!r}: granularity must be 'channel' or g<n> "
                     f"(e.g. g32), got {parts[1]!r}")
  return WeightSpec(parts[0], group, len(parts) == 3)


def quantize_kernel(w: jax.Array, spec: WeightSpec) -> jax.Array:
  """float32[in, out] kernel -> its quantized-dequantized value (see the module doc)."""
  if spec.fmt is None:
    return w
  n_in, n_out = w.shape
  group = spec.group or n_in
  if n_in % group:
    raise ValueError(f"a kernel with {n_in} input channels has no groups of {group}")
  # [in, out] -> [out, in/group, group]: a scale per (output channel, group).
  g = jnp.asarray(w, jnp.float32).T.reshape(n_out, n_in // group, group)
  amax = jnp.max(jnp.abs(g), axis=-1, keepdims=True)
  # amax * fl32(1 / max): XLA turns a division by a constant into this multiply anyway.
  scale = amax * np.float32(1.0 / numerics.formats.get(spec.fmt).max)
  scale = jnp.where(amax >= _MIN_NORMAL, scale, np.float32(1.0))
  q = numerics.cast(g * (np.float32(1.0) / scale), spec.fmt) * scale
  return q.reshape(n_out, n_in).T


def awq_kernel(w: jax.Array, x: jax.Array, spec: WeightSpec) -> tuple[jax.Array, float]:
  """AWQ: (quantized kernel, alpha) for kernel float32[in, out] and calibration inputs
  ``x`` float32[..., in] (see the module docstring)."""
  q, index = _awq(jnp.asarray(w, jnp.float32),
                  jnp.asarray(x, jnp.float32).reshape(-1, w.shape[0]), spec)
  return q, AWQ_GRID[int(index)]


@functools.partial(jax.jit, static_argnames=("spec",))
def _awq(w: jax.Array, x: jax.Array, spec: WeightSpec) -> tuple[jax.Array, jax.Array]:
  """(kernel quantized at the best alpha of the grid, its index): one program."""
  a = jnp.mean(jnp.abs(x), axis=0)
  ref = x @ w

  def candidate(alpha):
    s = jnp.maximum(a ** alpha, np.float32(1e-4))
    s = s / jnp.sqrt(jnp.max(s) * jnp.min(s))
    q = quantize_kernel(w * s[:, None], spec) / s[:, None]
    return q, jnp.mean((x @ q - ref) ** 2)

  qs, errs = jax.lax.map(candidate, jnp.asarray(AWQ_GRID, jnp.float32))
  best = jnp.argmin(errs)  # the first minimum
  return qs[best], best


def linear_inputs(model: nn.Module, params: Any, tokens: jax.Array,
                  key: jax.Array) -> dict[str, jax.Array]:
  """The input of every ``Linear`` of a full (uncached) forward pass, by module path
  (``"block_0/qkv"``)."""
  captured: dict[str, jax.Array] = {}

  def interceptor(next_fun: Callable, args, kwargs, context):
    if isinstance(context.module, Linear) and context.method_name == "__call__":
      captured["/".join(context.module.scope.path)] = args[0]
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(interceptor):
    model.apply({"params": params}, tokens, key)
  return captured


def quantize_params(params: Any, spec: WeightSpec,
                    inputs: dict[str, jax.Array] | None = None
                    ) -> tuple[Any, dict[str, float]]:
  """(params with every block kernel quantized, AWQ's alpha per kernel path).

  ``inputs`` (:func:`linear_inputs` on a calibration batch) is needed for ``awq``."""
  if spec.awq and inputs is None:
    raise ValueError("AWQ needs the calibration inputs of every quantized kernel")
  alphas: dict[str, float] = {}

  def visit(path, leaf):
    names = [p.key for p in path]
    module = "/".join(names[:-1])
    if spec.fmt is None or names[-1] != "kernel" or not QUANTIZED_PATH.fullmatch(module):
      return leaf
    if spec.awq:
      q, alphas[module] = awq_kernel(leaf, inputs[module], spec)
      return q
    return quantize_kernel(leaf, spec)

  quantized = jax.tree_util.tree_map_with_path(visit, params)
  if spec.fmt is not None and not any(QUANTIZED_PATH.fullmatch(
      "/".join(p.key for p in path[:-1])) for path, _ in
      jax.tree_util.tree_flatten_with_path(params)[0]):
    raise ValueError("no kernel of the model matches the quantized paths")
  return quantized, alphas
