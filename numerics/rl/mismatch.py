"""Sampler/learner log-prob mismatch diagnostics.

The tokens were drawn from the sampler ``mu``, so with ``d_t = log pi(y_t) - log mu(y_t)``
(learner minus behaviour) both estimators below are unbiased for ``KL(mu || pi)``::

    k1 = mean(-d)                 (unbiased, high variance, can be negative)
    k3 = mean(exp(d) - 1 - d)     (unbiased, >= 0 per token; Schulman's k3)

``d`` is clamped to ``[-20, 20]`` inside the ``exp`` only (k1 and the max use the raw
difference). All means are over masked tokens; an empty mask gives zeros.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lowprec.numerics.rl import importance


def mismatch_kl(learner_logp: jax.Array, behaviour_logp: jax.Array,
                mask: jax.Array) -> dict[str, jax.Array]:
  """Scalar float32 ``k1``, ``k3`` and ``max_abs_delta_logp`` over masked tokens.

  Args:
    learner_logp, behaviour_logp: ``[B, T]`` log-probs of the sampled tokens.
    mask: ``[B, T]`` bool/float, 1 for tokens that count.
  """
  l = importance.as_tokens(learner_logp, "learner_logp")
  b = importance.as_tokens(behaviour_logp, "behaviour_logp", l.shape)
  m = importance.as_mask(mask, l.shape)
  d = jnp.where(m > 0, l - b, 0.0)
  dc = jnp.clip(d, -importance.DEFAULT_CLAMP, importance.DEFAULT_CLAMP)
  n = jnp.maximum(jnp.sum(m), 1.0)
  return {
      "k1": jnp.sum(-d * m) / n,
      "k3": jnp.sum((jnp.exp(dc) - 1.0 - dc) * m) / n,
      "max_abs_delta_logp": jnp.max(jnp.abs(d) * m),
  }
