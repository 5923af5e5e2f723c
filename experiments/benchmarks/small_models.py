"""Small models a user brings: step and compile time per recipe, as ratios to bf16.

    python -m experiments.benchmarks.small_models                      # ViT and LM, 64 tokens, d 64
    python -m experiments.benchmarks.small_models --models=vit --tokens=16,64,256 \\
        --widths=64,512 --recipes=bf16,mxfp8,mxfp4,nvfp4 --repeats=20

Two model families written from stock Flax linen layers, as a user would write them
without this library in mind (nothing here is injected by hand):

* ``vit``: a small ViT: a 4x4-patch ``nn.Conv`` stem, ``depth`` pre-LayerNorm blocks of
  ``nn.MultiHeadDotProductAttention`` and a GELU MLP of two ``nn.Dense`` (4x wide), a
  mean-pooled ``nn.Dense`` head; images of ``4 sqrt(tokens)`` pixels square.
* ``lm``: a small decoder LM: ``nn.Embed`` with learned positions, ``depth`` causal
  pre-LayerNorm blocks as above, an ``lm_head`` ``nn.Dense``.

Each is quantized by ``models.quantize_model(model,
quantization.projections_only(recipe))`` (the conv, the q/k/v/out projections and the
MLP in the recipe; the attention products and the head in bf16) and trained by one
jitted Adam step. For every (model, tokens, width) the script reports, per recipe,

* the compile time (``jit(...).trace(...).lower().compile()``, each arm traced afresh
  in this process) divided by bf16's, over ``--compile_rounds`` interleaved rounds, and
* the step time divided by bf16's: the arms are called in turn, ``--repeats`` rounds
  after a warm-up, and each round's ratio is taken, so machine load cancels to first
  order; reported as the median and [min, max] of the per-round ratios (wall clock),
  and the ratio of the medians of process CPU time (``time.process_time``, steadier
  on a loaded machine); the compile's CPU-time ratio likewise.

With qwix installed (``pip install --no-deps qwix==0.1.8``; never a dependency of the
library) ``--qwix=mxfp8,nvfp4`` adds qwix's quantized training (``QtProvider``, the
same formats for weights, activations and gradients) on the same model with the same
coverage (the attention products and the head unquantized); without qwix those arms
are skipped with a note.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, Callable

from absl import app
from absl import flags
from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.common.harness.config_flags import parse_flags
from lowprec import models
from lowprec.models import quantization


def define_flags() -> None:
  """Defines this script's flags (only when run as a script)."""
  flags.DEFINE_list("models", ["vit", "lm"], "model families: vit, lm")
  flags.DEFINE_list("tokens", ["64"], "tokens per example (a square for vit)")
  flags.DEFINE_list("widths", ["64"], "model widths")
  flags.DEFINE_integer("depth", 2, "transformer blocks")
  flags.DEFINE_integer("heads", 2, "attention heads")
  flags.DEFINE_integer("batch", 8, "examples per step")
  flags.DEFINE_list("recipes", ["bf16", "mxfp8", "mxfp4", "nvfp4"],
                    "recipes (numerics.recipes names); bf16 is the baseline")
  flags.DEFINE_list("qwix", ["mxfp8", "nvfp4"],
                    "qwix qtypes to time on the same model (skipped without qwix)")
  flags.DEFINE_integer("repeats", 20, "interleaved rounds of timed steps")
  flags.DEFINE_integer("compile_rounds", 3,
                       "interleaved rounds of compiling every arm afresh")
  flags.DEFINE_string("json", None, "also write the results to this JSON file")


_HEAD_NAMES = ("head", "lm_head")


class _Block(nn.Module):
  width: int
  heads: int
  causal: bool

  @nn.compact
  def __call__(self, x):
    h = nn.LayerNorm(name="ln_attn")(x)
    mask = nn.make_causal_mask(x[..., 0]) if self.causal else None
    x = x + nn.MultiHeadDotProductAttention(self.heads, name="attn")(h, h, mask=mask)
    h = nn.LayerNorm(name="ln_mlp")(x)
    h = nn.gelu(nn.Dense(4 * self.width, name="mlp_up")(h))
    return x + nn.Dense(self.width, name="mlp_down")(h)


class ViT(nn.Module):
  """A small ViT: 4x4 patches, ``depth`` blocks, mean pooling, a 10-way head."""

  width: int
  depth: int
  heads: int

  @nn.compact
  def __call__(self, img_BxHxWxC):
    x = nn.Conv(self.width, (4, 4), strides=(4, 4), name="patch")(img_BxHxWxC)
    x = x.reshape(x.shape[0], -1, self.width)
    x = x + self.param("pos", nn.initializers.normal(0.02), x.shape[1:])
    for i in range(self.depth):
      x = _Block(self.width, self.heads, causal=False, name=f"block_{i}")(x)
    return nn.Dense(10, name="head")(nn.LayerNorm(name="ln_out")(x).mean(axis=1))


class DecoderLM(nn.Module):
  """A small causal decoder over a 256-token vocabulary."""

  width: int
  depth: int
  heads: int
  max_len: int

  @nn.compact
  def __call__(self, tokens_BxT):
    x = nn.Embed(256, self.width, name="embed")(tokens_BxT)
    x = x + self.param("pos", nn.initializers.normal(0.02),
                       (self.max_len, self.width))[:tokens_BxT.shape[1]]
    for i in range(self.depth):
      x = _Block(self.width, self.heads, causal=True, name=f"block_{i}")(x)
    return nn.Dense(256, name="lm_head")(nn.LayerNorm(name="ln_out")(x))


def make_model(family: str, tokens: int, width: int, *, depth: int = 2, heads: int = 2,
               batch: int = 8) -> tuple[nn.Module, jax.Array, jax.Array]:
  """(model, inputs, integer targets) of one configuration.

  ``vit``: float32 images ``(batch, 4 sqrt(tokens), 4 sqrt(tokens), 3)`` and int32
  labels ``(batch,)`` in [0, 10); ``lm``: int32 tokens ``(batch, tokens)`` and their
  next tokens, in [0, 256).
  """
  k_x, k_y = jax.random.split(jax.random.key(0))
  b = batch
  if family == "vit":
    side = math.isqrt(tokens)
    if side * side != tokens:
      raise ValueError(f"vit needs a square token count, got {tokens}")
    x = jax.random.normal(k_x, (b, 4 * side, 4 * side, 3))
    y = jax.random.randint(k_y, (b,), 0, 10)
    return ViT(width, depth, heads), x, y
  if family == "lm":
    seq = jax.random.randint(k_x, (b, tokens + 1), 0, 256)
    return (DecoderLM(width, depth, heads, tokens), seq[:, :-1],
            seq[:, 1:])
  raise ValueError(f"unknown model family {family!r}; known: vit, lm")


def ours(model: nn.Module, recipe: str) -> nn.Module:
  """``model`` with its projections (conv, attention q/k/v/out, MLP) in ``recipe``."""
  return models.quantize_model(model, quantization.projections_only(recipe))


def qwix_model(model: nn.Module, qtype: str) -> nn.Module | None:
  """``model`` under qwix's quantized training in ``qtype`` (None without qwix)."""
  try:
    import qwix  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  head = "|".join(_HEAD_NAMES)
  tile = 16 if qtype == "nvfp4" else 32  # qwix's block formats need their tile
  rules = [
      qwix.QtRule(module_path=f"(.*/)?({head})"),  # no qtype: runs as written
      qwix.QtRule(module_path=".*", op_names=("einsum",)),  # attention products
      # qwix 0.1.8 raises "subchannel is not supported for conv_general_dilated":
      # its arm leaves the patch convolution (one small GEMM) in bf16.
      qwix.QtRule(module_path=".*", op_names=("conv_general_dilated",)),
      # Both gradients tiled: qwix 0.1.8 tiles only the weight gradient's operands by
      # default, and its block formats raise without a tile.
      qwix.QtRule(module_path=".*", weight_qtype=qtype, act_qtype=qtype,
                  bwd_qtype=qtype, tile_size=tile, bwd_weight_grad_tile_size=tile,
                  additional_qt_config=dict(dlhs_tile_size=tile, drhs_tile_size=tile)),
  ]
  return qwix.quantize_model(model, qwix.QtProvider(rules))


def train_step(model: nn.Module, x: jax.Array, y: jax.Array
               ) -> tuple[Callable[[], Any], Callable[[], tuple[float, float]],
                          Callable[[], Any]]:
  """(a no-argument call of the compiled Adam step, a function that traces, lowers and
  compiles the step afresh and returns (wall seconds, process CPU seconds), a function
  returning the last compiled executable).

  Each compile wraps a new Python function, so no trace or executable is reused from
  an earlier compile (jit caches both per function object).
  """
  rngs = {"params": jax.random.key(1), "quant": jax.random.key(2),
          "stochastic_rounding": jax.random.key(3)}
  variables = model.init(rngs, x)
  opt = optax.adam(1e-3)

  def make_step():
    def step(params, opt_state, x, y, key):  # data as arguments: no constant folding
      def loss(p):
        k_q, k_sr = jax.random.split(key)
        logits = model.apply({**variables, "params": p}, x,
                             rngs={"quant": k_q, "stochastic_rounding": k_sr})
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
      l, g = jax.value_and_grad(loss)(params)
      updates, opt_state = opt.update(g, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, l
    return step

  params = variables["params"]
  args = (params, opt.init(params), x, y, jax.random.key(4))

  def compile_seconds():
    c0, t0 = time.process_time(), time.perf_counter()
    compiled = jax.jit(make_step()).trace(*args).lower().compile()
    seconds = (time.perf_counter() - t0, time.process_time() - c0)
    holder[0] = compiled
    return seconds

  holder = [None]
  return (lambda: holder[0](*args)), compile_seconds, (lambda: holder[0])


def time_arms(calls: dict[str, Callable[[], Any]], repeats: int
              ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """(wall seconds, process CPU seconds) of each call per round, calling the arms in
  turn each round after a warm-up call of each."""
  for f in calls.values():
    jax.block_until_ready(f())
  wall = {n: np.zeros(repeats) for n in calls}
  cpu = {n: np.zeros(repeats) for n in calls}
  for i in range(repeats):
    for n, f in calls.items():
      c0, t0 = time.process_time(), time.perf_counter()
      jax.block_until_ready(f())
      wall[n][i] = time.perf_counter() - t0
      cpu[n][i] = time.process_time() - c0
  return {n: (wall[n], cpu[n]) for n in calls}


def run_config(family: str, tokens: int, width: int, recipes: list[str],
               qwix_types: list[str], repeats: int, *, depth: int = 2, heads: int = 2,
               batch: int = 8, compile_rounds: int = 3) -> list[dict]:
  """One row per arm: compile and step times and their ratios to the bf16 arm.

  Every arm is compiled ``compile_rounds`` times, the arms in turn each round (each
  compile traces the step afresh), and its steps timed over ``repeats`` interleaved
  rounds; ratios are taken per round and reported as median, min and max.
  """
  model, x, y = make_model(family, tokens, width, depth=depth, heads=heads, batch=batch)
  arms: dict[str, nn.Module] = {r: ours(model, r) for r in recipes}
  for qt in qwix_types:
    qm = qwix_model(model, qt)
    if qm is None:
      print(f"  (qwix not installed: arm qwix:{qt} skipped)")
      continue
    arms[f"qwix:{qt}"] = qm
  steps = {name: train_step(m, x, y) for name, m in arms.items()}
  compile_s = {name: np.zeros(compile_rounds) for name in arms}
  compile_cpu = {name: np.zeros(compile_rounds) for name in arms}
  for i in range(compile_rounds):
    for name, (_, compile_seconds, _) in list(steps.items()):
      try:
        compile_s[name][i], compile_cpu[name][i] = compile_seconds()
      except ValueError as e:  # qwix's block formats reject some shapes
        if not name.startswith("qwix:"):
          raise
        print(f"  (arm {name} skipped: {e})")
        del steps[name], compile_s[name], compile_cpu[name]
  times = time_arms({name: call for name, (call, _, _) in steps.items()}, repeats)
  base = "bf16" if "bf16" in times else next(iter(times))
  wall_b, cpu_b = times[base]
  rows = []
  for name, (wall, cpu) in times.items():
    ratio = wall / wall_b
    c_ratio = compile_s[name] / compile_s[base]
    rows.append(dict(
        model=family, tokens=tokens, width=width, arm=name,
        compile_s=float(np.median(compile_s[name])),
        compile_ratio=float(np.median(c_ratio)), compile_ratio_min=float(c_ratio.min()),
        compile_ratio_max=float(c_ratio.max()),
        compile_cpu_ratio=float(np.median(compile_cpu[name] / compile_cpu[base])),
        step_ms_median=float(np.median(wall)) * 1e3,
        step_ratio_median=float(np.median(ratio)), step_ratio_min=float(ratio.min()),
        step_ratio_max=float(ratio.max()),
        cpu_ratio=float(np.median(cpu) / np.median(cpu_b))))
  return rows


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  fl = flags.FLAGS
  print(f"{jax.devices()[0].platform}; batch {fl.batch}, depth {fl.depth}, "
        f"{fl.heads} heads; {fl.compile_rounds} compile rounds, {fl.repeats} "
        f"interleaved step rounds; ratios to bf16, median [min, max] over rounds")
  print(f"{'model':5s} {'tok':>4s} {'d':>4s} {'arm':13s} {'compile s':>9s} "
        f"{'compile/bf16 [min, max]':>24s} {'step ms':>8s} "
        f"{'step/bf16 [min, max]':>22s} {'cpu/bf16':>8s} {'compile cpu/bf16':>16s}")
  rows = []
  for family in fl.models:
    for tokens in (int(t) for t in fl.tokens):
      for width in (int(w) for w in fl.widths):
        for r in run_config(family, tokens, width, list(fl.recipes), list(fl.qwix),
                            fl.repeats, depth=fl.depth, heads=fl.heads,
                            batch=fl.batch, compile_rounds=fl.compile_rounds):
          rows.append(r)
          print(f"{r['model']:5s} {r['tokens']:4d} {r['width']:4d} {r['arm']:13s} "
                f"{r['compile_s']:9.2f} {r['compile_ratio']:10.2f} "
                f"[{r['compile_ratio_min']:5.2f}, {r['compile_ratio_max']:5.2f}] "
                f"{r['step_ms_median']:8.2f} {r['step_ratio_median']:8.2f} "
                f"[{r['step_ratio_min']:.2f}, {r['step_ratio_max']:.2f}] "
                f"{r['cpu_ratio']:8.2f} {r['compile_cpu_ratio']:16.2f}", flush=True)
  if fl.json:
    with open(fl.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=parse_flags)
