"""Weight-sync correctness checks between an RL learner and its sampler.

The learner keeps float32 master weights and trains under a recipe (``fp32``, ``bf16``
or ``mxfp8``); at every sync it hands the sampler a served copy (an ``Export`` of the
masters, :mod:`numerics.rl.sampler_copy`), which the sampler runs in its own recipe.
How the sampler serves each layer (the layer plan, MX weights quantized at each sync)
is :mod:`experiments.mxfp8_rl.serving`; the parity tolerances per recipe pair are
:mod:`experiments.mxfp8_rl.parity_tolerances`.

Each check is a pure host-side function run at every sync: it returns a dict of float
metrics when the sync is right and raises :class:`WeightSyncError` naming the tensor
(or layer) and the numbers when it is not. :func:`run_sync_checks` runs all seven:

1. :func:`check_coverage`: every tensor synced, same names and shapes.
2. :func:`check_plan`: per-layer recipes agree and served dtypes match them.
3. :func:`check_bitwise`: served weights are the export of the learner's, bit for bit.
4. :func:`check_version`: the version advanced to the learner step, syncs + 1.
5. :func:`check_logprob_parity`: probe-batch log-probs within the pair's tolerance.
6. :func:`check_finite` and :func:`check_mx_scales`: no NaN/Inf; MX scales in range
   and elements on the element grid.
7. :func:`check_padding_invariance`: padding tokens does not move real logits.

Parameter names are the ``'/'``-joined pytree paths (``params/block_0/qkv/kernel``).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lowprec.numerics import blockscale
from lowprec.numerics.blockscale import MX_BLOCK
from lowprec.numerics import formats as formats_lib
from lowprec.numerics import rounding as rounding_lib
from lowprec.numerics import tree_paths
from lowprec.numerics.rl import mismatch
from experiments.mxfp8_rl.parity_tolerances import PARITY_TOLERANCES, Tolerance
from lowprec.numerics.rl.sampler_copy import Export, SamplerCopy
from experiments.mxfp8_rl.serving import MX_SERVED_FORMATS

_MAX_LISTED = 8  # names / blocks listed in an error message


class WeightSyncError(RuntimeError):
  """A weight sync is wrong; the message names the tensor/layer and the numbers."""


# --------------------------------------------------------------------------- helpers


def _listed(items: Sequence[Any]) -> str:
  items = list(items)
  more = f", ... ({len(items) - _MAX_LISTED} more)" if len(items) > _MAX_LISTED else ""
  return ", ".join(str(i) for i in items[:_MAX_LISTED]) + more


def _shape(x: Any) -> tuple[int, ...]:
  return tuple(np.shape(x))


def _prefixed(prefix: str, metrics: Mapping[str, float]) -> dict[str, float]:
  return {f"{prefix}{k}": v for k, v in metrics.items()}


# --------------------------------------------------------------------- 1. coverage


def check_coverage(learner_params: Any, served_params: Any) -> dict[str, float]:
  """Every learner tensor is in the served copy under the same name and shape.

  Raises:
    WeightSyncError: listing the missing, extra and mis-shaped names.
  """
  learner, served = tree_paths.named_leaves(learner_params), tree_paths.named_leaves(served_params)
  missing = [n for n in learner if n not in served]
  extra = [n for n in served if n not in learner]
  shapes = [f"{n} (learner {_shape(learner[n])}, served {_shape(served[n])})"
            for n in learner if n in served and _shape(learner[n]) != _shape(served[n])]
  problems = []
  if missing:
    problems.append(f"{len(missing)} missing from the served copy: {_listed(missing)}")
  if extra:
    problems.append(f"{len(extra)} extra in the served copy: {_listed(extra)}")
  if shapes:
    problems.append(f"{len(shapes)} mis-shaped: {_listed(shapes)}")
  if problems:
    raise WeightSyncError(f"coverage: {len(learner)} learner tensors, {len(served)} "
                          f"served; " + "; ".join(problems))
  return {"num_tensors": float(len(learner)),
          "num_elements": float(sum(int(np.prod(_shape(v))) for v in learner.values()))}


# ------------------------------------------------------------------------- 2. plan


def check_plan(served_plan: Mapping[str, str], learner_plan: Mapping[str, str],
               served_params: Any, expected_dtypes: Mapping[str, Any]) -> dict[str, float]:
  """The served per-layer recipes are the configured ones, and each served leaf has
  the dtype its recipe implies (``expected_dtypes[recipe]``).

  ``learner_plan`` is the serving plan as the learner resolves it (its names, the
  configured exclusion list); ``served_plan`` as the sampler resolved it.

  Raises:
    WeightSyncError: naming the layers whose recipes differ (or that one plan lacks)
      and the leaves whose dtypes are wrong.
  """
  problems = []
  differ = [f"{n} (learner {learner_plan[n]}, served {served_plan[n]})"
            for n in learner_plan if n in served_plan and learner_plan[n] != served_plan[n]]
  if differ:
    problems.append(f"{len(differ)} layer(s) in different recipes: {_listed(differ)}")
  only_l = [n for n in learner_plan if n not in served_plan]
  only_s = [n for n in served_plan if n not in learner_plan]
  if only_l:
    problems.append(f"only in the learner plan: {_listed(only_l)}")
  if only_s:
    problems.append(f"only in the served plan: {_listed(only_s)}")
  served = tree_paths.named_leaves(served_params)
  unplanned = [n for n in served if n not in served_plan]
  if unplanned:
    problems.append(f"served tensors without a plan entry: {_listed(unplanned)}")
  dtypes = []
  for n, leaf in served.items():
    if n not in served_plan:
      continue
    recipe = served_plan[n]
    if recipe not in expected_dtypes:
      dtypes.append(f"{n} (recipe {recipe!r} has no expected dtype)")
      continue
    want, got = jnp.dtype(expected_dtypes[recipe]), jnp.dtype(jnp.result_type(leaf))
    if got != want:
      dtypes.append(f"{n} ({recipe}: expected {want}, served {got})")
  if dtypes:
    problems.append(f"{len(dtypes)} served dtype(s) wrong: {_listed(dtypes)}")
  if problems:
    raise WeightSyncError("layer plan: " + "; ".join(problems))
  counts = {}
  for r in served_plan.values():
    counts[f"layers_{r}"] = counts.get(f"layers_{r}", 0.0) + 1.0
  return counts


# ---------------------------------------------------------------------- 3. bitwise


def _bits(x: np.ndarray) -> np.ndarray:
  return x.view(np.dtype(f"uint{8 * x.dtype.itemsize}")) if x.dtype.itemsize in (
      1, 2, 4, 8) else x


def check_bitwise(served_params: Any, expected_served: Any) -> dict[str, float]:
  """The served weights equal ``expected_served`` (the export of the learner's
  weights) bit for bit: -0.0 vs 0.0 and NaN payloads count as differences.

  Raises:
    WeightSyncError: per differing tensor, the count of differing elements and the
      max abs difference (or the dtype/shape mismatch).
  """
  served, expected = tree_paths.named_leaves(served_params), tree_paths.named_leaves(expected_served)
  problems, total = [], 0
  for n, e in expected.items():
    if n not in served:
      problems.append(f"{n} (not served)")
      continue
    s, e = np.asarray(served[n]), np.asarray(e)
    if s.dtype != e.dtype or s.shape != e.shape:
      problems.append(f"{n} (served {s.dtype}{list(s.shape)}, expected "
                      f"{e.dtype}{list(e.shape)})")
      continue
    total += s.size
    diff = _bits(s) != _bits(e)
    if np.any(diff):
      d = np.abs(s[diff].astype(np.float64) - e[diff].astype(np.float64))
      worst = float(np.nanmax(d)) if np.any(~np.isnan(d)) else float("nan")
      first = tuple(int(i) for i in np.argwhere(diff)[0])
      problems.append(f"{n} ({int(diff.sum())} of {s.size} elements differ, max abs "
                      f"diff {worst:.6g}, first at {first}: served "
                      f"{s[first]!r} vs expected {e[first]!r})")
  extra = [n for n in served if n not in expected]
  if extra:
    problems.append(f"not in the export: {_listed(extra)}")
  if problems:
    raise WeightSyncError(f"bitwise: {len(problems)} tensor(s) differ from the export "
                          f"of the learner weights: " + "; ".join(problems))
  return {"bitwise_elements": float(total)}


# ---------------------------------------------------------------------- 4. version


def check_version(previous: SamplerCopy | None, current: SamplerCopy,
                  learner_step: int | jax.Array) -> dict[str, float]:
  """The sync produced a new copy: ``version == learner_step``, strictly greater than
  the previous version, and ``syncs == previous.syncs + 1`` (``1`` for the first copy).

  Raises:
    WeightSyncError: with the versions, step and sync counts.
  """
  version, syncs, step = int(current.version), int(current.syncs), int(learner_step)
  problems = []
  if version != step:
    problems.append(f"version {version} != learner step {step}")
  if previous is None:
    if syncs != 1:
      problems.append(f"first copy has syncs={syncs}, expected 1")
  else:
    pv, ps = int(previous.version), int(previous.syncs)
    if not version > pv:
      problems.append(f"version did not advance ({pv} -> {version})")
    if syncs != ps + 1:
      problems.append(f"syncs {ps} -> {syncs}, expected {ps + 1}")
  if problems:
    raise WeightSyncError("version: " + "; ".join(problems))
  return {"version": float(version), "syncs": float(syncs),
          "version_advance": float(version - (-1 if previous is None
                                              else int(previous.version)))}


# --------------------------------------------------------------------- 5. parity


def check_logprob_parity(sampler_logp: jax.Array, learner_logp: jax.Array,
                         mask: jax.Array, *, pair: tuple[str, str],
                         tolerances: Mapping[tuple[str, str], Tolerance] = PARITY_TOLERANCES
                         ) -> dict[str, float]:
  """Probe-batch log-probs agree within the tolerance of ``pair``.

  Args:
    sampler_logp, learner_logp: float32 ``[B, T]`` log-probs of the probe tokens under
      the served weights and under the learner's (recomputed), right after the sync.
    mask: ``[B, T]``, 1 for scored tokens.
    pair: ``(learner recipe, sampler recipe)``, a key of ``tolerances``.

  Returns:
    ``k1``, ``k3`` and ``max_abs_delta_logp`` (:func:`numerics.rl.mismatch.mismatch_kl`).

  Raises:
    ValueError: ``pair`` has no tolerance.
    WeightSyncError: k3 or max|dlogp| above tolerance (or not finite).
  """
  pair = tuple(pair)
  if pair not in tolerances:
    raise ValueError(f"no parity tolerance for (learner, sampler) = {pair}; known: "
                     f"{sorted(tolerances)}")
  tol = tolerances[pair]
  m = {k: float(v) for k, v in mismatch.mismatch_kl(learner_logp, sampler_logp,
                                                     mask).items()}
  problems = []
  if not m["k3"] <= tol.k3:
    problems.append(f"k3 {m['k3']:.3g} > {tol.k3:.3g}")
  if not m["max_abs_delta_logp"] <= tol.max_abs_delta_logp:
    problems.append(f"max|dlogp| {m['max_abs_delta_logp']:.3g} > "
                    f"{tol.max_abs_delta_logp:.3g}")
  if problems:
    raise WeightSyncError(f"logprob parity ({pair[0]} learner, {pair[1]} sampler): "
                          + ", ".join(problems) + f" (k1 {m['k1']:.3g})")
  return m


# ------------------------------------------------------------ 6. finite, MX scales


def check_finite(served_params: Any) -> dict[str, float]:
  """No NaN or Inf in any floating leaf of the served copy.

  Raises:
    WeightSyncError: per tensor, the NaN and Inf counts and the first bad index.
  """
  problems, total = [], 0
  for n, leaf in tree_paths.named_leaves(served_params).items():
    x = np.asarray(leaf)
    if not jnp.issubdtype(x.dtype, jnp.floating):
      continue
    x = x.astype(np.float32)  # exact for bf16/fp16/fp8; np.isfinite needs a numpy float
    total += x.size
    bad = ~np.isfinite(x)
    if np.any(bad):
      first = tuple(int(i) for i in np.argwhere(bad)[0])
      problems.append(f"{n} ({int(np.isnan(x).sum())} NaN, {int(np.isinf(x).sum())} "
                      f"Inf of {x.size}; first at {first})")
  if problems:
    raise WeightSyncError("non-finite served weights: " + "; ".join(problems))
  return {"finite_elements": float(total)}


@functools.partial(jax.jit, static_argnames=("axis", "block_shape"))
def _block_amax_bits(x32: jax.Array, axis: int, block_shape: int) -> jax.Array:
  """uint32 magnitude bits of each element's block amax (x's shape), via
  :func:`numerics.blockscale.block_statistic` (zero padding; bits, so no FTZ)."""

  def amax(values, valid, axes):
    del valid  # padding is zeros: it never raises the amax
    bits = jax.lax.bitcast_convert_type(values, jnp.uint32) & np.uint32(0x7FFFFFFF)
    return jnp.max(bits, axis=axes, keepdims=True)

  return blockscale.block_statistic(x32, amax, block_shape=block_shape, axis=axis, pad=True)


@functools.partial(jax.jit, static_argnames=("fmt", "scale_rule"))
def _scale_codes(amax_bits: jax.Array, fmt: str, scale_rule: str) -> jax.Array:
  return blockscale.mx_scale_exponent(amax_bits, formats_lib.get(fmt), scale_rule)


def _unclamped_codes(amax_bits: np.ndarray, fmt: str, scale_rule: str) -> np.ndarray:
  """int64 E8M0 codes the rule asks for, before the [0, 254] clamp.

  :func:`numerics.blockscale.mx_scale_exponent` on the amax shifted by ``2^k`` (exact,
  in float64 on the host so subnormals survive), then ``- k``."""
  finite = amax_bits < 0x7F800000
  amax = np.where(finite, amax_bits, 0).astype(np.uint32).view(np.float32)
  amax64 = amax.astype(np.float64)
  k = np.where(amax64 < 2.0 ** -32, 64, np.where(amax64 >= 2.0 ** 32, -64, 0))
  shifted = np.ldexp(amax64, k).astype(np.float32).view(np.uint32)
  code = np.asarray(_scale_codes(jnp.asarray(shifted), fmt, scale_rule))
  return code.astype(np.int64) - k


def check_mx_scales(x: jax.Array, block_shape: int = MX_BLOCK, axis: int = -2,
                    fmt: str = "e4m3", *, scale_rule: str = "rceil",
                    name: str = "tensor") -> dict[str, float]:
  """An MX-served tensor is representable in MX: for each 1 x ``block_shape`` block
  along ``axis`` (zero-padded), the E8M0 scale its amax implies under ``scale_rule``
  is a number (not the NaN code) in [2^-127, 2^127] without clamping, and every
  element divided by its block's scale is on ``fmt``'s grid with ``|v| <= max``.

  Args:
    x: float32/bfloat16 served values (dequantized), any shape with ``ndim >= 1``.
    axis: the contraction axis (``-2`` for a ``[K, N]`` kernel).

  Raises:
    WeightSyncError: naming ``name`` and the first offending blocks / elements.
  """
  f = formats_lib.get(fmt)
  if f.name not in blockscale.MX_ELEMENT_FORMATS:
    raise ValueError(f"MX element format must be one of {blockscale.MX_ELEMENT_FORMATS}, "
                     f"got {fmt!r}")
  x32 = jnp.asarray(x).astype(jnp.float32)
  if x32.ndim == 0:
    raise ValueError(f"{name}: MX blocks need an array with at least one axis")
  axis = axis % x32.ndim
  amax_bits = np.asarray(_block_amax_bits(x32, axis=axis, block_shape=block_shape))
  # Per-block values: the first element of each block along ``axis``.
  per_block = lambda a: np.take(a, np.arange(0, x32.shape[axis], block_shape), axis=axis)
  xs = np.asarray(x32)
  poisoned = amax_bits >= 0x7F800000
  zero = amax_bits == 0
  code = _unclamped_codes(amax_bits, f.name, scale_rule)
  out_of_range = ~poisoned & ~zero & ((code < 0) | (code > 254))
  num_blocks = int(per_block(zero).size)

  def where(m):  # the first element of each offending block (up to 4 blocks)
    starts = np.argwhere(per_block(m))[:4]
    starts[:, axis] *= block_shape
    return ", ".join(str(tuple(int(i) for i in idx)) for idx in starts)

  if np.any(poisoned):
    raise WeightSyncError(
        f"MX scales of {name}: {int(per_block(poisoned).sum())} of {num_blocks} block(s) "
        f"get the NaN scale code (NaN/Inf in the block), blocks starting at "
        f"{where(poisoned)}")
  if np.any(out_of_range):
    c = code[out_of_range]
    amax = amax_bits[out_of_range].astype(np.uint32).view(np.float32)
    raise WeightSyncError(
        f"MX scales of {name}: {int(per_block(out_of_range).sum())} of {num_blocks} "
        f"block(s) need a scale outside [2^-127, 2^127] (needed 2^{int(c.min()) - 127}.."
        f"2^{int(c.max()) - 127}, block amax {float(amax.min()):.3g}.."
        f"{float(amax.max()):.3g}), blocks starting at {where(out_of_range)}")
  s_int = np.where(zero, 0, code - 127 - (f.emax - f.mx_emax))
  v = np.ldexp(xs.astype(np.float64), -s_int)
  on_grid = np.asarray(rounding_lib.cast(jnp.asarray(v.astype(np.float32)), f,
                                         saturate=False)).astype(np.float64) == v
  bad = ~(on_grid & (np.abs(v) <= f.max))
  if np.any(bad):
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    raise WeightSyncError(
        f"MX scales of {name}: {int(bad.sum())} of {xs.size} element(s) not "
        f"representable in {f.name} at their block scale (first at {first}: "
        f"{float(xs[first]):.6g} / 2^{int(s_int[first])} = {float(v[first]):.6g}; max "
        f"|v| {float(np.max(np.abs(v))):.6g} vs {f.name} max {f.max:g})")
  nz = ~zero
  return {"mx_blocks": float(num_blocks),
          "mx_zero_blocks": float(per_block(zero).sum()),
          "mx_min_scale_exp": float((code[nz] - 127).min()) if np.any(nz) else 0.0,
          "mx_max_scale_exp": float((code[nz] - 127).max()) if np.any(nz) else 0.0}


# --------------------------------------------------------------------- 7. padding


def check_padding_invariance(logits_fn: Callable[[Any, jax.Array], jax.Array], params: Any,
                             tokens: jax.Array, *, multiple: int = MX_BLOCK,
                             pad_id: int = 0, atol: float = 0.0,
                             batch_multiple: int = 1) -> dict[str, float]:
  """Padding the sequence for the quantizer does not change real positions' logits.

  ``tokens`` int ``[B, L]`` is padded with ``pad_id`` along axis 1 to a multiple of
  ``multiple`` (by a full ``multiple`` if ``L`` already is one, so padding is always
  exercised) and along axis 0 to a multiple of ``batch_multiple``;
  ``logits_fn(params, tokens) -> [B, L, V]`` runs on both and the logits of the
  original ``[B, L]`` positions must agree within ``atol`` (exactly by default).

  Raises:
    WeightSyncError: with the max abs difference and where it is.
  """
  tokens = jnp.asarray(tokens)
  if tokens.ndim != 2:
    raise ValueError(f"tokens must be [batch, length], got shape {tokens.shape}")
  b, length = tokens.shape
  pad_l = (-length) % multiple or multiple
  pad_b = (-b) % batch_multiple
  padded = jnp.pad(tokens, ((0, pad_b), (0, pad_l)), constant_values=pad_id)
  ref = np.asarray(logits_fn(params, tokens), np.float64)
  got = np.asarray(logits_fn(params, padded), np.float64)[:b, :length]
  if ref.shape != got.shape:
    raise WeightSyncError(f"padding: logits shapes differ {ref.shape} vs {got.shape}")
  diff = np.abs(got - ref)
  diff = np.where(np.isnan(diff), np.inf, diff)
  worst = float(diff.max()) if diff.size else 0.0
  if not worst <= atol:
    at = tuple(int(i) for i in np.unravel_index(np.argmax(diff), diff.shape))
    raise WeightSyncError(
        f"padding: padding [{b}, {length}] tokens to [{b + pad_b}, {length + pad_l}] "
        f"with id {pad_id} changes real logits: {int((diff > atol).sum())} of "
        f"{diff.size} differ, max abs diff {worst:.6g} > atol {atol:g} at "
        f"(batch, pos, vocab) {at}")
  return {"padding_max_abs_diff": worst, "padded_length": float(length + pad_l)}


# ------------------------------------------------------------------------- all


CHECKS = ("coverage", "plan", "bitwise", "version", "parity", "finite", "mx_scales",
          "padding")
"""The checks of :func:`run_sync_checks`, in the order they run (6 is ``finite`` and
``mx_scales``); ``fired/<name>`` in record mode."""


def differing_elements(served_params: Any, expected_served: Any) -> int:
  """Elements of ``served_params`` whose bits differ from ``expected_served``'s (a
  tensor missing on either side, or of another dtype or shape, counts in full): the
  statistic of :func:`check_bitwise`."""
  served, expected = (tree_paths.named_leaves(served_params),
                      tree_paths.named_leaves(expected_served))
  count = 0
  for n in set(served) | set(expected):
    if n not in served or n not in expected:
      count += int(np.size(served.get(n, expected.get(n))))
      continue
    s, e = np.asarray(served[n]), np.asarray(expected[n])
    count += (int(s.size) if s.dtype != e.dtype or s.shape != e.shape
              else int(np.sum(_bits(s) != _bits(e))))
  return count


def run_sync_checks(learner_params: Any, previous: SamplerCopy | None,
                    current: SamplerCopy, learner_step: int | jax.Array, *,
                    export: Export, learner_plan: Mapping[str, str],
                    served_plan: Mapping[str, str], expected_dtypes: Mapping[str, Any],
                    learner_logp_fn: Callable[[Any], jax.Array],
                    sampler_logp_fn: Callable[[Any], jax.Array], mask: jax.Array,
                    pair: tuple[str, str],
                    logits_fn: Callable[[Any, jax.Array], jax.Array],
                    probe_tokens: jax.Array,
                    tolerances: Mapping[tuple[str, str], Tolerance] = PARITY_TOLERANCES,
                    mx_formats: Mapping[str, tuple[str, str]] = MX_SERVED_FORMATS,
                    mx_axis: int = -2, multiple: int = MX_BLOCK, pad_id: int = 0,
                    padding_atol: float = 0.0, prefix: str = "sync/",
                    record: bool = False) -> dict[str, float]:
  """All seven checks for one sync, in order; the merged metrics, ``prefix``-named.

  Args:
    learner_params: the learner's float32 masters the sync was taken from.
    previous, current: the sampler copy before (None at the first sync) and after.
    export: learner params -> served params (its output must equal
      ``current.params`` bit for bit).
    learner_plan, served_plan: :func:`resolve_layer_plan` of each side.
    expected_dtypes: recipe -> served dtype.
    learner_logp_fn, sampler_logp_fn: params -> float32 ``[B, T]`` probe log-probs
      (learner recipe on the masters; sampler recipe on the served copy).
    mask: ``[B, T]`` scored probe tokens. ``pair``: (learner, sampler) recipe.
    logits_fn, probe_tokens: the sampler's ``(params, tokens[B, L]) -> [B, L, V]`` and
      the probe tokens, for the padding check on the served copy.
    mx_formats: served recipes that are MX -> (element format, scale rule); their
      leaves get :func:`check_mx_scales` along ``mx_axis`` (``-1`` for 1-D leaves).
    padding_atol: the padding check's tolerance (a padded sequence is a different
      program shape, and a backend may accumulate its GEMMs in another order).
    record: instead of raising at the first failure, run every check and return, as
      well as the passing checks' metrics, ``fired/<check>`` (1.0 where the check
      raised, for each of :data:`CHECKS`) and each check's statistic, whatever its
      gate: ``stat/bitwise_differing`` (:func:`differing_elements`),
      ``stat/version_offset`` (served version minus learner step),
      ``stat/parity_k3``, ``stat/parity_max_abs_delta_logp`` (the probe mismatch) and
      ``stat/padding_max_abs_diff`` (the padding check's largest logit change), so a
      run measures the distribution of each statistic and the gates can be chosen
      from it.

  Raises:
    WeightSyncError: from the first failing check (unless ``record``).
  """
  served = current.params
  sampler_logp, learner_logp = sampler_logp_fn(served), learner_logp_fn(learner_params)
  expected = export(learner_params)

  def mx_scales() -> dict[str, float]:
    blocks, tensors, lo, hi, out = 0.0, 0.0, np.inf, -np.inf, {}
    for n, leaf in tree_paths.named_leaves(served).items():
      recipe = served_plan.get(n)
      if recipe not in mx_formats:
        continue
      fmt, rule = mx_formats[recipe]
      r = check_mx_scales(leaf, MX_BLOCK, mx_axis if np.ndim(leaf) >= 2 else -1, fmt,
                          scale_rule=rule, name=n)
      blocks, tensors = blocks + r["mx_blocks"], tensors + 1
      if r["mx_blocks"] > r["mx_zero_blocks"]:
        lo, hi = min(lo, r["mx_min_scale_exp"]), max(hi, r["mx_max_scale_exp"])
    out.update({"mx_tensors": tensors, "mx_blocks": blocks})
    if tensors:
      out.update({"mx_min_scale_exp": float(lo), "mx_max_scale_exp": float(hi)})
    return out

  padding = lambda atol: check_padding_invariance(
      logits_fn, served, probe_tokens, multiple=multiple, pad_id=pad_id, atol=atol)
  checks: dict[str, Callable[[], dict[str, float]]] = {
      "coverage": lambda: check_coverage(learner_params, served),
      "plan": lambda: check_plan(served_plan, learner_plan, served, expected_dtypes),
      "bitwise": lambda: check_bitwise(served, expected),
      "version": lambda: check_version(previous, current, learner_step),
      "parity": lambda: check_logprob_parity(sampler_logp, learner_logp, mask, pair=pair,
                                             tolerances=tolerances),
      "finite": lambda: check_finite(served),
      "mx_scales": mx_scales,
      "padding": lambda: padding(padding_atol),
  }
  m: dict[str, float] = {}
  if not record:
    for check in checks.values():
      m.update(check())
    return _prefixed(prefix, m)
  padded = padding(np.inf)  # the statistic, once; then gated like the check
  padding_stat = padded["padding_max_abs_diff"]

  def padding_gated() -> dict[str, float]:
    if not padding_stat <= padding_atol:
      raise WeightSyncError(f"padding: max abs diff {padding_stat:.6g} > atol "
                            f"{padding_atol:g}")
    return padded

  checks["padding"] = padding_gated
  for name, check in checks.items():
    try:
      m.update(check())
      m[f"fired/{name}"] = 0.0
    except WeightSyncError:
      m[f"fired/{name}"] = 1.0
  parity = mismatch.mismatch_kl(learner_logp, sampler_logp, mask)
  m.update({"stat/bitwise_differing": float(differing_elements(served, expected)),
            "stat/version_offset": float(int(current.version) - int(learner_step)),
            "stat/parity_k3": float(parity["k3"]),
            "stat/parity_max_abs_delta_logp": float(parity["max_abs_delta_logp"]),
            "stat/padding_max_abs_diff": float(padding_stat)})
  return _prefixed(prefix, m)
