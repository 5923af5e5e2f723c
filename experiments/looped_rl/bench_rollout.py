"""Rollout time of a looped LM, deferred (KV-cached) vs dense decoding: one-run ratio.

    python -m experiments.looped_rl.bench_rollout

For each shape, the looped_rl sweep's model (random weights: the time does not
depend on them; one shared block, 3 loops, exit threshold 0.5) samples ``num_new``
tokens after ``prompt_len`` prompt tokens for ``batch`` rows, jitted and compiled
first: *deferred* is :func:`models.looped.rollout` (a prefill, then one token per step
with per-loop KV caches, depths recorded); *dense* is :func:`models.sampling.sample`
on the looped model's dense pass (every step recomputes the whole buffer, the exit
rule deciding each position's depth). Interleaved ``repeats`` times, minimum of each;
printed is ``dense / deferred`` (above 1: deferred is faster). Shapes: the GRPO
batch's (prompt 8, 5 new tokens) and a longer decode (prompt 32, 96 new tokens).
Note that this deferred path saves no loop compute for exited tokens (they keep
running through deeper loops so later tokens can attend to them).

The claim "deferred rollout is faster than dense" is decided by
:mod:`experiments.looped_rl.bench_confirm` (sequential rounds on one pinned core, built
from :func:`rollout_fns`); this script is the quick one-off ratio.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from absl import app, flags
import jax
import jax.numpy as jnp

from experiments.common.harness.config_flags import parse_flags
from experiments.looped_rl.experiment import ROLLOUT_KV, LoopedRLConfig
from lowprec.models import looped, sampling

SHAPES = ((8, 5), (32, 96))  # (prompt_len, num_new)


def define_flags() -> None:
  """Defines this script's flags; called only when it runs as a script, so that
  importing the module (a test, another script) defines no flag names."""
  flags.DEFINE_integer("repeats", 7, "Timed calls per function (min taken).")
  flags.DEFINE_integer("batch", 128, "Rows decoded at once.")
  flags.DEFINE_list("recipes", ["fp32", "bf16"], "Recipes to time.")


def rollout_fns(recipe: str, prompt_len: int, num_new: int, batch: int
                ) -> dict[str, Callable[[], Any]]:
  """``{"deferred": f, "dense": f}``: each a jitted, compiled call that samples
  ``num_new`` tokens after ``prompt_len`` random prompt tokens for ``batch`` rows with
  the looped_rl sweep's model (``recipe``; random weights), as the module docstring
  says."""
  base = LoopedRLConfig(recipe=recipe)
  model = base.model()
  model = model.clone(config=dataclasses.replace(model.config,
                                                 max_len=prompt_len + num_new))
  key = jax.random.PRNGKey(0)
  params = model.init(key, jnp.zeros((1, prompt_len), jnp.int32), key)["params"]
  prompts = jax.random.randint(jax.random.PRNGKey(1), (batch, prompt_len), 0,
                               model.config.vocab_size)
  dense_apply = lambda p, t, k: model.apply({"params": p}, t, k)[0]
  spec = ROLLOUT_KV["fp32" if recipe == "fp32" else "bf16"]
  deferred = jax.jit(lambda p: looped.rollout(model, p, prompts, num_new, key,
                                              key_spec=spec).tokens)
  dense = jax.jit(lambda p: sampling.sample(dense_apply, p, prompts, num_new,
                                            key).tokens)
  fns = {"deferred": lambda: deferred(params), "dense": lambda: dense(params)}
  for fn in fns.values():
    jax.block_until_ready(fn())  # compile
  return fns


def main(argv):
  del argv
  for prompt_len, num_new in SHAPES:
    for recipe in flags.FLAGS.recipes:
      fns = rollout_fns(recipe, prompt_len, num_new, flags.FLAGS.batch)
      best = {"deferred": float("inf"), "dense": float("inf")}
      for _ in range(flags.FLAGS.repeats):
        for name, fn in fns.items():
          t = time.perf_counter()
          jax.block_until_ready(fn())
          best[name] = min(best[name], time.perf_counter() - t)
      print(f"{recipe}, batch {flags.FLAGS.batch}, prompt {prompt_len}, {num_new} new tokens, "
            f"min of {flags.FLAGS.repeats}: dense / deferred = "
            f"{best['dense'] / best['deferred']:.2f}  ({best['deferred'] * 1e3:.1f} ms vs "
            f"{best['dense'] * 1e3:.1f} ms)")


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=parse_flags)
