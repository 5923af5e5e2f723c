"""The decoder-LM trainer on Shakespeare that several experiments share (harness).

:class:`LMConfig` holds an LM run's fields and the hooks a derived config overrides
(``transformer_config``, ``model_recipe``, ``model_rules``, ``optimizer``,
``optimizer_metrics``); :func:`train_and_evaluate` trains and evaluates one run of any
such config under :func:`experiments.common.harness.run.open_run`. ``experiments.lm`` runs it
as it is; ``experiments.alto`` (an MoE model and ALTO's recipe options),
``experiments.optimizer_state`` (quantized AdamW moments on ALTO's model) and
``experiments.qlora`` (its optimizer schedule) build on it, so no paper imports the
``lm`` paper.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from experiments.common.data import shakespeare
from experiments.common.evidence.results import loop_metrics, run_summary
from experiments.common.harness import distributed
from experiments.common.harness import run as run_lib
from experiments.common.harness.checkpoint import Snapshot
from experiments.common.harness.config_flags import (SEED_DOMAIN, ConfigError, check_fields,
                                                     config_field)
from experiments.common.harness.run_options import RunOptions, resolve_run_options
from experiments.common.harness.train_loop import (TrainState, init_train_state, make_train_step,
                                                   periodic_field, run_loop)
from experiments.common.trainers import recipe_flag
from experiments.common.trainers.weight_inspection import make_inspector
from lowprec.models import quantization
from lowprec.models.transformer import DecoderLM, TransformerConfig, next_token_loss
from lowprec.numerics import tree_paths
from lowprec.numerics import recipes as recipes_lib

@dataclasses.dataclass(frozen=True)
class LMConfig:
  """Everything that defines an LM run's result (its flags; written to config.json)."""

  recipe: str = config_field(
      "bf16", "Numerics recipe of the linear projections (attention products and the LM "
      "head stay bf16, as in ALTO): any of numerics.recipes.names().",
      choices=recipe_flag.available_recipes())
  seed: int = config_field(0, "Seed of parameter init, data order and per-step keys.",
                           domain=SEED_DOMAIN)
  tokenization: str = config_field("char", "Token level.", choices=shakespeare.TOKENIZATIONS)
  max_chars: int = config_field(0, "Use only the first N characters of the corpus (0: all).",
                                domain="[0, inf)")
  validation_fraction: float = config_field(0.1, "Last fraction of the text held out.",
                                            domain="(0, 1)")
  seq_len: int = config_field(128, "Tokens per training window.", domain="[1, inf)")
  batch_size: int = config_field(32, "Global batch size (split over the data mesh).",
                                 domain="[1, inf)")
  d_model: int = config_field(128, "Model width.", domain="[1, inf)")
  num_layers: int = config_field(2, "Transformer blocks.", domain="[1, inf)")
  num_heads: int = config_field(4, "Attention heads.", domain="[1, inf)")
  d_ff: int = config_field(512, "Feed-forward hidden width.", domain="[1, inf)")
  num_steps: int = config_field(1000, "Training steps.", domain="[1, inf)")
  learning_rate: float = config_field(3e-3, "Peak AdamW learning rate.", domain="(0, inf)")
  warmup_steps: int = config_field(
      -1, "Linear warmup steps, then cosine decay to 10% (-1: a tenth of num_steps).",
      domain="[-1, inf)")
  weight_decay: float = config_field(0.1, "AdamW decoupled weight decay.", domain="[0, inf)")
  beta2: float = config_field(0.95, "AdamW second-moment decay.", domain="[0, 1)")
  grad_clip: float = config_field(1.0, "Clip the global gradient norm to this (0: off).",
                                  domain="[0, inf)")
  eval_every: int = periodic_field("eval_every", 200)
  eval_batches: int = config_field(8, "Validation batches per evaluation (fixed windows).",
                                   domain="[1, inf)")
  log_every: int = periodic_field("log_every", 25)
  checkpoint_every: int = periodic_field("checkpoint_every", 300)
  histogram_every: int = periodic_field("histogram_every", 300)
  progress_every_s: float = periodic_field("progress_every_s", 10.0)
  numerics_telemetry: bool = config_field(
      False, "Log each quantized GEMM operand's saturated / flushed / scale-clamped "
      "fractions and SQNR under numerics/<layer>/... (costs extra passes).")
  native_gemm: bool = config_field(
      False, "Run the recipe's GEMMs on their operands' storage types where the program "
      "runs on a CUDA GPU (numerics.recipes.with_native_gemm: fp8, fp8_delayed, mxfp8, "
      "nvfp4); elsewhere the emulated GEMMs, with the same bits.")

  def __post_init__(self):
    check_fields(self)  # every field in its declared domain
    for name in ("seq_len", "batch_size", "num_steps", "eval_batches"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
    if self.d_model % self.num_heads:
      raise ValueError(f"d_model={self.d_model} is not divisible by num_heads="
                       f"{self.num_heads}; choose a d_model that is a multiple of it")
    if self.warmup_steps >= self.num_steps:
      raise ValueError(f"warmup_steps must be below num_steps ({self.num_steps}), got "
                       f"{self.warmup_steps}")
    if self.native_gemm:
      try:
        recipes_lib.with_native_gemm(self.model_recipe())
      except ValueError as e:
        raise ValueError(f"--native_gemm: {e}") from None

  def warmup(self) -> int:
    """The warmup steps: ``warmup_steps``, or a tenth of ``num_steps`` when it is -1."""
    return self.num_steps // 10 if self.warmup_steps == -1 else self.warmup_steps

  # Hooks a derived experiment (experiments.alto) overrides; the trainer calls only these.
  def transformer_config(self, vocab_size: int) -> TransformerConfig:
    """The model's architecture for a vocabulary of ``vocab_size``."""
    return TransformerConfig(vocab_size=vocab_size, d_model=self.d_model,
                             num_layers=self.num_layers, num_heads=self.num_heads,
                             d_ff=self.d_ff, max_len=self.seq_len)

  def model_recipe(self) -> Any:
    """The recipe of the projections (a name or a numerics.recipes.Recipe); the
    trainer resolves it once, and the Recipe object travels from there."""
    return self.recipe

  def model_rules(self, recipe: recipes_lib.Recipe) -> tuple[quantization.Rule, ...]:
    """Which module runs which recipe (first match wins): the experiments' convention,
    :func:`experiments.common.trainers.recipe_flag.model_rules`; a study that keeps some layers
    in high precision prepends its rules."""
    return recipe_flag.model_rules(recipe)

  def optimizer(self) -> optax.GradientTransformation:
    """The optimizer (see :func:`make_optimizer`)."""
    return make_optimizer(self)

  def optimizer_metrics(self, opt_state: Any) -> dict[str, jax.Array]:
    """Scalars read from the optimizer state after every step (none here)."""
    del opt_state
    return {}

  def curve_metrics(self, workdir: str) -> dict[str, float]:
    """Final metrics computed from the run's logged curves (its TensorBoard events in
    ``workdir``, flushed, a resumed run's earlier events included), added to its
    results row (none here)."""
    del workdir
    return {}


def make_optimizer(config: LMConfig, adamw: Callable[..., optax.GradientTransformation]
                   = optax.adamw) -> optax.GradientTransformation:
  """AdamW with linear warmup + cosine decay, optionally after global-norm clipping.

  ``adamw(schedule, b2=..., weight_decay=...)`` builds the AdamW (``optax.adamw``, or
  a drop-in such as :func:`numerics.optim.quantized_adam.quantized_adamw` with its
  state format bound).
  """
  return scheduled_adamw(config.learning_rate, config.num_steps, config.warmup(),
                         config.weight_decay, config.beta2, config.grad_clip, adamw)


def scheduled_adamw(learning_rate: float, num_steps: int, warmup_steps: int,
                    weight_decay: float, beta2: float, grad_clip: float,
                    adamw: Callable[..., optax.GradientTransformation] = optax.adamw
                    ) -> optax.GradientTransformation:
  """:func:`make_optimizer` from its values: linear warmup over ``max(warmup_steps, 1)``
  steps, cosine decay to 10% at ``num_steps``, global-norm clipping at ``grad_clip``
  (0: none) before the AdamW that ``adamw`` builds."""
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, learning_rate, max(warmup_steps, 1), num_steps, end_value=0.1 * learning_rate)
  adam = adamw(schedule, b2=beta2, weight_decay=weight_decay)
  return optax.chain(optax.clip_by_global_norm(grad_clip), adam) if grad_clip > 0 else adam


def hparams_of(config: LMConfig) -> dict[str, Any]:
  """The config as TensorBoard HParams (every field: the HParams table compares arms)."""
  return dataclasses.asdict(config)


def _sown_scalars(variables: dict[str, Any], collection: str) -> dict[str, jax.Array]:
  """``{name: mean over layers}`` of what the model sowed into ``collection``."""
  grouped: dict[str, list[jax.Array]] = {}
  for path, value in jax.tree_util.tree_flatten_with_path(variables.get(collection, {}))[0]:
    name = tree_paths.key_name(path[-2])  # sown values are tuples: (..., name, 0)
    grouped.setdefault(name, []).append(jnp.asarray(value, jnp.float32))
  return {name: jnp.mean(jnp.stack(values)) for name, values in grouped.items()}


class LMParts(NamedTuple):
  """What an LM run trains: the recipe its ``--recipe`` names, the quantized model,
  ``init(key) -> (params, quant_state)`` (the quantization state: ``{OVERWRITE: ...}``
  for delayed scaling and backward telemetry, else ``{}``), ``apply(params, quant_state,
  inputs, key) -> (logits, sown)`` and ``loss_fn(params, quant_state, batch, key) ->
  (loss, aux)`` (a :data:`experiments.common.harness.train_loop.LossFn`)."""

  recipe: recipes_lib.Recipe
  model: Any
  init: Callable[[jax.Array], tuple[Any, Any]]
  apply: Callable[..., Any]
  loss_fn: Callable[..., Any]


def build_lm(config: LMConfig, vocab_size: int) -> LMParts:
  """The model and loss of an LM run of ``config`` over ``vocab_size`` tokens
  (:class:`LMParts`). Losses the model sows (the MoE balance loss) are added to the
  next-token loss, summed over layers; ``aux`` holds the accuracy, each sown loss and
  metric (mean over layers) and the numerics telemetry."""
  recipe = recipes_lib.get(config.model_recipe())
  if config.native_gemm:
    recipe = recipes_lib.with_native_gemm(recipe)
  model = quantization.quantize_model(
      DecoderLM(config.transformer_config(vocab_size)),
      config.model_rules(recipe), telemetry=config.numerics_telemetry)
  telemetry = [quantization.NUMERICS] if config.numerics_telemetry else []

  def init(key):
    variables = model.init(key, jnp.zeros((1, config.seq_len), jnp.int32),
                           jax.random.PRNGKey(0))
    # The quantization state: the one collection besides params a train step carries.
    return variables["params"], {k: v for k, v in variables.items()
                                 if k == quantization.OVERWRITE}

  def apply(params, quant_state, inputs, key):
    return model.apply({"params": params, **quant_state}, inputs, key,
                       mutable=["losses", "metrics"] + telemetry)

  def loss_fn(params, quant_state, batch, key):
    logits, sown = apply(params, quant_state, batch["inputs"], key)
    loss, accuracy = next_token_loss(logits, batch["targets"])
    sown_losses = jax.tree.leaves(sown.get("losses", {}))
    aux = {"accuracy": accuracy}
    if sown_losses:
      aux["next_token_loss"] = loss
    aux.update({f"sown/{k}": v for k, v in _sown_scalars(sown, "losses").items()})
    aux.update({f"sown/{k}": v for k, v in _sown_scalars(sown, "metrics").items()})
    aux.update(quantization.telemetry_scalars(sown.get(quantization.NUMERICS)))
    return loss + sum(jnp.sum(l) for l in sown_losses), aux

  return LMParts(recipe, model, init, apply, loss_fn)


def _check_windows_fit(config: LMConfig, splits: shakespeare.Splits) -> None:
  """Refuses a ``seq_len`` longer than a split (what ``max_chars`` and
  ``validation_fraction`` leave), naming the values, before anything is built."""
  shortest = min(splits.train.size, splits.validation.size)
  if shortest < config.seq_len + 1:
    raise ConfigError(
        f"seq_len={config.seq_len} needs {config.seq_len + 1} tokens per split, but "
        f"max_chars={config.max_chars} and validation_fraction="
        f"{config.validation_fraction} leave {splits.train.size} training and "
        f"{splits.validation.size} validation tokens; lower --seq_len or raise "
        "--max_chars (0: the whole corpus)")


def _fresh_start(config: LMConfig, init_model: Callable[[jax.Array], tuple[Any, Any]],
                 optimizer: optax.GradientTransformation, replicated: Any
                 ) -> Callable[[], Snapshot]:
  """``() -> Snapshot`` at step 0: the model initialized from ``config.seed`` (params and
  quantization state, :attr:`LMParts.init`), the optimizer state, the loop key."""

  @functools.partial(jax.jit, out_shardings=replicated)
  def init(key):
    init_key, loop_key = jax.random.split(key)
    params, quant_state = init_model(init_key)
    return init_train_state(params, optimizer, quant_state), loop_key

  def fresh() -> Snapshot:
    state, rng = init(jax.random.PRNGKey(config.seed))
    return Snapshot(state=state, rng=rng, step=0, data_position=0)

  return fresh


def _evaluator(config: LMConfig, apply: Callable[..., Any], validation: np.ndarray,
               mesh: Any) -> Callable[[Any], dict[str, float]]:
  """``params -> {"loss", "accuracy", "bits_per_char"}`` over ``config.eval_batches``
  fixed validation batches, with one fixed key (stochastic-rounding recipes then
  evaluate the same way every time)."""

  @jax.jit
  def eval_step(params, quant_state, batch, key):
    logits, _ = apply(params, quant_state, batch["inputs"], key)
    return next_token_loss(logits, batch["targets"])

  eval_data = [distributed.shard_batch(b, mesh) for b in shakespeare.eval_batches(
      validation, num_batches=config.eval_batches, batch_size=config.batch_size,
      seq_len=config.seq_len)]
  eval_key = jax.random.fold_in(jax.random.PRNGKey(config.seed), 0x5EED)

  def evaluate(state: TrainState) -> dict[str, float]:
    results = jax.device_get([eval_step(state.params, state.quant_state, b, eval_key)
                              for b in eval_data])
    loss = float(np.mean([r[0] for r in results]))
    return {"loss": loss, "accuracy": float(np.mean([r[1] for r in results])),
            "bits_per_char": loss / np.log(2.0)}

  return evaluate


def train_and_evaluate(config: LMConfig, options: RunOptions, experiment: str
                       ) -> dict[str, Any]:
  """Trains and evaluates one LM run; returns its summary (metrics and paths).

  The model, recipe and optimizer come from the config's hooks, so a derived config
  (:class:`experiments.common.trainers.moe_lm.MoELMConfig` and the papers' configs) reuses this
  trainer. Losses the model sows (the MoE balance loss) are added to the training loss,
  summed over layers, and logged per name as ``sown/<name>`` (mean over layers), with
  sown metrics (``moe_dropped``); validation loss is the next-token loss alone.
  Safe to call repeatedly in one process (tests); multi-process setup happens once.
  """
  distributed.initialize(options.coordinator_address, options.num_processes,
                         options.process_id, single_process=options.single_process)
  options = resolve_run_options(options, experiment, config)
  writer_process = distributed.is_writer()
  logging.info("process %d/%d, %d local / %d global devices (%s)", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count(),
               jax.default_backend())

  splits = shakespeare.load_splits(config.tokenization, config.validation_fraction,
                                   config.max_chars)
  _check_windows_fit(config, splits)
  # The one place the --recipe name becomes a Recipe: the rules, the inspector and the
  # quantized GEMMs below receive the object.
  recipe, _, init_model, apply, loss_fn = build_lm(config, splits.vocab.size)
  optimizer = config.optimizer()
  mesh = distributed.data_mesh()
  fresh = _fresh_start(config, init_model, optimizer, distributed.replicated(mesh))
  evaluate = _evaluator(config, apply, splits.validation, mesh)

  def batch_at(position: int):
    return distributed.shard_batch(shakespeare.train_batch(
        splits.train, seed=config.seed, position=position, batch_size=config.batch_size,
        seq_len=config.seq_len), mesh)

  with run_lib.open_run(experiment, config, options, hparams=hparams_of(config),
                        writer_process=writer_process) as run:
    start = run.restore(fresh, metadata={"vocab_size": splits.vocab.size})
    n_params = sum(x.size for x in jax.tree.leaves(start.state.params))
    logging.info("model: %d parameters, vocab %d, recipe %s; train %d / validation %d tokens",
                 n_params, splits.vocab.size, recipe.name, splits.train.size,
                 splits.validation.size)

    settings = run.settings(config.num_steps,
                            every_step_scalars=False,  # log_every means what it says
                            # 3x a uniform predictor's loss: a blow-up, not noise
                            max_healthy_loss=3 * math.log(splits.vocab.size))
    # A delayed-scaling recipe's weight error depends on its state: histograms only.
    inspector = make_inspector(
        recipe_flag.recipe_dot_general("fp32" if recipe.delayed_operands else recipe),
        skip_prefixes=("",) if recipe.delayed_operands else ("head",),
        skip_names=("router",))
    train_step = make_train_step(
        loss_fn, optimizer, config.optimizer_metrics,
        quant_metrics=lambda s: quantization.telemetry_scalars(
            overwrite=s.get(quantization.OVERWRITE)))
    result = run_loop(start=start, train_step=train_step, batch_at=batch_at,
                      settings=settings, writer=run.writer,
                      checkpointer=run.checkpointer, evaluate=evaluate,
                      inspect=lambda state: inspector(state.params))
    run.writer.flush()
    metrics = {**loop_metrics(result), **config.curve_metrics(options.workdir)}
    summary = run_summary(experiment, options, config, result, start_time=run.t0,
                          metrics=metrics, num_params=n_params,
                          resumed_from_step=start.step, process_count=jax.process_count(),
                          device_count=jax.device_count())
    run.finish(summary, completed=result.completed, step=result.snapshot.step)
  return summary
