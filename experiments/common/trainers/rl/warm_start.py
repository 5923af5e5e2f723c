"""The RL runs' starting policy and their evaluation.

:func:`warm_start` fine-tunes the task model with supervision (cached under
``pretrain_dir`` by the hash of everything that defines it, so every arm that shares
the warm-start fields starts from the same policy); :func:`greedy_accuracy` is the
learner's exact-match accuracy with greedy decoding on fixed held-out problems.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.common.data import arithmetic_task as task
from experiments.common.harness import params_cache
from experiments.common.trainers.rl.config import RLConfig
from lowprec.models import sampling
from lowprec.models.transformer import DecoderLM, next_token_loss


def _pretrain_fields(config: RLConfig) -> dict[str, Any]:
  keys = ("digits", "d_model", "num_layers", "num_heads", "d_ff", "pretrain_steps",
          "pretrain_batch", "pretrain_lr")
  fields = {**{k: getattr(config, k) for k in keys}, "pretrain_seed": config.warm_start_seed}
  if config.pretrain_target_accuracy > 0:  # absent otherwise: older caches still load
    fields["pretrain_target_accuracy"] = config.pretrain_target_accuracy
    fields["pretrain_check_every"] = config.pretrain_check_every
  return fields


def warm_start(config: RLConfig, model: DecoderLM) -> tuple[Any, dict[str, float]]:
  """The supervised warm-start params (cached) and their greedy accuracy.

  ``pretrain_steps`` supervised AdamW steps; with ``pretrain_target_accuracy`` > 0 the
  training stops at the first check (every ``pretrain_check_every`` steps, from step 0)
  where the greedy accuracy on the warm start's own held-out problems (position 0,
  never the RL evaluation's) reaches the target, so that seeds whose fixed-step warm
  starts would land anywhere between 0.4 and 0.9 start from comparable policies.
  ``info`` records the steps used.
  """
  path = os.path.join(config.pretrain_dir,
                      f"{params_cache.digest(_pretrain_fields(config))}.npz")
  key = jax.random.PRNGKey(config.warm_start_seed)
  length = task.prompt_length(config.digits) + task.answer_length(config.digits) - 1
  params = model.init(key, jnp.zeros((1, length), jnp.int32), key)["params"]
  if os.path.exists(path):
    return params_cache.load(path, params)
  optimizer = optax.adamw(config.pretrain_lr, weight_decay=0.0)

  @jax.jit
  def step(params, opt_state, batch):
    def loss_fn(p):
      logits = model.apply({"params": p}, batch["inputs"], key)
      return next_token_loss(logits, batch["targets"], batch["mask"])[0]
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state = optimizer.init(params)
  steps, loss = 0, float("nan")
  for i in range(config.pretrain_steps):
    if (config.pretrain_target_accuracy > 0 and i % config.pretrain_check_every == 0
        and greedy_accuracy(model, params, config, position=0)["greedy_accuracy"]
        >= config.pretrain_target_accuracy):
      break
    batch = task.supervised_batch(seed=config.warm_start_seed + 10_000, position=i,
                                  batch_size=config.pretrain_batch, digits=config.digits)
    params, opt_state, loss = step(params, opt_state, batch)
    steps = i + 1
  info = {"pretrain_loss": float(loss), "pretrain_steps_used": steps,
          **greedy_accuracy(model, params, config, position=0)}
  os.makedirs(config.pretrain_dir, exist_ok=True)
  params_cache.save(path, params, info)  # atomic: parallel arms may race to write it
  return params, info


def greedy_accuracy(model: DecoderLM, params: Any, config: RLConfig,
                    position: int) -> dict[str, float]:
  """Exact-match accuracy of greedy (top-1) decoding on held-out problems (a fixed
  set per ``position``, drawn from the warm-start seed so every arm sees the same)."""
  p = task.problems(seed=config.warm_start_seed + 20_000, position=position,
                    batch_size=config.eval_problems, digits=config.digits)
  out = _greedy(model, params, jnp.asarray(p["prompts"]),
                task.answer_length(config.digits))
  completions = np.asarray(out)[:, task.prompt_length(config.digits):]
  return {"greedy_accuracy": float(task.rewards(completions, p["answers"]).mean())}


@functools.partial(jax.jit, static_argnums=(0, 3))
def _greedy(model, params, prompts, num_new):
  apply = lambda prm, t, k: model.apply({"params": prm}, t, k)
  return sampling.sample(apply, params, prompts, num_new, jax.random.PRNGKey(0),
                         top_k=1).tokens
