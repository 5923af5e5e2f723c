"""QLoRA in miniature: fine-tune a pretrained char LM on a play it never saw.

    python -m experiments.qlora                                  # NF4 base + LoRA
    python -m experiments.qlora --base_format=bf16               # bf16 base + LoRA
    python -m experiments.qlora --method=full --learning_rate=1e-3   # full fine-tuning

The base model is the LM quick start's architecture (:mod:`experiments.lm`: d_model
128, 2 blocks of 4 heads, d_ff 512, 128-token windows, char level, bf16 GEMMs with
float32 accumulation), pretrained once with AdamW on the whole Shakespeare corpus
*except one play* (``holdout_play``, Hamlet by default) and cached under
``pretrain_dir`` by the hash of every field that defines it (:func:`pretrained_base`;
parallel runs wait on a file lock; ``pretrain_seed`` is no evaluation seed). Each run
fine-tunes it on the first ``1 - finetune_eval_fraction`` of the held-out play and
evaluates on the play's last part (fixed windows), so neither stage ever trains on the
evaluation text and the pretraining never sees the play at all.

``method``:

* ``lora``: :mod:`models.lora` adapters (rank ``rank``, ``alpha``) on every linear
  projection of the blocks (q/k/v, attention output, both feed-forward GEMMs; not the
  embeddings or the LM head, as QLoRA), over a frozen base whose target kernels are
  stored as ``base_format``: ``nf4`` (QLoRA: NF4 with absmax blocks of
  ``nf4_block_size`` = 64 along the contraction axis, scales double-quantized to 8
  bits in blocks of 256), ``bf16`` or ``fp32``; the rest of the base (embeddings,
  norms, head) stays float32. ``dequantize`` is ``per_gemm`` (QLoRA's on-the-fly
  dequantization inside each projection, recomputed in the backward pass) or
  ``materialize`` (every kernel dequantized once per step and kept for the step).
  Only the adapters are trained (and stored by the optimizer).
* ``full``: every parameter trained, float32 master weights, the same bf16 GEMMs.

The same seed gives every method the same data order; it also draws the adapters'
``A`` matrices. The frozen base is an argument of the jitted step (never a
compile-time constant, so XLA cannot fold its dequantization away).

Per run, besides the loop's ``train/*`` and ``eval/*`` curves (``eval/loss`` at step 0
is the frozen, possibly quantized, base's loss on the play):

* ``finetune/eval_loss_before``, ``finetune/eval_loss_gain`` (before - after);
  ``base/eval_loss``, ``base/pretrain_loss``: the unquantized base's;
* ``mem/trainable_params``, ``mem/trainable_bytes`` (float32), ``mem/optimizer_bytes``
  (AdamW state and clip counters, :func:`numerics.memory.tree_bytes`),
  ``mem/frozen_bytes`` (the stored frozen base: ``tree_bytes`` of the FrozenBase; 0 for
  full fine-tuning), ``mem/target_kernel_bytes`` (the projections' kernels as stored:
  the trained float32 ones for full fine-tuning), ``mem/target_bits_per_weight`` and
  ``mem/weights_and_optimizer_bytes`` (frozen + trainable + optimizer);
* ``speed/steps_per_s`` (noisy when runs share the machine; the in-process ratio is
  :mod:`experiments.qlora.bench_step`'s); ``base/unchanged`` is 1 when the frozen base
  hashes the same after fine-tuning as before.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import math
import os
import re
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from experiments.common.harness import params_cache
from experiments.common.data import shakespeare
from experiments.common.harness.checkpoint import Snapshot
from experiments.common.harness.config_flags import SEED_DOMAIN, check_fields, config_field
from experiments.common.evidence.results import run_summary
from experiments.common.harness import run as run_lib
from experiments.common.harness.run_options import RunOptions, resolve_run_options
from experiments.common.trainers import lm_trainer
from experiments.common.harness.train_loop import (TrainState, init_train_state, make_train_step,
                                                   periodic_field, run_loop, without_quant_state)
from lowprec import models
from lowprec.models import lora
from lowprec.models.transformer import DecoderLM, TransformerConfig, next_token_loss
from lowprec.numerics import memory

EXPERIMENT = "qlora"
METHODS = ("lora", "full")
ARCH_FIELDS = ("seq_len", "batch_size", "d_model", "num_layers", "num_heads", "d_ff")
_TITLE = re.compile(r"\n\n\n+([A-Z][A-Z ,'.\-]+)\n\nby William Shakespeare")


@dataclasses.dataclass(frozen=True)
class QLoRAConfig:
  """Everything that defines a run's result (its flags; written to config.json)."""

  method: str = config_field("lora", "lora: adapters over a frozen base; full: train "
                             "every parameter.", choices=METHODS)
  base_format: str = config_field("nf4", "How the frozen base stores the adapted "
                                  "kernels (lora only).", choices=lora.BASE_FORMATS)
  dequantize: str = config_field("per_gemm", "NF4 dequantization: per_gemm (inside each "
                                 "projection, recomputed in backward) or materialize (once "
                                 "per step).", choices=lora.DEQUANTIZE_MODES)
  nf4_block_size: int = config_field(64, "NF4 absmax block along the contraction axis.",
                                     domain="[2, inf)")
  double_quant: bool = config_field(True, "Double-quantize the NF4 scales (8 bits, blocks "
                                    "of 256).")
  rank: int = config_field(8, "LoRA rank.", domain="[1, inf)")
  alpha: float = config_field(16.0, "LoRA alpha (the adapter output is scaled by "
                              "alpha / rank).", domain="(0, inf)")
  seed: int = config_field(1, "Seed of the adapters' init and the fine-tuning data order.",
                           domain=SEED_DOMAIN)
  holdout_play: str = config_field("HAMLET, PRINCE OF DENMARK", "Title of the play left "
                                   "out of pretraining and fine-tuned on (as in the corpus).")
  finetune_eval_fraction: float = config_field(0.15, "Last fraction of the play held out "
                                               "for evaluation.", domain="(0, 1)")
  seq_len: int = config_field(128, "Tokens per window.", domain="[1, inf)")
  batch_size: int = config_field(32, "Batch size (pretraining and fine-tuning).",
                                 domain="[1, inf)")
  d_model: int = config_field(128, "Model width.", domain="[1, inf)")
  num_layers: int = config_field(2, "Transformer blocks.", domain="[1, inf)")
  num_heads: int = config_field(4, "Attention heads.", domain="[1, inf)")
  d_ff: int = config_field(512, "Feed-forward hidden width.", domain="[1, inf)")
  pretrain_seed: int = config_field(1000, "Seed of the base's init and pretraining data.",
                                    domain=SEED_DOMAIN)
  pretrain_steps: int = config_field(1000, "Pretraining steps of the base.",
                                     domain="[0, inf)")
  pretrain_lr: float = config_field(3e-3, "Pretraining peak AdamW learning rate (100 "
                                    "warmup steps, cosine to 10%, wd 0.1, b2 0.95, clip 1).",
                                    domain="(0, inf)")
  pretrain_dir: str = config_field("runs/qlora/pretrain",
                                   "Cache of pretrained bases (by config hash).")
  num_steps: int = config_field(200, "Fine-tuning steps.", domain="[1, inf)")
  learning_rate: float = config_field(3e-3, "Fine-tuning peak AdamW learning rate.",
                                      domain="(0, inf)")
  warmup_steps: int = config_field(20, "Linear warmup steps, then cosine decay to 10%.",
                                   domain="[0, inf)")
  weight_decay: float = config_field(0.0, "AdamW decoupled weight decay.", domain="[0, inf)")
  beta2: float = config_field(0.999, "AdamW second-moment decay.", domain="[0, 1)")
  grad_clip: float = config_field(1.0, "Clip the global gradient norm (0: off).",
                                  domain="[0, inf)")
  eval_every: int = periodic_field("eval_every", 50)
  eval_batches: int = config_field(8, "Evaluation batches (fixed windows of the play's "
                                   "held-out part).", domain="[1, inf)")
  log_every: int = periodic_field("log_every", 10)
  checkpoint_every: int = periodic_field("checkpoint_every", 0)
  progress_every_s: float = periodic_field("progress_every_s", 20.0)

  def __post_init__(self):
    check_fields(self)
    if self.warmup_steps >= self.num_steps:
      raise ValueError(f"warmup_steps must be < num_steps, got {self.warmup_steps}")
    if self.d_model % self.num_heads:
      raise ValueError(f"d_model={self.d_model} is not divisible by num_heads="
                       f"{self.num_heads}")
    if self.method == "full" and (self.base_format, self.dequantize) != ("nf4", "per_gemm"):
      raise ValueError("base_format and dequantize apply to method='lora' only (leave "
                       "them at their defaults for method='full')")
    self.lora_config()  # validates the NF4 fields

  def lora_config(self) -> lora.LoRAConfig:
    """The :class:`models.lora.LoRAConfig` (raises for NF4 fields set on another
    format)."""
    return lora.LoRAConfig(rank=self.rank, alpha=self.alpha, base_format=self.base_format,
                           nf4_block_size=self.nf4_block_size,
                           double_quant=self.double_quant, dequantize=self.dequantize)

  def model(self, vocab_size: int) -> Any:
    """The quick-start LM with bf16 GEMMs (float32 accumulation) everywhere: one bf16
    rule for every matmul (LoRA's adapter products stay float32, see ``lora.apply``)."""
    return models.quantize_model(
        DecoderLM(TransformerConfig(vocab_size=vocab_size, d_model=self.d_model,
                                    num_layers=self.num_layers, num_heads=self.num_heads,
                                    d_ff=self.d_ff, max_len=self.seq_len)),
        [models.Rule(".*", "bf16")])


# ----------------------------------------------------------------------------- data


@dataclasses.dataclass(frozen=True)
class Corpus:
  """Token arrays (int32, 1-D): ``pretrain`` (the corpus without the play, the parts
  before and after it joined), ``finetune`` and ``evaluation`` (the play, split)."""

  pretrain: np.ndarray
  finetune: np.ndarray
  evaluation: np.ndarray
  vocab: shakespeare.Vocab


def play_spans(text: str) -> dict[str, tuple[int, int]]:
  """``{title: (start, end)}`` of each work of the corpus (title line to the next)."""
  starts = [(m.start(), m.group(1)) for m in _TITLE.finditer(text)]
  first = text.split("\n", 1)[0].strip()  # the first work has no blank lines above it
  starts = [(0, first)] + starts
  return {title: (s, starts[i + 1][0] if i + 1 < len(starts) else len(text))
          for i, (s, title) in enumerate(starts)}


@functools.lru_cache(maxsize=4)
def load_corpus(holdout_play: str, eval_fraction: float) -> Corpus:
  """The corpus split for ``holdout_play`` (char level, the whole corpus's vocabulary)."""
  text = shakespeare.load_text()
  spans = play_spans(text)
  if holdout_play not in spans:
    raise ValueError(f"no play titled {holdout_play!r} in the corpus; titles: "
                     f"{', '.join(spans)}")
  start, end = spans[holdout_play]
  vocab = shakespeare.Vocab("char", "".join(sorted(set(text))))
  play = vocab.encode(text[start:end])
  n_eval = int(len(play) * eval_fraction)
  return Corpus(pretrain=vocab.encode(text[:start] + text[end:]),
                finetune=play[:len(play) - n_eval], evaluation=play[len(play) - n_eval:],
                vocab=vocab)


# ---------------------------------------------------------------------- the base model

_PRETRAIN_FIELDS = ("holdout_play", "finetune_eval_fraction", "seq_len", "batch_size",
                    "d_model", "num_layers", "num_heads", "d_ff", "pretrain_seed",
                    "pretrain_steps", "pretrain_lr", "eval_batches")


def pretrain_digest(config: QLoRAConfig) -> str:
  """The cache key: a hash of every field that defines the pretrained base."""
  return params_cache.digest({k: getattr(config, k) for k in _PRETRAIN_FIELDS})


def _adamw(lr: float, steps: int, warmup: int, weight_decay: float, beta2: float,
           clip: float) -> optax.GradientTransformation:
  # The LM's schedule; at least 2 decay steps so a 1-step smoke run has a schedule.
  return lm_trainer.scheduled_adamw(lr, max(steps, 2), warmup, weight_decay, beta2, clip)


def _eval_data(config: QLoRAConfig, corpus: Corpus) -> list[dict[str, np.ndarray]]:
  return shakespeare.eval_batches(corpus.evaluation, num_batches=config.eval_batches,
                                  batch_size=config.batch_size, seq_len=config.seq_len)


def _init_params(config: QLoRAConfig, model: Any) -> Any:
  key = jax.random.PRNGKey(config.pretrain_seed)
  return jax.jit(model.init)(key, jnp.zeros((1, config.seq_len), jnp.int32), key)["params"]


def _pretrain(config: QLoRAConfig, model: Any, corpus: Corpus
              ) -> tuple[Any, dict[str, float]]:
  params = _init_params(config, model)
  optimizer = _adamw(config.pretrain_lr, config.pretrain_steps, 100 if
                     config.pretrain_steps > 100 else 0, 0.1, 0.95, 1.0)
  key = jax.random.PRNGKey(config.pretrain_seed)

  @jax.jit
  def step(params, opt_state, batch):
    def loss_fn(p):
      return next_token_loss(model.apply({"params": p}, batch["inputs"], key),
                             batch["targets"])[0]
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state = optimizer.init(params)
  t0 = time.perf_counter()
  losses = []
  for i in range(config.pretrain_steps):
    batch = shakespeare.train_batch(corpus.pretrain, seed=config.pretrain_seed,
                                    position=i, batch_size=config.batch_size,
                                    seq_len=config.seq_len)
    params, opt_state, loss = step(params, opt_state, batch)
    losses.append(loss)
    if i % 100 == 0:
      logging.info("pretraining step %d/%d, loss %.4f", i, config.pretrain_steps,
                   float(loss))
  tail = [float(l) for l in jax.device_get(losses[-20:])]
  eval_loss = _full_eval_loss(model, params, _eval_data(config, corpus))
  return params, {"pretrain_loss": float(np.mean(tail)) if tail else math.nan,
                  "eval_loss": eval_loss, "pretrain_s": time.perf_counter() - t0}


def _full_eval_loss(model: Any, params: Any, batches) -> float:
  key = jax.random.PRNGKey(0)
  f = jax.jit(lambda p, b: next_token_loss(model.apply({"params": p}, b["inputs"], key),
                                           b["targets"])[0])
  return float(np.mean([float(f(params, b)) for b in batches]))


def pretrained_base(config: QLoRAConfig, model: Any, corpus: Corpus
                    ) -> tuple[Any, dict[str, Any]]:
  """The pretrained float32 params and their info (``pretrain_loss``: mean of the last
  20 steps; ``eval_loss`` on the play's held-out part; ``pretrain_s``; ``digest``).
  Trained once per digest; a run that finds another one training waits on the lock."""
  digest = pretrain_digest(config)
  os.makedirs(config.pretrain_dir, exist_ok=True)
  path = os.path.join(config.pretrain_dir, f"{digest}.npz")
  like = jax.eval_shape(lambda: _init_params(config, model))
  with open(os.path.join(config.pretrain_dir, f".lock-{digest}"), "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not os.path.exists(path):
      params_cache.save(path, *_pretrain(config, model, corpus))
  params, info = params_cache.load(path, like)
  return params, {**info, "digest": digest}


def tree_digest(tree: Any) -> str:
  """sha1 of every leaf's bytes, dtype and shape (a bit-identity check)."""
  h = hashlib.sha1()
  for leaf in jax.tree.leaves(tree):
    a = np.asarray(leaf)
    h.update(f"{a.dtype}{a.shape}".encode())
    h.update(a.tobytes())
  return h.hexdigest()


# ------------------------------------------------------------------------ fine-tuning


@dataclasses.dataclass(frozen=True)
class FineTuneSetup:
  """What a method trains: the initial trainable params, the loss, the frozen base.

  ``loss_fn(trainable, batch, key) -> (loss, aux)`` with ``batch`` holding ``inputs``
  and ``targets`` int32[B, L] and, for LoRA, ``base`` (the :class:`lora.FrozenBase`, a
  jit argument). ``logits_fn(trainable, base, inputs, key)`` float32[B, L, V].
  """

  trainable: Any
  frozen: Any  # a lora.FrozenBase, or None (full fine-tuning)
  loss_fn: Callable[..., Any]
  logits_fn: Callable[..., Any]


def make_setup(config: QLoRAConfig, model: Any, params: Any) -> FineTuneSetup:
  """The method's trainable params (LoRA adapters from ``seed``, or a copy of every
  pretrained param), frozen base and loss."""
  if config.method == "full":
    logits_fn = lambda p, base, x, k: model.apply({"params": p}, x, k)
    trainable = jax.tree.map(jnp.array, params)
    frozen = None
  else:
    lcfg = config.lora_config()
    frozen = jax.jit(lambda p: lora.freeze_base(p, lcfg))(params)
    trainable = jax.jit(lambda k, b: lora.init_adapters(k, b, lcfg))(
        jax.random.PRNGKey(config.seed), frozen)
    logits_fn = lambda a, base, x, k: lora.apply(model, base, a, x, k, lcfg)

  def loss_fn(trainable, batch, key):
    logits = logits_fn(trainable, batch.get("base"), batch["inputs"], key)
    loss, accuracy = next_token_loss(logits, batch["targets"])
    return loss, {"accuracy": accuracy}

  return FineTuneSetup(trainable, frozen, loss_fn, logits_fn)


def make_optimizer(config: QLoRAConfig) -> optax.GradientTransformation:
  """AdamW (warmup, cosine to 10%), after global-norm clipping."""
  return _adamw(config.learning_rate, config.num_steps, config.warmup_steps,
                config.weight_decay, config.beta2, config.grad_clip)


def memory_metrics(config: QLoRAConfig, setup: FineTuneSetup, opt_state: Any,
                   params: Any) -> dict[str, float]:
  """The ``mem/*`` metrics (bytes as stored; see the module docstring)."""
  trainable = memory.tree_bytes(setup.trainable)
  optimizer = memory.tree_bytes(opt_state)
  if setup.frozen is None:
    frozen = 0
    kernels = lora.freeze_base(params, dataclasses.replace(
        config.lora_config(), base_format="fp32", nf4_block_size=64,
        double_quant=True)).kernels  # the projections' float32 kernels, trained
  else:
    frozen = memory.tree_bytes(setup.frozen)
    kernels = setup.frozen.kernels
  kernel_bytes = memory.tree_bytes(kernels)
  n_kernel = sum(int(np.prod(lora._kernel_shape(k))) for k in kernels.values())  # pylint: disable=protected-access
  return {"mem/trainable_params": float(memory.num_params(setup.trainable)),
          "mem/trainable_bytes": float(trainable), "mem/optimizer_bytes": float(optimizer),
          "mem/frozen_bytes": float(frozen), "mem/target_kernel_bytes": float(kernel_bytes),
          "mem/target_bits_per_weight": 8.0 * kernel_bytes / n_kernel,
          "mem/weights_and_optimizer_bytes": float(frozen + trainable + optimizer)}


def train_and_evaluate(config: QLoRAConfig, options: RunOptions) -> dict[str, Any]:
  """Fine-tunes the (cached) pretrained base one way; returns the run's summary."""
  options = resolve_run_options(options, EXPERIMENT, config)
  corpus = load_corpus(config.holdout_play, config.finetune_eval_fraction)
  model = config.model(corpus.vocab.size)
  with run_lib.open_run(EXPERIMENT, config, options) as run:
    params, base_info = pretrained_base(config, model, corpus)
    setup = make_setup(config, model, params)
    frozen_before = tree_digest(setup.frozen) if setup.frozen is not None else ""
    optimizer = make_optimizer(config)

    def fresh() -> Snapshot:
      state = init_train_state(setup.trainable, optimizer)
      return Snapshot(state=state, rng=jax.random.PRNGKey(config.seed), step=0,
                      data_position=0)

    start = run.restore(fresh, metadata={
        "vocab_size": corpus.vocab.size, "base": base_info,
        "tokens": {"pretrain": int(corpus.pretrain.size),
                   "finetune": int(corpus.finetune.size),
                   "evaluation": int(corpus.evaluation.size)}})
    eval_key = jax.random.PRNGKey(0)
    eval_step = jax.jit(lambda t, base, b: next_token_loss(
        setup.logits_fn(t, base, b["inputs"], eval_key), b["targets"]))
    eval_data = _eval_data(config, corpus)
    evaluations: list[dict[str, float]] = []

    def evaluate(state: TrainState) -> dict[str, float]:
      results = jax.device_get([eval_step(state.params, setup.frozen, b)
                                for b in eval_data])
      loss = float(np.mean([r[0] for r in results]))
      out = {"loss": loss, "accuracy": float(np.mean([r[1] for r in results])),
             "bits_per_char": loss / math.log(2.0)}
      evaluations.append(out)
      return out

    extra = {} if setup.frozen is None else {"base": setup.frozen}

    def batch_at(position: int):
      return {**shakespeare.train_batch(corpus.finetune, seed=config.seed,
                                        position=position, batch_size=config.batch_size,
                                        seq_len=config.seq_len), **extra}

    settings = run.settings(config.num_steps,
                            max_healthy_loss=3 * math.log(corpus.vocab.size))
    t0 = time.time()
    train_step = make_train_step(without_quant_state(setup.loss_fn), optimizer)
    result = run_loop(start=start, train_step=train_step,
                      batch_at=batch_at, settings=settings, writer=run.writer,
                      checkpointer=run.checkpointer, evaluate=evaluate)
    metrics = {**{f"train/{k}": v for k, v in result.train_metrics.items()},
               **{f"eval/{k}": v for k, v in result.eval_metrics.items()}}
    before = evaluations[0]["loss"] if start.step == 0 and evaluations else math.nan
    metrics.update({
        "finetune/eval_loss_before": before,
        "finetune/eval_loss_gain": before - result.eval_metrics.get("loss", math.nan),
        "base/eval_loss": base_info["eval_loss"],
        "base/pretrain_loss": base_info["pretrain_loss"],
        "speed/steps_per_s": result.steps_per_s,
        "base/unchanged": float(setup.frozen is None
                                or tree_digest(setup.frozen) == frozen_before),
        **memory_metrics(config, setup, result.snapshot.state.opt_state, params)})
    summary = run_summary(EXPERIMENT, options, config, result, start_time=t0,
                          num_params=memory.num_params(params), resumed_from_step=start.step,
                          metrics=metrics, base_digest=base_info["digest"],
                          frozen_digest=frozen_before)
    return run.finish(summary, completed=result.completed, step=result.snapshot.step)
