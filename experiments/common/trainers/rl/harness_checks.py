"""Harness checks of the RL loop (Pan, "Probe the Harness"): raise on a violation.

* Every batch is drawn from ``(seed, update)`` and none repeats
  (:func:`batch_fingerprint`, :func:`update_fingerprint`; the loop keeps the set).
* On the first update of a process (:func:`check_harness`): the loss receives the
  sampler's recorded log-probs where the method names them, and its normaliser is the
  one the config names (checked against an independent reduction).
"""

from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common.data import arithmetic_task as task
from experiments.common.trainers.rl.config import RLConfig
from lowprec.models import sampling


def batch_fingerprint(prompts: np.ndarray) -> str:
  return hashlib.sha1(np.ascontiguousarray(prompts).tobytes()).hexdigest()[:16]


def update_fingerprint(config: RLConfig, update: int) -> str:
  """The fingerprint of the problems drawn for ``update`` (one per group)."""
  return batch_fingerprint(task.problems(seed=config.seed, position=update,
                                         batch_size=config.prompts_per_update,
                                         digits=config.digits)["prompts"])


def check_harness(config, apply, sampler_apply, params, sampler, samples, adv, mask,
                  loss_fn, prompt_len) -> None:
  """Pan's harness checks on the first update; raise on a violation.

  1. The behaviour log-probs the loss receives are the sampler's own: recomputing them
     from the sampler's weights with its processing matches the recorded ones, and the
     loss changes when they are replaced by the learner's recomputation (so they are
     used) unless the method takes no behaviour term at all.
  2. The loss normaliser is the configured one: the loss equals an independent
     reduction of the per-token objective.

  Every recomputation is jitted like the sampler and the update are: XLA:CPU's
  op-by-op (eager) kernels differ from its fused ones by float32 ulps, which a bf16 or
  MXFP8 cast downstream can turn into log-prob differences of 0.1-1 (measured on the
  mxfp8 sampler of :mod:`experiments.mxfp8_rl`; 4e-7 between jitted programs).
  """
  key = jax.random.PRNGKey(0)
  recomputed = jax.jit(lambda prm, t: sampling.sequence_log_probs(
      sampler_apply, prm, t, prompt_len, key, **config.sampler_kwargs))(
          sampler.params, samples.tokens)
  m = jnp.asarray(mask)
  gap = float(jnp.max(jnp.abs(recomputed - samples.logp) * m))
  if gap > 1e-4:
    raise RuntimeError(f"recorded behaviour log-probs differ from the sampler's by {gap}")
  learner = jax.jit(lambda prm, t: sampling.sequence_log_probs(
      apply, config.loss_params(prm, sampler.params), t, prompt_len, key))(
          params, samples.tokens)
  loss_fn = jax.jit(loss_fn)
  loss_b, _ = loss_fn(params, samples.tokens, samples.logp, adv, m, sampler.params)
  loss_l, _ = loss_fn(params, samples.tokens, learner, adv, m, sampler.params)
  uses_behaviour = config.is_method != "none" or config.ratio_against == "sampler"
  mismatch = float(jnp.max(jnp.abs(learner - samples.logp) * m)) > 1e-3
  if (uses_behaviour and mismatch and bool(jnp.any(adv != 0))
      and float(loss_b) == float(loss_l)):
    raise RuntimeError("the loss does not depend on the recorded behaviour log-probs")
  # Normaliser: recompute with the per-token objective under the named reduction.
  # On an on-policy ratio (r = 1) the objective is -w A, w = min(pi / mu, C) for TIS.
  weight = {"none": jnp.ones_like(learner),
            "token_tis": jnp.minimum(jnp.exp(learner - samples.logp), config.is_cap)
            }.get(config.is_method)
  per_token = -adv[:, None] * (weight if weight is not None else 0.0)
  if config.ratio_against == "learner" and weight is not None:
    expected = {"token": jnp.sum(per_token * m) / jnp.maximum(jnp.sum(m), 1.0),
                "sequence": jnp.mean(jnp.sum(per_token * m, 1)
                                     / jnp.maximum(jnp.sum(m, 1), 1.0)),
                "constant": jnp.sum(per_token * m) / m.size}[config.normalization]
    if not np.isclose(float(loss_b), float(expected), rtol=1e-5, atol=1e-6):
      raise RuntimeError(f"loss {float(loss_b)} is not the {config.normalization!r}-"
                         f"normalised objective {float(expected)}")
