"""Block-scale rules compared as post-training quantization of the char-level LM.

    python -m experiments.scale_rules --fmt=e2m1 --scale_rule=rceil
    python -m experiments.scale_rules --fmt=nvfp4          # E4M3 block scales (TE)
    python -m experiments.scale_rules --fmt=bf16           # the baseline: no block scaling

The question (issue 54; a Transformer Engine thread gives perplexities of 21.94, 22.50
and 23.54 for three MX scale rules on one model): on the same trained weights, which
rule for a block's shared scale loses least? One run is one (seed, arm):

1. The seed's base: the char-level LM of :mod:`experiments.lm` (``LMConfig``'s fields,
   trained in float32 from ``seed``), trained once and cached under ``pretrain_dir`` by
   the hash of every field that defines it (parallel runs of one seed wait on a lock).
2. Its validation loss with every linear projection of the blocks (q/k/v, output,
   MLP: both operands, activations and weights) quantized to ``fmt`` with the block
   scale from ``scale_rule`` and dequantized (fake quantization, round to nearest
   even), and the attention products and the head in bf16 (the experiments' rule list,
   :func:`experiments.common.trainers.recipe_flag.model_rules`). ``fmt=bf16`` is the baseline:
   the same model with bf16 projections, so ``arm − bf16`` is the block format's cost.

Formats: ``e4m3`` (MXFP8) and ``e2m1`` (MXFP4) with E8M0 scales over 32 elements along
the contraction axis, the scale from :data:`numerics.mx_scales.SCALE_RULES` (OCP's
``floor``: ``2^(floor(log2 amax) − emax)``, which can saturate a block's largest
elements; ``rceil``: the smallest power of two with ``amax / scale <= max``, which
never does; ``qwix``: qwix 0.1.8's ``2^ceil(log2(amax / max))`` in float32, rceil except
at exact powers of two; ...); ``nvfp4``: E2M1 with E4M3 scales over 16 elements and a float32
tensor scale (Transformer Engine's convention; ``scale_rule`` must be ``none``).

Metrics (scalars at step 1, one results row): ``eval/loss`` and ``eval/accuracy`` of
the quantized model on ``eval_batches`` fixed validation windows, ``base/eval_loss`` of
the float32 base on the same windows, ``ptq/loss_increase`` (their difference),
``ptq/saturated_{act,weight}`` and ``ptq/sqnr_db_{act,weight}`` (the quantized
activations' and weights' saturated fraction and SQNR, means over the GEMMs and
batches; absent for bf16), ``base/train_s`` (0 when the base came from the cache).
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common.data import shakespeare
from experiments.common.harness import params_cache
from experiments.common.harness import run as run_lib
from experiments.common.harness.config_flags import config_field
from experiments.common.harness.run_options import RunOptions, resolve_run_options
from experiments.common.harness.train_loop import PERIODIC
from experiments.common.trainers import lm_trainer
from experiments.common.trainers.lm_trainer import LMConfig
from lowprec.numerics import mx_scales
from lowprec.numerics import recipes as recipes_lib

EXPERIMENT = "scale_rules"
FORMATS = ("bf16", "e4m3", "e2m1", "nvfp4")
SCALE_RULES = ("none",) + tuple(mx_scales.SCALE_RULES) + (mx_scales.QWIX_RULE,)
# The LMConfig fields that define the base (what the cache key hashes).
_BASE_FIELDS = tuple(f.name for f in dataclasses.fields(LMConfig)
                     if f.name not in PERIODIC + ("recipe", "eval_batches",
                                                  "numerics_telemetry", "native_gemm"))


@dataclasses.dataclass(frozen=True)
class ScaleRulesConfig(LMConfig):
  """The base LM's fields (``LMConfig``; ``recipe`` unused: the base trains in
  float32) and the quantization evaluated on it."""

  fmt: str = config_field("e2m1", "Element format of the quantized projections (bf16: "
                          "the baseline, no block scaling).", choices=FORMATS)
  scale_rule: str = config_field(
      "floor", "The MX block-scale rule (numerics.mx_scales; qwix: qwix 0.1.8's); none "
      "for bf16 and nvfp4.",
      choices=SCALE_RULES)
  numerics_telemetry: bool = config_field(
      True, "Record the quantized operands' saturated fraction and SQNR (ptq/...).")
  pretrain_dir: str = config_field(
      "runs/scale_rules/pretrain", "Cache of the trained bases (one .npz per base).")

  def __post_init__(self):
    super().__post_init__()
    mx = self.fmt in ("e4m3", "e2m1")
    if mx == (self.scale_rule == "none"):
      raise ValueError(
          f"--scale_rule={self.scale_rule} with --fmt={self.fmt}: the MX formats (e4m3, "
          f"e2m1) take one of {', '.join(SCALE_RULES[1:])}; bf16 and nvfp4 take none")

  def model_recipe(self) -> Any:
    """The evaluated projections' recipe: forward GEMM only (an evaluation has no
    backward), both operands quantized along the contraction axis."""
    if self.fmt == "bf16":
      return "bf16"
    if self.fmt == "nvfp4":
      q = recipes_lib.NVFP4Quant()
    else:
      q = recipes_lib.MXQuant(fmt=self.fmt, scale_rule=self.scale_rule)
    return recipes_lib.Recipe(name=f"ptq_{self.fmt}_{self.scale_rule}",
                              forward=recipes_lib.GemmRecipe(lhs=q, rhs=q),
                              compute_dtype="fp32")

  def base_config(self) -> LMConfig:
    """The float32 training run whose final params are the base."""
    return LMConfig(**{name: getattr(self, name) for name in _BASE_FIELDS},
                    recipe="fp32")


def _train_base(base: LMConfig, train_tokens: np.ndarray, vocab_size: int) -> Any:
  """``base.num_steps`` AdamW steps of the float32 LM from ``base.seed`` (init key and
  data order from the seed, as :mod:`experiments.lm`'s trainer draws them: windows by
  ``(seed, step)``)."""
  parts = lm_trainer.build_lm(base, vocab_size)
  key = jax.random.PRNGKey(base.seed)
  init_key, step_key = jax.random.split(key)
  params = parts.model.init(init_key, jnp.zeros((1, base.seq_len), jnp.int32),
                            init_key)["params"]
  optimizer = base.optimizer()
  opt_state = optimizer.init(params)

  @jax.jit
  def step(params, opt_state, batch, key):
    # {}: the float32 base carries no quantization state.
    grads, _ = jax.grad(parts.loss_fn, has_aux=True)(params, {}, batch, key)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return jax.tree.map(lambda p, u: p + u, params, updates), opt_state

  for i in range(base.num_steps):
    batch = shakespeare.train_batch(train_tokens, seed=base.seed, position=i,
                                    batch_size=base.batch_size, seq_len=base.seq_len)
    params, opt_state = step(params, opt_state, batch, jax.random.fold_in(step_key, i))
  return params


def base_params(config: ScaleRulesConfig, splits: shakespeare.Splits
                ) -> tuple[Any, dict[str, float]]:
  """The seed's trained float32 params (from the cache, or trained and cached) and
  ``{"train_s": seconds spent training here (0 from the cache)}``."""
  base = config.base_config()
  vocab = splits.vocab.size
  os.makedirs(config.pretrain_dir, mode=0o700, exist_ok=True)
  digest = params_cache.digest({f: getattr(base, f) for f in _BASE_FIELDS})
  path = os.path.join(config.pretrain_dir, f"{digest}.npz")
  parts = lm_trainer.build_lm(base, vocab)
  like = jax.eval_shape(lambda: parts.model.init(
      jax.random.PRNGKey(0), jnp.zeros((1, base.seq_len), jnp.int32),
      jax.random.PRNGKey(0))["params"])
  with open(os.path.join(config.pretrain_dir, f".lock-{digest}"), "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if os.path.exists(path):
      params, _ = params_cache.load(path, like)
      return params, {"train_s": 0.0}
    t0 = time.perf_counter()
    params = _train_base(base, splits.train, vocab)
    params_cache.save(path, params, {"digest": digest})
    return params, {"train_s": time.perf_counter() - t0}


# Telemetry of each quantized GEMM operand (:mod:`lowprec.models.quantization`), averaged
# over the blocks' GEMMs and the batches: lhs is the activation, rhs the weight.
_TELEMETRY = {"saturated": "saturated", "sqnr_db": "sqnr_db"}
_SIDES = {"forward_lhs": "act", "forward_rhs": "weight"}


def evaluate(config: LMConfig, params: Any, batches: list[dict[str, np.ndarray]],
             vocab_size: int) -> dict[str, float]:
  """``{"loss", "accuracy"}`` (means over ``batches``) of ``config``'s model on
  ``params``, and with ``config.numerics_telemetry`` the quantized operands' mean
  saturated fraction and SQNR (``ptq/saturated_act``, ``ptq/sqnr_db_weight``, ...)."""
  parts = lm_trainer.build_lm(config, vocab_size)
  # The quantization state alone: the telemetry init sows (random weights, zero input)
  # stays out of the ptq/ means (the committed report's runs included it).
  _, quant_state = parts.init(jax.random.PRNGKey(0))
  loss_fn = jax.jit(lambda p, s, b: parts.loss_fn(p, s, b, jax.random.PRNGKey(0)))
  sums: dict[str, list[float]] = {}
  for batch in batches:
    loss, aux = loss_fn(params, quant_state, batch)
    sums.setdefault("loss", []).append(float(loss))
    sums.setdefault("accuracy", []).append(float(aux["accuracy"]))
    for tag, value in aux.items():
      parts_of_tag = tag.split("/")
      if parts_of_tag[0] == "numerics" and parts_of_tag[-1] in _TELEMETRY \
          and parts_of_tag[-2] in _SIDES:
        name = f"ptq/{_TELEMETRY[parts_of_tag[-1]]}_{_SIDES[parts_of_tag[-2]]}"
        sums.setdefault(name, []).append(float(value))
  return {name: float(np.mean(values)) for name, values in sums.items()}


def train_and_evaluate(config: ScaleRulesConfig, options: RunOptions) -> dict[str, Any]:
  """One (seed, arm) evaluation: metrics as scalars at step 1 and one results row.
  Nothing is checkpointed (a run is seconds once its base is cached)."""
  options = resolve_run_options(options, EXPERIMENT, config)
  with run_lib.open_run(EXPERIMENT, config, options, checkpoints=False) as run:
    splits = shakespeare.load_splits(config.tokenization, config.validation_fraction,
                                     config.max_chars)
    params, info = base_params(config, splits)
    run.record({"base": info})
    batches = shakespeare.eval_batches(splits.validation, num_batches=config.eval_batches,
                                       batch_size=config.batch_size,
                                       seq_len=config.seq_len)
    vocab = splits.vocab.size
    base_loss = evaluate(config.base_config(), params, batches, vocab)["loss"]
    quantized = evaluate(config, params, batches, vocab)
    metrics = {"eval/loss": quantized.pop("loss"),
               "eval/accuracy": quantized.pop("accuracy"), "base/eval_loss": base_loss,
               "base/train_s": info["train_s"], **quantized}
    metrics["ptq/loss_increase"] = metrics["eval/loss"] - base_loss
    return run.finish_evaluation(
        metrics, num_params=sum(x.size for x in jax.tree.leaves(params)))
