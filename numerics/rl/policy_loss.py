"""GRPO/PPO policy loss with a sampler-mismatch importance weight.

Per token, with ``l`` the learner's log-probs (differentiated), ``p`` the proximal
(anchor) log-probs and ``b`` the sampler's recorded (behaviour) log-probs::

    r_t    = exp(clip(l_t - p_t, -20, 20))                          PPO ratio
    ppo_t  = min(r_t A_t, clip(r_t, 1 - eps, 1 + eps_high) A_t)
    w_t    = IS weight of lr_t = clip(p_t - b_t, -20, 20)            stop-gradient
    loss_t = -w_t * ppo_t + kl_coef * k3_t,   k3_t = exp(q_t - l_t) - (q_t - l_t) - 1

(``q`` = reference log-probs). The loss is ``normalize_loss(loss_t, mask * keep)``,
so tokens that masked IS / IcePop rejected leave the denominator too.

Which ``p`` (one convention, following the TIS and AReaL equations in papers.md:
``w = min(pi_learner_old / pi_sampler, C)`` multiplies the clipped term whose ratio is
``pi_theta / pi_learner_old``):

* ``proximal_logp`` given (decoupled PPO, AReaL): ``p = stop_gradient(proximal_logp)``,
  the learner's own old log-probs; the weight corrects proximal vs sampler.
* ``proximal_logp=None`` and an IS method: the learner's old policy *is* the current
  one, ``p = stop_gradient(l)``. Then ``r = 1`` in value with ``dr/dl = 1``, and the
  gradient is Yao et al.'s TIS estimator ``min(pi/mu, C) A grad log pi``. (Taking
  ``p = b`` here would apply the sampler correction twice: once as ``r = pi/mu``, once
  as ``w``.) Identical to passing ``proximal_logp=stop_gradient(learner_logp)``.
* ``proximal_logp=None`` and ``NoCorrection()``: ``p = b``, standard PPO/GRPO with
  the ratio taken against the sampler's recorded log-probs (the ratio ``pi/mu`` is then
  the only, clipped, correction). ``w = 1``.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from lowprec.numerics.rl import importance
from lowprec.numerics.rl import mismatch


def _token_advantages(advantages, shape) -> jax.Array:
  a = jnp.asarray(advantages).astype(jnp.float32)
  if a.shape == tuple(shape):
    return a
  if a.shape == tuple(shape[:1]):
    return jnp.broadcast_to(a[:, None], shape)
  raise ValueError(f"advantages must be [B] or [B, T] = {tuple(shape)}, got shape {a.shape}")


def _check_eps(clip_eps, clip_eps_high):
  for name, v in (("clip_eps", clip_eps), ("clip_eps_high", clip_eps_high)):
    if importance._is_number(v) and not v >= 0:
      raise ValueError(f"{name} must be >= 0, got {v}")
  return clip_eps if clip_eps_high is None else clip_eps_high


def ppo_clip_objective(learner_logp: jax.Array, proximal_logp: jax.Array,
                       advantages: jax.Array, clip_eps: float = 0.2,
                       clip_eps_high: float | None = None) -> jax.Array:
  """Per-token PPO-clip loss ``-min(r A, clip(r, 1-eps, 1+eps_high) A)``, float32 ``[B, T]``.

  ``r = exp(clip(learner - stop_gradient(proximal), -20, 20))``; ``advantages`` is
  ``[B, T]`` or per-sequence ``[B]`` (broadcast over T); ``clip_eps_high`` defaults to
  ``clip_eps`` (set it larger for DAPO's clip-higher). Not masked or reduced.
  """
  eps_high = _check_eps(clip_eps, clip_eps_high)
  l = importance.as_tokens(learner_logp, "learner_logp")
  p = jax.lax.stop_gradient(importance.as_tokens(proximal_logp, "proximal_logp", l.shape))
  a = _token_advantages(advantages, l.shape)
  r = jnp.exp(importance.log_ratio(l, p))
  return -jnp.minimum(r * a, jnp.clip(r, 1.0 - clip_eps, 1.0 + eps_high) * a)


def ppo_clipped_mask(learner_logp: jax.Array, proximal_logp: jax.Array,
                     advantages: jax.Array, clip_eps: float = 0.2,
                     clip_eps_high: float | None = None) -> jax.Array:
  """float32 ``[B, T]``: 1 where the clipped branch is active (its gradient is zero),
  i.e. ``A > 0, r > 1 + eps_high`` or ``A < 0, r < 1 - eps``."""
  eps_high = _check_eps(clip_eps, clip_eps_high)
  l = importance.as_tokens(learner_logp, "learner_logp")
  p = importance.as_tokens(proximal_logp, "proximal_logp", l.shape)
  a = _token_advantages(advantages, l.shape)
  r = jnp.exp(importance.log_ratio(l, p))
  hit = ((a > 0) & (r > 1.0 + eps_high)) | ((a < 0) & (r < 1.0 - clip_eps))
  return jax.lax.stop_gradient(hit.astype(jnp.float32))


@dataclasses.dataclass(frozen=True)
class TokenMean:
  """``sum(mask * x) / sum(mask)``: DAPO's token-level mean over the batch (0 for an
  empty mask)."""

  mode: ClassVar[str] = "token"

  def reduce(self, masked: jax.Array, mask: jax.Array) -> jax.Array:
    """Scalar float32 of the masked ``[B, T]`` values ``masked`` (zeros off the mask)."""
    return jnp.sum(masked) / jnp.maximum(jnp.sum(mask), 1.0)


@dataclasses.dataclass(frozen=True)
class SequenceMean:
  """The mean over rows of each row's masked-token mean (the original GRPO); rows with
  no masked token are left out (0 for an empty mask)."""

  mode: ClassVar[str] = "sequence"

  def reduce(self, masked: jax.Array, mask: jax.Array) -> jax.Array:
    """Scalar float32 of the masked ``[B, T]`` values ``masked`` (zeros off the mask)."""
    n_row = jnp.sum(mask, axis=-1)
    row_mean = jnp.sum(masked, axis=-1) / jnp.maximum(n_row, 1.0)
    has = (n_row > 0).astype(jnp.float32)
    return jnp.sum(row_mean * has) / jnp.maximum(jnp.sum(has), 1.0)


@dataclasses.dataclass(frozen=True)
class ConstantDivisor:
  """``sum(mask * x) / constant``: Dr. GRPO's fixed divisor (e.g. ``B * max_len``), so
  a sequence's weight does not depend on its length. ``constant`` > 0 (a Python number
  is checked here; a traced one is the caller's)."""

  constant: float
  mode: ClassVar[str] = "constant"

  def __post_init__(self):
    if importance._is_number(self.constant) and not self.constant > 0:
      raise ValueError(f"constant must be > 0, got {self.constant}")

  def reduce(self, masked: jax.Array, mask: jax.Array) -> jax.Array:
    """Scalar float32 of the masked ``[B, T]`` values ``masked`` (zeros off the mask)."""
    return jnp.sum(masked) / self.constant


Normalization = TokenMean | SequenceMean | ConstantDivisor
NORMALIZATIONS = tuple(c.mode for c in (TokenMean, SequenceMean, ConstantDivisor))


def normalization(mode: str, *, constant: float | None = None) -> Normalization:
  """The :data:`Normalization` named ``mode`` (one of ``NORMALIZATIONS``); ``constant``
  is read by ``"constant"`` only (required there). For resolving a configuration's
  name once; code below that passes the object."""
  if mode not in NORMALIZATIONS:
    raise ValueError(f"unknown loss normalization {mode!r}; expected one of "
                     f"{NORMALIZATIONS}")
  if mode == ConstantDivisor.mode:
    if constant is None:
      raise ValueError("normalization 'constant' needs a constant (e.g. batch * "
                       "max_len)")
    return ConstantDivisor(constant)
  return TokenMean() if mode == TokenMean.mode else SequenceMean()


def _check_normalization(norm, api: str) -> Normalization:
  """``norm`` if it is a :data:`Normalization`; a name (read it with
  :func:`normalization`) or anything else is a TypeError naming what to pass."""
  if not isinstance(norm, Normalization):
    raise TypeError(f"{api}: normalization must be TokenMean(), SequenceMean() or "
                    f"ConstantDivisor(c); a configuration's name is read with "
                    f"policy_loss.normalization(name, constant=...), got {norm!r}")
  return norm


def normalize_loss(per_token: jax.Array, mask: jax.Array,
                   mode: Normalization = TokenMean()) -> jax.Array:
  """Scalar float32 reduction of ``per_token`` ``[B, T]`` over ``mask`` (``[B, T]``
  bool/float) by ``mode``: :class:`TokenMean` (default), :class:`SequenceMean` or
  :class:`ConstantDivisor`. Gradient: that of the reduction, through ``per_token``.
  """
  norm = _check_normalization(mode, "normalize_loss")
  x = importance.as_tokens(per_token, "per_token")
  m = importance.as_mask(mask, x.shape)
  return norm.reduce(jnp.where(m > 0, x, 0.0), m)


def k3_kl(learner_logp: jax.Array, reference_logp: jax.Array) -> jax.Array:
  """Per-token k3 estimate of KL(pi_theta || pi_ref): ``exp(q - l) - (q - l) - 1`` >= 0,
  with ``q - l`` clamped to ``[-20, 20]``; gradient flows through ``learner_logp``."""
  d = importance.log_ratio(jax.lax.stop_gradient(jnp.asarray(reference_logp, jnp.float32)),
                           learner_logp)
  return jnp.exp(d) - d - 1.0


def _check_correction(correction) -> importance.Correction:
  if not isinstance(correction, importance.Correction):
    raise TypeError(f"grpo_loss: correction must be a lowprec.numerics.rl.importance "
                    f"correction ({', '.join(importance.CORRECTION_NAMES)}); a "
                    f"configuration's name is read with importance.correction(name, "
                    f"...), got {correction!r}")
  return correction


def grpo_loss(learner_logp: jax.Array, behaviour_logp: jax.Array, advantages: jax.Array,
              mask: jax.Array, *,
              correction: importance.Correction = importance.TokenTIS(cap=2.0),
              clip_eps: float = 0.2, clip_eps_high: float | None = None,
              normalization: Normalization = TokenMean(),
              proximal_logp: jax.Array | None = None, kl_coef: float = 0.0,
              reference_logp: jax.Array | None = None
              ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """GRPO loss (scalar float32) and metrics; the convention is in the module docstring.

  Args:
    learner_logp: ``[B, T]`` log-probs of the sampled tokens under the learner (the only
      differentiated input).
    behaviour_logp: ``[B, T]`` log-probs the sampler recorded (its own temperature and
      precision; e.g. Pan's decoupled cooling records ``log mu_0.8``).
    advantages: ``[B]`` per sequence or ``[B, T]``.
    mask: ``[B, T]`` bool/float, 1 for completion tokens that count.
    correction: the importance-sampling correction, a
      :data:`numerics.rl.importance.Correction` (``TokenTIS(cap=2.0)``, the default;
      ``NoCorrection()``, ``SequenceTIS``, ``MaskedIS``, ``IcePop``).
    clip_eps, clip_eps_high: PPO clip range ``[1 - clip_eps, 1 + clip_eps_high]``.
    normalization: the loss reduction, :class:`TokenMean` (default),
      :class:`SequenceMean` or :class:`ConstantDivisor`.
    proximal_logp: ``[B, T]`` learner old log-probs for decoupled PPO, or None.
    kl_coef, reference_logp: k3 KL penalty to the reference (required if kl_coef != 0).

  Metrics (scalars): loss, pg_loss, kl (mean k3 over counted tokens), ppo_clip_frac
  (counted tokens in the clipped branch), is_{mean,std,min,max,ess,clipped_frac,
  dropped_frac} from :func:`numerics.rl.importance.is_statistics`, and
  mismatch_{k1,k3,max_abs_delta_logp} between the learner and the sampler.
  """
  corr = _check_correction(correction)
  norm = _check_normalization(normalization, "grpo_loss")
  l = importance.as_tokens(learner_logp, "learner_logp")
  b = jax.lax.stop_gradient(importance.as_tokens(behaviour_logp, "behaviour_logp", l.shape))
  m = importance.as_mask(mask, l.shape)
  a = _token_advantages(advantages, l.shape)
  use_kl = reference_logp is not None
  if not use_kl and not (importance._is_number(kl_coef) and kl_coef == 0):
    raise ValueError(f"kl_coef={kl_coef!r} needs reference_logp (or a python kl_coef=0)")

  if proximal_logp is not None:
    p = jax.lax.stop_gradient(importance.as_tokens(proximal_logp, "proximal_logp", l.shape))
  elif isinstance(corr, importance.NoCorrection):
    p = b
  else:
    p = jax.lax.stop_gradient(l)

  isw = corr.weights(importance.log_ratio(p, b), m)
  counted = m * isw.keep
  pg = isw.weights * ppo_clip_objective(l, p, a, clip_eps, clip_eps_high)
  per_token = pg
  if use_kl:
    kl_tok = k3_kl(l, importance.as_tokens(reference_logp, "reference_logp", l.shape))
    per_token = per_token + kl_coef * kl_tok
  else:
    kl_tok = jnp.zeros_like(l)
  loss = normalize_loss(per_token, counted, norm)

  n_counted = jnp.maximum(jnp.sum(counted), 1.0)
  clip_frac = jnp.sum(ppo_clipped_mask(l, p, a, clip_eps, clip_eps_high) * counted) / n_counted
  metrics = {
      "loss": jax.lax.stop_gradient(loss),
      "pg_loss": jax.lax.stop_gradient(normalize_loss(pg, counted, norm)),
      "kl": jax.lax.stop_gradient(jnp.sum(kl_tok * counted) / n_counted),
      "ppo_clip_frac": clip_frac,
  }
  metrics.update({f"is_{k}": v for k, v in importance.is_statistics(isw, m).items()
                  if k != "n_tokens"})
  metrics.update({f"mismatch_{k}": v for k, v in
                  mismatch.mismatch_kl(jax.lax.stop_gradient(l), b, m).items()})
  return loss, metrics
