"""Training-step overhead of fake quantization, as ratios to the bf16 step in one run.

    python -m experiments.bench_qtrain                    # d_model 256, 4 layers, 8x256
    python -m experiments.bench_qtrain --recipes=bf16,mxfp8,mxfp4,nvfp4 --repeats=10

Times one jitted train step (forward, backward through the recipe's three GEMMs,
Adam update) of the decoder LM in models/transformer.py for each recipe (the recipe
quantizes the linear projections; attention products and the LM head stay bf16, as in
ALTO and Transformer Engine); reports
the minimum over repeats, divided by the bf16 step measured in the same process.
"""

from __future__ import annotations

import time

from absl import app
from absl import flags
import jax
import optax

from experiments.common.harness.config_flags import parse_flags
from experiments.common.trainers import recipe_flag
from lowprec.models import quantization
from lowprec.models import transformer


def lm_train_step(model, opt: optax.GradientTransformation):
  """``step((variables, opt_state), tokens, key) -> ((variables, opt_state), loss)``:
  one optimizer step of the next-token loss of a ``DecoderLM`` on ``tokens``
  int32[B, T + 1] (inputs ``tokens[:, :-1]``, targets ``tokens[:, 1:]``), unjitted (the
  benchmarks and compile checks jit it with their own shardings).

  ``variables`` is what ``model.init`` returns (:func:`lm_train_state`): the optimizer
  updates ``variables["params"]``; a delayed-scaling recipe's amax histories (the
  ``quantization.OVERWRITE`` collection) are replaced by their gradient, which is
  their next value (``models.quantization``), not updated by the optimizer."""

  def step(state, tokens, key):
    variables, opt_state = state

    def loss_fn(v):
      logits = model.apply(v, tokens[:, :-1], key)
      return transformer.next_token_loss(logits, tokens[:, 1:])[0]

    loss, grads = jax.value_and_grad(loss_fn)(variables)
    updates, opt_state = opt.update(grads["params"], opt_state, variables["params"])
    new = dict(variables, params=optax.apply_updates(variables["params"], updates))
    if quantization.OVERWRITE in variables:
      new[quantization.OVERWRITE] = grads[quantization.OVERWRITE]
    return (new, opt_state), loss

  return step


def lm_train_state(model, opt: optax.GradientTransformation, tokens: jax.Array,
                   key: jax.Array):
  """``(variables, opt_state)`` at step 0 for :func:`lm_train_step` (``tokens``: the
  int32[B, T] inputs; only their shape matters)."""
  k_init, k_apply = jax.random.split(key)
  variables = model.init(k_init, tokens, k_apply)
  return variables, opt.init(variables["params"])


def step_time(recipe: str, repeats: int) -> float:
  """Seconds per jitted train step (minimum over ``repeats``) under ``recipe``."""
  cfg = transformer.TransformerConfig(vocab_size=256, d_model=flags.FLAGS.d_model,
                                      num_layers=flags.FLAGS.layers, num_heads=4,
                                      d_ff=4 * flags.FLAGS.d_model, max_len=flags.FLAGS.seq)
  model = recipe_flag.quantized_model(transformer.DecoderLM(cfg), recipe)
  tokens = jax.random.randint(jax.random.key(0), (flags.FLAGS.batch, flags.FLAGS.seq + 1), 0, 256)
  opt = optax.adam(1e-3)
  state = lm_train_state(model, opt, tokens[:, :-1], jax.random.key(1))

  train_step = jax.jit(lm_train_step(model, opt))

  key = jax.random.key(3)
  state, loss = train_step(state, tokens, key)
  jax.block_until_ready(loss)
  best = float("inf")
  for i in range(repeats):
    t0 = time.perf_counter()
    state, loss = train_step(state, tokens, jax.random.fold_in(key, i))
    jax.block_until_ready(loss)
    best = min(best, time.perf_counter() - t0)
  return best


def define_flags() -> None:
  """Defines this script's flags; called only when it runs as a script, so that
  importing the module (a test, another script) defines no flag names."""
  flags.DEFINE_list("recipes", ["bf16", "mxfp8", "mxfp4"], "recipes to time")
  flags.DEFINE_integer("d_model", 256, "model width")
  flags.DEFINE_integer("layers", 4, "transformer blocks")
  flags.DEFINE_integer("batch", 8, "sequences per step")
  flags.DEFINE_integer("seq", 256, "tokens per sequence")
  flags.DEFINE_integer("repeats", 5, "timed steps per recipe (min is kept)")


def main(argv):
  del argv
  times = {r: step_time(r, flags.FLAGS.repeats) for r in flags.FLAGS.recipes}
  base = times.get("bf16") or next(iter(times.values()))
  print(f"d_model {flags.FLAGS.d_model}, {flags.FLAGS.layers} layers, batch {flags.FLAGS.batch} x "
        f"{flags.FLAGS.seq} tokens, {jax.devices()[0].platform}")
  print(f"{'recipe':12s} {'step ms':>9s} {'/ bf16':>8s}")
  for r, t in times.items():
    print(f"{r:12s} {t * 1e3:9.1f} {t / base:8.2f}")


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=parse_flags)
