"""The looped LM's supervised warm start on 3-digit addition, cached by config hash.

:mod:`experiments.common.trainers.rl.warm_start` trains a ``DecoderLM`` and keys its cache by
fields that do not name the architecture, so a looped model gets its own: the same
recipe (AdamW at a constant ``pretrain_lr``, batches of ``pretrain_batch`` teacher-
forced problems of the stream ``pretrain_seed + 10_000``, loss on the answer tokens)
on :class:`models.looped.LoopedLM` in float32, dense, with the exit rule deciding each
position's depth. The exit gate gets no gradient this way (depths are data), so it
keeps its initial weights: its decisions still depend on the hidden state, which
training moves. The cache key hashes every field that defines the weights, the loop
included; a file lock makes parallel runs of one seed train it once.
"""

from __future__ import annotations

import fcntl
import os
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import optax

from experiments.common.data import arithmetic_task as task
from experiments.common.harness import params_cache
from lowprec.models import looped
from lowprec.models.transformer import next_token_loss

SUPERVISED_STREAM = 10_000


def warm_start(model: looped.LoopedLM, fields: Mapping[str, Any], *, seed: int,
               steps: int, batch: int, lr: float, digits: int, cache_dir: str
               ) -> tuple[Any, str]:
  """The float32 params after ``steps`` supervised steps, and their cache path.

  ``fields``: everything that defines the weights (hashed into the cache name);
  ``model`` must be float32 (the weights are trained in float32 whatever the run's
  recipe).
  """
  os.makedirs(cache_dir, exist_ok=True)
  path = os.path.join(cache_dir, f"looped-{params_cache.digest(fields)}.npz")
  key = jax.random.PRNGKey(seed)
  length = task.prompt_length(digits) + task.answer_length(digits) - 1
  params = model.init(key, jnp.zeros((1, length), jnp.int32), key)["params"]
  with open(f"{path}.lock", "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    if not os.path.exists(path):
      params = _train(model, params, seed=seed, steps=steps, batch=batch, lr=lr,
                      digits=digits)
      params_cache.save(path, params)
  return params_cache.load(path, params)[0], path


def _train(model: looped.LoopedLM, params: Any, *, seed: int, steps: int, batch: int,
           lr: float, digits: int) -> Any:
  optimizer = optax.adamw(lr, weight_decay=0.0)
  key = jax.random.PRNGKey(seed)

  @jax.jit
  def step(params, opt_state, b):
    def loss_fn(p):
      logits, _ = model.apply({"params": p}, b["inputs"], key)
      return next_token_loss(logits, b["targets"], b["mask"])[0]
    grads = jax.grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  opt_state = optimizer.init(params)
  for i in range(steps):
    b = task.supervised_batch(seed=seed + SUPERVISED_STREAM, position=i, batch_size=batch,
                              digits=digits)
    params, opt_state = step(params, opt_state, b)
  return params
