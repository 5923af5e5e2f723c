"""KV-cache numerics in miniature: greedy accuracy and mismatch of a quantized KV cache.

    python -m experiments.kv_cache --key_cache=e4m3/tensor/unit     # the naive FP8 cache
    python -m experiments.kv_cache --key_cache=e4m3/tensor/unit --key_outlier_log2=8
    python -m experiments.kv_cache --key_cache=bf16 --value_cache=e4m3/tensor/unit \
        --key_outlier_log2=8

Evaluation only (nothing is trained per run). The base model is the RL experiments'
supervised warm start on 3-digit addition
(:func:`experiments.common.trainers.rl.warm_start.warm_start`, cached by config hash under ``pretrain_dir``), one base per ``seed`` (its
``pretrain_seed``), with 4 heads of 16 (so an MX cache of this model needs blocks of
16: ``e4m3/block/16``; with 2 heads of 32 the warm start does not learn). Its
keys can be given outlier channels by :func:`experiments.kv_cache.outliers.scale_key_channels`
(``key_outlier_log2``): an exact reparametrization whose float32 logits are bit for
bit the original's, so only what the cache stores changes.

Per run, on ``eval_problems`` held-out problems of the seed:

* the fp32 cache (the reference) decodes greedily and samples at ``temperature``
  with the seed's key (:func:`models.sampling.sample_cached`);
* the quantized cache (``key_cache`` / ``value_cache``, :func:`parse_cache`) decodes
  greedily (``kv/greedy_accuracy``: exact match; ``kv/greedy_agreement``: the same
  completion as the fp32 cache's) and replays the fp32 cache's samples teacher-forced
  (:func:`models.sampling.cached_sequence_log_probs`, same keys), giving the
  mismatch against the fp32 cache on the same tokens
  (:func:`numerics.rl.mismatch.mismatch_kl`: ``kv/mismatch_k3``, ``kv/mismatch_k1``,
  ``kv/max_abs_delta_logp`` over the answer tokens up to the end marker);
* what the cache does to the keys and values themselves, on the teacher-forced
  problems: relative L2 error (``kv/key_rel_error``, ``kv/value_rel_error``) and the
  fraction of elements stored with a relative error above 1/8
  (``kv/key_bad_frac``, ``kv/value_bad_frac``: beyond any FP8 format's rounding in its
  normal range, i.e. saturated, flushed or too coarse), and ``kv/bytes_per_token``.

Static scales (``tensor``/``head`` granularities): ``unit`` is scale 1 (the naive
cache: values cast directly); ``calibrated`` is ``amax / fmt.max`` over
``calibration_problems`` teacher-forced problems disjoint from the evaluation ones
(:func:`models.kv_cache.calibrate_scales`).
"""

from __future__ import annotations

import dataclasses
import fcntl
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common.data import arithmetic_task as task
from experiments.common.harness.config_flags import SEED_DOMAIN, check_fields, config_field
from experiments.common.harness import run as run_lib
from experiments.common.harness.run_options import RunOptions, resolve_run_options
from experiments.common.trainers.rl.config import RLConfig
from experiments.common.trainers.rl.warm_start import warm_start
from experiments.kv_cache.outliers import scale_key_channels
from experiments.kv_cache import weights as weights_lib
from lowprec.models import kv_cache, sampling
from lowprec.models.transformer import DecoderLM, TransformerConfig
from lowprec.numerics import kv_quant
from lowprec.numerics.rl.mismatch import mismatch_kl

EXPERIMENT = "kv_cache"
STATIC_SCALES = ("unit", "calibrated")
# Problem streams (seed offsets), disjoint from the warm start's (10_000, 20_000).
EVAL_STREAM, CALIBRATION_STREAM = 50_000, 60_000
BAD_RELATIVE_ERROR = 0.125


def parse_cache(text: str) -> tuple[kv_quant.KVQuantSpec, str | None]:
  """``"fmt[/granularity[/scale]]"`` -> (spec, static scale or None).

  ``fp32``, ``bf16``; ``e4m3|e5m2|int8`` with ``/tensor`` or ``/head`` and then
  ``/unit`` (scale 1, naive) or ``/calibrated``, or with ``/token`` or ``/block``
  (MX: an E8M0 scale per 32 elements along the head dim, the OCP block) or
  ``/block/<n>`` (the same with blocks of ``n``); ``nvfp4`` or ``nvfp4/block``.
  """
  parts = text.split("/")
  fmt = parts[0]
  if fmt not in kv_quant.KV_FORMATS:
    raise ValueError(f"cache {text!r}: unknown KV format {fmt!r}; known: "
                     f"{', '.join(kv_quant.KV_FORMATS)}")
  if fmt in ("fp32", "bf16"):
    if len(parts) != 1:
      raise ValueError(f"cache {text!r}: {fmt} takes no granularity")
    return kv_quant.KVQuantSpec(fmt), None
  if fmt == "nvfp4":
    if parts[1:] not in ([], ["block"]):
      raise ValueError(f"cache {text!r}: nvfp4 is 'nvfp4' or 'nvfp4/block'")
    return kv_quant.KVQuantSpec("nvfp4", "block"), None
  if len(parts) < 2:
    raise ValueError(f"cache {text!r} needs a granularity: {fmt}/tensor/unit, "
                     f"{fmt}/token, ...")
  spec = kv_quant.KVQuantSpec(fmt, parts[1])  # validates fmt and granularity
  if spec.is_static:
    if len(parts) != 3 or parts[2] not in STATIC_SCALES:
      raise ValueError(f"cache {text!r}: a {parts[1]!r} scale is static; end it with "
                       f"/{' or /'.join(STATIC_SCALES)}")
    return spec, parts[2]
  if parts[1] == "block" and len(parts) == 3:
    try:
      block = int(parts[2])
    except ValueError:
      raise ValueError(f"cache {text!r}: an MX block size must be an integer, got "
                       f"{parts[2]!r}") from None
    return kv_quant.KVQuantSpec(fmt, "block", block_size=block), None
  if len(parts) != 2:
    raise ValueError(f"cache {text!r}: a {parts[1]!r} scale is computed at write time; "
                     "give no scale")
  return spec, None


@dataclasses.dataclass(frozen=True)
class KVCacheConfig:
  """Everything that defines a run's result (its flags; written to config.json)."""

  seed: int = config_field(0, "Seed of the base model (its warm-start seed), the "
                           "evaluation problems and the sampling key.", domain=SEED_DOMAIN)
  key_cache: str = config_field("fp32", "How the cache stores keys: fmt[/granularity"
                                "[/scale]] (see parse_cache), e.g. e4m3/tensor/unit.")
  value_cache: str = config_field("", "How it stores values (empty: as keys).")
  key_outlier_log2: int = config_field(
      0, "Outlier key channels: scale them by 2^this (queries by the inverse); the "
      "float32 model is unchanged bit for bit.", domain="[-40, 40]")
  key_outlier_channels: int = config_field(
      0, "How many channels per head get the outlier gain (0: all).", domain="[0, inf)")
  digits: int = config_field(3, "Digits per addend.", domain="[1, 9]")
  d_model: int = config_field(64, "Model width.", domain="[1, inf)")
  num_layers: int = config_field(2, "Transformer blocks.", domain="[1, inf)")
  num_heads: int = config_field(4, "Attention heads (4: head dim 16).", domain="[1, inf)")
  d_ff: int = config_field(256, "Feed-forward hidden width.", domain="[1, inf)")
  pretrain_target_accuracy: float = config_field(
      0.95, "Warm-start stopping rule: a base whose held-out greedy accuracy is below "
      "this is retrained with twice the steps (see pretrain_attempts).", domain="[0, 1]")
  pretrain_attempts: int = config_field(
      4, "Warm starts tried at most (pretrain_steps, then doubling).", domain="[1, inf)")
  pretrain_steps: int = config_field(1200, "Supervised warm-start steps of the base.",
                                     domain="[0, inf)")
  pretrain_batch: int = config_field(64, "Warm-start batch size.", domain="[1, inf)")
  pretrain_lr: float = config_field(3e-3, "Warm-start AdamW learning rate.",
                                    domain="(0, inf)")
  pretrain_dir: str = config_field("runs/kv_cache/pretrain",
                                   "Cache of base-model weights (by config hash).")
  eval_problems: int = config_field(512, "Held-out problems decoded per run.",
                                    domain="[1, inf)")
  calibration_problems: int = config_field(64, "Problems for calibrated static scales.",
                                           domain="[1, inf)")
  temperature: float = config_field(1.0, "Sampling temperature of the mismatch samples.",
                                    domain="(0, inf)")
  weight_format: str = config_field(
      "fp32", "Weight-only post-training quantization of the blocks' kernels: fp32, "
      "<fmt>/channel or <fmt>/g<n>, optionally /awq (see experiments.kv_cache.weights), "
      "e.g. e4m3/channel, e2m1/g32/awq.")

  def __post_init__(self):
    check_fields(self)
    parse_cache(self.key_cache)
    parse_cache(self.value_cache or self.key_cache)
    weights_lib.parse_weight_format(self.weight_format)
    if self.d_model % self.num_heads:
      raise ValueError(f"d_model={self.d_model} is not divisible by num_heads="
                       f"{self.num_heads}")
    if self.key_outlier_channels > self.d_model // self.num_heads:
      raise ValueError(f"key_outlier_channels={self.key_outlier_channels} exceeds the head "
                       f"dim {self.d_model // self.num_heads}")
    if self.key_outlier_channels and not self.key_outlier_log2:
      raise ValueError("key_outlier_channels has no effect with key_outlier_log2=0")

  def rl_config(self) -> RLConfig:
    """The warm start's config (only its warm-start fields are read)."""
    return RLConfig(seed=self.seed, digits=self.digits, d_model=self.d_model,
                    num_layers=self.num_layers, num_heads=self.num_heads, d_ff=self.d_ff,
                    pretrain_seed=self.seed, pretrain_steps=self.pretrain_steps,
                    pretrain_batch=self.pretrain_batch, pretrain_lr=self.pretrain_lr,
                    pretrain_dir=self.pretrain_dir, eval_problems=self.eval_problems)

  def model(self) -> DecoderLM:
    length = task.prompt_length(self.digits) + task.answer_length(self.digits)
    return DecoderLM(TransformerConfig(
        vocab_size=task.VOCAB_SIZE, d_model=self.d_model, num_layers=self.num_layers,
        num_heads=self.num_heads, d_ff=self.d_ff, max_len=length))


def base_params(config: KVCacheConfig) -> tuple[Any, dict[str, float]]:
  """The seed's warm-start params (trained once; parallel runs wait on a lock) with
  the configured outlier channels.

  Stopping rule, fixed before the runs: a warm start of ``pretrain_steps`` whose greedy
  accuracy on the warm start's own held-out problems (disjoint from the evaluation
  problems) is below ``pretrain_target_accuracy`` is retrained from scratch with twice
  the steps, at most ``pretrain_attempts`` times; the last one is used either way.
  The 1200-step warm start is a lottery across seeds (0.996 and 1.000 on seeds 0 and
  4, 0.16 / 0.31 / 0.02 on seeds 1-3), so a fixed step count does not give every seed
  a base that has learned the task. ``info["pretrain_steps"]`` records the steps used.
  """
  os.makedirs(config.pretrain_dir, exist_ok=True)
  with open(os.path.join(config.pretrain_dir, f".lock-{config.seed}"), "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    rl_config, model = config.rl_config(), config.model()
    for attempt in range(config.pretrain_attempts):
      steps = config.pretrain_steps * 2 ** attempt
      params, info = warm_start(dataclasses.replace(rl_config, pretrain_steps=steps), model)
      if info["greedy_accuracy"] >= config.pretrain_target_accuracy:
        break
    info = {**info, "pretrain_steps": steps}
  params = scale_key_channels(params, config.num_heads, config.key_outlier_log2,
                              config.key_outlier_channels)
  return params, info


def _cache_error(x: jax.Array, spec: kv_quant.KVQuantSpec, scale: Any,
                 key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(relative L2 error, fraction of elements with relative error > 1/8) of storing
  ``x`` float32[B, H, L, K] as ``spec`` with static ``scale``."""
  stored = kv_quant.init(spec, x.shape, scale)
  y = kv_quant.read(kv_quant.write(stored, x, 0, key if spec.rounding.needs_key else None))
  rel = jnp.linalg.norm(y - x) / jnp.maximum(jnp.linalg.norm(x), 1e-30)
  bad = jnp.abs(y - x) > BAD_RELATIVE_ERROR * jnp.abs(x)
  return rel, jnp.mean(bad.astype(jnp.float32))


def evaluate(config: KVCacheConfig, params: Any) -> dict[str, float]:
  """The run's metrics (see the module docstring); one compiled program.

  With a ``weight_format`` other than fp32 the quantized path (greedy accuracy,
  agreement, replayed samples, stored keys and values) runs the weight-quantized model
  (:mod:`experiments.kv_cache.weights`, AWQ calibrated on the calibration problems), and
  the fp32 cache keeps the float32 weights: the mismatch is then that of the
  quantized weights and cache together against the float32 model."""
  model = config.model()
  key_spec, key_scale = parse_cache(config.key_cache)
  value_spec, value_scale = parse_cache(config.value_cache or config.key_cache)
  prompt_len, num_new = task.prompt_length(config.digits), task.answer_length(config.digits)
  model_key = jax.random.PRNGKey(0)
  cal = task.supervised_batch(seed=CALIBRATION_STREAM + config.seed, position=0,
                              batch_size=config.calibration_problems, digits=config.digits)
  cal_tokens = jnp.asarray(np.concatenate([cal["inputs"], cal["targets"][:, -1:]], 1))
  weight_spec = weights_lib.parse_weight_format(config.weight_format)
  inputs = (weights_lib.linear_inputs(model, params, cal_tokens, model_key)
            if weight_spec.awq else None)
  qparams, alphas = weights_lib.quantize_params(params, weight_spec, inputs)
  scales: dict[str, Any] = {}
  if key_scale == "calibrated":
    scales["key_scales"] = kv_cache.calibrate_scales(model, qparams, cal_tokens,
                                                     model_key, key_spec, key_spec)[0]
  if value_scale == "calibrated":
    scales["value_scales"] = kv_cache.calibrate_scales(model, qparams, cal_tokens,
                                                       model_key, value_spec, value_spec)[1]
  quant = kv_cache.cached_lm(model, key_spec, value_spec, **scales)
  ref = kv_cache.cached_lm(model)
  p = task.problems(seed=EVAL_STREAM + config.seed, position=0,
                    batch_size=config.eval_problems, digits=config.digits)
  prompts = jnp.asarray(p["prompts"])
  full = jnp.asarray(np.concatenate([p["prompts"], p["answers"]], 1)[:, :-1])
  sample_key = jax.random.PRNGKey(config.seed)

  @jax.jit
  def run(prm, qprm):
    greedy = lambda cm, w: sampling.sample_cached(cm, w, prompts, num_new, model_key,
                                                  top_k=1).tokens[:, prompt_len:]
    drawn = sampling.sample_cached(ref, prm, prompts, num_new, sample_key,
                                   temperature=config.temperature)
    replayed = sampling.cached_sequence_log_probs(quant, qprm, drawn.tokens, prompt_len,
                                                  sample_key,
                                                  temperature=config.temperature)
    # Keys and values of the teacher-forced problems, stored and read back.
    _, cache = model.apply({"params": qprm}, full, model_key,
                           cache=kv_cache.init_cache(model.config, *full.shape))
    errors = {}
    for kind, spec, layer_scales, stored in (
        ("key", key_spec, scales.get("key_scales"), cache.keys),
        ("value", value_spec, scales.get("value_scales"), cache.values)):
      per_layer = [_cache_error(kv_quant.read(c), spec,
                                None if layer_scales is None else layer_scales[i],
                                jax.random.fold_in(model_key, i))
                   for i, c in enumerate(stored)]
      errors[f"{kind}_rel_error"] = jnp.mean(jnp.stack([e[0] for e in per_layer]))
      errors[f"{kind}_bad_frac"] = jnp.mean(jnp.stack([e[1] for e in per_layer]))
      errors[f"{kind}_abs_max"] = jnp.max(jnp.stack([jnp.max(jnp.abs(kv_quant.read(c)))
                                                     for c in stored]))
    return greedy(ref, prm), greedy(quant, qprm), drawn, replayed, errors

  ref_greedy, q_greedy, drawn, replayed, errors = jax.device_get(run(params, qparams))
  mask = task.completion_mask(np.asarray(drawn.tokens[:, prompt_len:]))
  mismatch = mismatch_kl(jnp.asarray(replayed), jnp.asarray(drawn.logp), jnp.asarray(mask))
  return {
      "kv/greedy_accuracy": float(task.rewards(q_greedy, p["answers"]).mean()),
      "kv/greedy_agreement": float(np.mean(np.all(q_greedy == ref_greedy, axis=1))),
      "kv/fp32_greedy_accuracy": float(task.rewards(ref_greedy, p["answers"]).mean()),
      "kv/mismatch_k3": float(mismatch["k3"]), "kv/mismatch_k1": float(mismatch["k1"]),
      "kv/max_abs_delta_logp": float(mismatch["max_abs_delta_logp"]),
      "kv/bytes_per_token": kv_cache.bytes_per_token(model.config, key_spec, value_spec),
      **{f"kv/{k}": float(v) for k, v in errors.items()},
      **weight_metrics(params, qparams, alphas),
  }


def weight_metrics(params: Any, qparams: Any, alphas: dict[str, float]) -> dict[str, float]:
  """``weights/rel_error``: relative L2 error of the quantized kernels (all together; 0
  for fp32); with AWQ, ``weights/awq_alpha``: its mean chosen alpha."""
  diff = sum(float(jnp.sum((q - p) ** 2)) for p, q in
             zip(jax.tree.leaves(params), jax.tree.leaves(qparams)))
  norm = sum(float(jnp.sum(p ** 2)) for p, q in
             zip(jax.tree.leaves(params), jax.tree.leaves(qparams)) if q is not p)
  out = {"weights/rel_error": math.sqrt(diff / norm) if norm else 0.0}
  if alphas:
    out["weights/awq_alpha"] = float(np.mean(list(alphas.values())))
  return out


def train_and_evaluate(config: KVCacheConfig, options: RunOptions) -> dict[str, Any]:
  """One evaluation run: its metrics as scalars at step 1 (HParams metrics) and one
  results row. Nothing is checkpointed (a run is seconds; a killed one reruns)."""
  options = resolve_run_options(options, EXPERIMENT, config)
  with run_lib.open_run(EXPERIMENT, config, options, checkpoints=False) as run:
    params, info = base_params(config)
    run.record({"warm_start": info})
    t_eval = time.perf_counter()
    metrics = evaluate(config, params)
    metrics["kv/eval_s"] = time.perf_counter() - t_eval
    metrics["warm_start/greedy_accuracy"] = info["greedy_accuracy"]
    metrics["warm_start/steps"] = info["pretrain_steps"]
    return run.finish_evaluation(
        metrics, num_params=sum(x.size for x in jax.tree.leaves(params)))
