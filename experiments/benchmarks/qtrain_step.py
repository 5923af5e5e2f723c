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

from experiments.common import recipe_flag
from lowprec.models import transformer

_RECIPES = flags.DEFINE_list("recipes", ["bf16", "mxfp8", "mxfp4"], "recipes to time")
_D_MODEL = flags.DEFINE_integer("d_model", 256, "model width")
_LAYERS = flags.DEFINE_integer("layers", 4, "transformer blocks")
_BATCH = flags.DEFINE_integer("batch", 8, "sequences per step")
_SEQ = flags.DEFINE_integer("seq", 256, "tokens per sequence")
_REPEATS = flags.DEFINE_integer("repeats", 5, "timed steps per recipe (min is kept)")


def step_time(recipe: str, repeats: int) -> float:
  """Seconds per jitted train step (minimum over ``repeats``) under ``recipe``."""
  cfg = transformer.TransformerConfig(vocab_size=256, d_model=_D_MODEL.value,
                                      num_layers=_LAYERS.value, num_heads=4,
                                      d_ff=4 * _D_MODEL.value, max_len=_SEQ.value)
  model = recipe_flag.quantized_model(transformer.DecoderLM(cfg), recipe)
  tokens = jax.random.randint(jax.random.key(0), (_BATCH.value, _SEQ.value + 1), 0, 256)
  params = model.init(jax.random.key(1), tokens[:, :-1], jax.random.key(2))
  opt = optax.adam(1e-3)
  state = (params, opt.init(params))

  @jax.jit
  def train_step(state, tokens, key):
    params, opt_state = state
    def loss_fn(p):
      logits = model.apply(p, tokens[:, :-1], key)
      return transformer.next_token_loss(logits, tokens[:, 1:])[0]
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

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


def main(argv):
  del argv
  times = {r: step_time(r, _REPEATS.value) for r in _RECIPES.value}
  base = times.get("bf16") or next(iter(times.values()))
  print(f"d_model {_D_MODEL.value}, {_LAYERS.value} layers, batch {_BATCH.value} x "
        f"{_SEQ.value} tokens, {jax.devices()[0].platform}")
  print(f"{'recipe':12s} {'step ms':>9s} {'/ bf16':>8s}")
  for r, t in times.items():
    print(f"{r:12s} {t * 1e3:9.1f} {t / base:8.2f}")


if __name__ == "__main__":
  app.run(main)
