"""Decode time with a KV cache vs recomputing the prefix: a ratio measured in one run.

    python -m experiments.kv_cache.bench_decode

For each shape, a ``DecoderLM`` (random weights: the time does not depend on them)
generates ``num_new`` tokens after ``prompt_len`` prompt tokens for ``batch`` rows,
jitted and compiled first: :func:`models.sampling.sample` (no cache: every step runs
the whole buffer) and :func:`models.sampling.sample_cached` with each cache. The
calls are interleaved, ``repeats`` times, and each takes its minimum; printed is
``uncached / cached`` (above 1: the cache is faster). Shapes: the arithmetic task's
(prompt 8, 5 new tokens, the kv_cache sweep's model) and a longer decode (prompt 32,
96 new tokens).
"""

from __future__ import annotations

import time

from absl import app, flags
import jax
import jax.numpy as jnp

from experiments.common.harness.config_flags import parse_flags
from experiments.kv_cache.experiment import parse_cache
from lowprec.models import kv_cache, sampling
from lowprec.models.transformer import DecoderLM, TransformerConfig

SHAPES = ((8, 5), (32, 96))  # (prompt_len, num_new)


def _best(fns: dict[str, callable], repeats: int) -> dict[str, float]:
  times = {name: float("inf") for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      t = time.perf_counter()
      jax.block_until_ready(fn())
      times[name] = min(times[name], time.perf_counter() - t)
  return times


def define_flags() -> None:
  """Defines this script's flags; called only when it runs as a script, so that
  importing the module (a test, another script) defines no flag names."""
  flags.DEFINE_integer("repeats", 7, "Timed calls per function (min taken).")
  flags.DEFINE_integer("batch", 128, "Rows decoded at once.")
  flags.DEFINE_list("caches", ["fp32", "bf16", "e4m3/token"],
                    "Cache formats to time (as --key_cache of the experiment).")


def main(argv):
  del argv
  for prompt_len, num_new in SHAPES:
    cfg = TransformerConfig(vocab_size=14, d_model=64, num_layers=2, num_heads=4,
                            d_ff=256, max_len=prompt_len + num_new)
    model = DecoderLM(cfg)
    key = jax.random.PRNGKey(0)
    params = model.init(key, jnp.zeros((1, prompt_len), jnp.int32), key)["params"]
    prompts = jax.random.randint(jax.random.PRNGKey(1), (flags.FLAGS.batch, prompt_len), 0, 14)
    apply = lambda p, t, k: model.apply({"params": p}, t, k)
    fns = {"uncached": jax.jit(lambda p: sampling.sample(apply, p, prompts, num_new,
                                                         key).tokens)}
    for name in flags.FLAGS.caches:
      cm = kv_cache.cached_lm(model, parse_cache(name)[0])
      fns[name] = jax.jit(lambda p, cm=cm: sampling.sample_cached(cm, p, prompts, num_new,
                                                                  key).tokens)
    fns = {name: (lambda fn=fn: fn(params)) for name, fn in fns.items()}
    for fn in fns.values():
      jax.block_until_ready(fn())  # compile
    times = _best(fns, flags.FLAGS.repeats)
    print(f"batch {flags.FLAGS.batch}, prompt {prompt_len}, {num_new} new tokens "
          f"(d_model 64, 2 layers), min of {flags.FLAGS.repeats}:")
    for name, t in times.items():
      if name != "uncached":
        print(f"  uncached / cached({name}) = {times['uncached'] / t:.2f}  "
              f"({t * 1e3:.1f} ms vs {times['uncached'] * 1e3:.1f} ms)")


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=parse_flags)
