"""Importance weights that correct a sampler/learner mismatch (TIS, masked IS, IcePop).

Let ``lr_t = log pi(y_t) - log mu(y_t)`` be the per-token log ratio between the policy
the loss is written for (``pi``: the learner's old/proximal log-probs) and the sampler
that drew ``y_t`` (``mu``: the behaviour policy, possibly stale, tempered or quantized),
and ``rho_t = exp(lr_t)``. Every weight here is a constant coefficient (stop-gradient)::

    token_tis      w_t = min(rho_t, C)                         Yao et al. 2025, C = 2
    sequence_tis   w_t = exp(min(sum_t m_t lr_t, log C))        same for every token of a row
    masked_is      w_t = rho_t * 1[lo <= rho_t <= hi]           Liu et al. (MIS), token level
                   w_t = rho_s * 1[lo <= rho_s <= hi],          sequence level, with the
                         rho_s = exp(mean_{t: m_t} lr_t)        geometric-mean ratio rho_s
    icepop         w_t = rho_t * 1[lo <= rho_t <= hi]           Ring-1T; defaults [0.5, 5]

``lr`` is clamped to ``[-clamp, clamp]`` (:func:`log_ratio`) and sequence-level TIS is
computed in log space, so no ``exp`` overflows. Masked/IcePop methods also return a
``keep`` mask: rejected tokens must leave the loss *denominator* too (slime PR #657),
which :func:`numerics.rl.policy_loss.grpo_loss` does.

Each method is a frozen dataclass holding the numbers it reads (:class:`NoCorrection`,
:class:`TokenTIS`, :class:`SequenceTIS`, :class:`MaskedIS`, :class:`IcePop`; the union
is :data:`Correction`), whose ``weights(log_ratio, mask)`` gives the
:class:`ISWeights`. :func:`correction` resolves a configuration's method name once.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

METHODS = ("none", "token_tis", "sequence_tis", "masked_is", "icepop")
LEVELS = ("token", "sequence")
DEFAULT_CLAMP = 20.0


class ISWeights(NamedTuple):
  """Output of :func:`importance_weights`; all ``[B, T]`` float32.

  weights: the (stop-gradient) coefficient of each token's policy term; 0 where dropped.
  keep: 1 where the token is kept, 0 where masked IS / IcePop rejected it.
  clipped: 1 where the TIS cap was hit (the weight was truncated to C), else 0.
  """
  weights: jax.Array
  keep: jax.Array
  clipped: jax.Array


def _is_number(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool)


def as_mask(mask, shape) -> jax.Array:
  """``mask`` (bool or float, shape ``shape``) as float32 0/1 (nonzero counts as 1)."""
  mask = jnp.asarray(mask)
  if mask.shape != tuple(shape):
    raise ValueError(f"mask shape {mask.shape} does not match per-token shape {tuple(shape)}")
  return (mask != 0).astype(jnp.float32)


def as_tokens(x, name: str, shape=None) -> jax.Array:
  """``x`` as a float32 ``[B, T]`` array (shape ``shape`` if given)."""
  x = jnp.asarray(x).astype(jnp.float32)
  if x.ndim != 2:
    raise ValueError(f"{name} must be [B, T], got shape {x.shape}")
  if shape is not None and x.shape != tuple(shape):
    raise ValueError(f"{name} shape {x.shape} does not match {tuple(shape)}")
  return x


def _check_positive(name, v):
  if _is_number(v) and not v > 0:
    raise ValueError(f"{name} must be > 0, got {v}")


def _check_bounds(lo, hi):
  _check_positive("lo", lo)
  if _is_number(lo) and _is_number(hi) and not hi >= lo:
    raise ValueError(f"need lo <= hi, got lo={lo}, hi={hi}")


def log_ratio(learner_logp: jax.Array, behaviour_logp: jax.Array,
              clamp: float = DEFAULT_CLAMP) -> jax.Array:
  """float32 ``clip(learner_logp - behaviour_logp, -clamp, clamp)``, same shape.

  Clamping before any ``exp`` keeps ratios finite (``exp(20) ~ 4.9e8``); the gradient
  is zero outside the clamp, as for any clipped value.
  """
  _check_positive("clamp", clamp)
  a = jnp.asarray(learner_logp).astype(jnp.float32)
  b = jnp.asarray(behaviour_logp).astype(jnp.float32)
  if a.shape != b.shape:
    raise ValueError(f"log-prob shapes differ: {a.shape} vs {b.shape}")
  return jnp.clip(a - b, -clamp, clamp)


def token_tis_weights(log_ratio: jax.Array, cap: float) -> jax.Array:
  """Token TIS: stop-gradient ``min(exp(log_ratio), cap)``, float32, same shape."""
  _check_positive("cap", cap)
  lr = jax.lax.stop_gradient(jnp.asarray(log_ratio).astype(jnp.float32))
  return jnp.minimum(jnp.exp(lr), cap)


def _sequence_sum(lr, mask):
  return jnp.sum(lr * mask, axis=-1, keepdims=True)


def sequence_tis_weights(log_ratio: jax.Array, mask: jax.Array, cap: float) -> jax.Array:
  """Sequence TIS: ``exp(min(sum_t mask*lr, log cap))`` broadcast to ``[B, T]``, stop-grad.

  The sequence ratio is the product of token ratios, so it is formed in log space
  (a product of many ratios near 1 still overflows if exponentiated first). A row with
  no masked tokens gets weight 1.
  """
  _check_positive("cap", cap)
  lr = jax.lax.stop_gradient(as_tokens(log_ratio, "log_ratio"))
  m = as_mask(mask, lr.shape)
  log_cap = jnp.log(jnp.asarray(cap, jnp.float32))
  s = jnp.minimum(_sequence_sum(lr, m), log_cap)
  return jnp.broadcast_to(jnp.exp(s), lr.shape)


def _band(ratio, lo, hi):
  return ((ratio >= lo) & (ratio <= hi)).astype(jnp.float32)


def masked_is_weights(log_ratio: jax.Array, mask: jax.Array, lo: float, hi: float,
                      level: str = "token") -> tuple[jax.Array, jax.Array]:
  """Masked IS: ``(weights, keep)``, both float32 ``[B, T]``, stop-gradient.

  level='token': ``keep_t = 1[lo <= rho_t <= hi]``, ``w_t = rho_t * keep_t``.
  level='sequence': ``rho_s = exp(mean over the row's masked tokens of lr)`` (the
  geometric-mean ratio, length-independent); the whole row is kept iff
  ``lo <= rho_s <= hi`` and every token's weight is ``rho_s * keep_s``. A row with no
  masked tokens has ``rho_s = 1``.
  """
  if level not in LEVELS:
    raise ValueError(f"unknown masked-IS level {level!r}; expected one of {LEVELS}")
  _check_bounds(lo, hi)
  lr = jax.lax.stop_gradient(as_tokens(log_ratio, "log_ratio"))
  m = as_mask(mask, lr.shape)
  if level == "token":
    ratio = jnp.exp(lr)
  else:
    n = jnp.maximum(jnp.sum(m, axis=-1, keepdims=True), 1.0)
    ratio = jnp.broadcast_to(jnp.exp(_sequence_sum(lr, m) / n), lr.shape)
  keep = _band(ratio, lo, hi)
  return ratio * keep, keep


def icepop_weights(log_ratio: jax.Array, lo: float = 0.5, hi: float = 5.0
                   ) -> tuple[jax.Array, jax.Array]:
  """IcePop ``M(rho; lo, hi)``: ``(weights, keep)``, float32, stop-gradient.

  ``w_t = rho_t`` where ``lo <= rho_t <= hi``; tokens outside the band get weight 0
  and (since the weight multiplies their whole policy term) no gradient.
  """
  _check_bounds(lo, hi)
  lr = jax.lax.stop_gradient(jnp.asarray(log_ratio).astype(jnp.float32))
  ratio = jnp.exp(lr)
  keep = _band(ratio, lo, hi)
  return ratio * keep, keep


@dataclasses.dataclass(frozen=True)
class NoCorrection:
  """No importance weight: ``w = 1`` for every token."""

  method: ClassVar[str] = "none"

  def weights(self, log_ratio: jax.Array, mask: jax.Array) -> ISWeights:
    """:class:`ISWeights` of ``[B, T]`` ``log_ratio`` and ``mask`` (all ones here)."""
    lr = as_tokens(log_ratio, "log_ratio")
    as_mask(mask, lr.shape)
    ones = jnp.ones_like(lr)
    return ISWeights(ones, ones, jnp.zeros_like(lr))


@dataclasses.dataclass(frozen=True)
class TokenTIS:
  """Token-level truncated IS, ``w_t = min(rho_t, cap)`` (Yao et al. 2025, C = 2)."""

  cap: float = 2.0
  method: ClassVar[str] = "token_tis"

  def __post_init__(self):
    _check_positive("cap", self.cap)

  def weights(self, log_ratio: jax.Array, mask: jax.Array) -> ISWeights:
    """:class:`ISWeights`; ``clipped`` marks the tokens whose ratio exceeded ``cap``."""
    lr = jax.lax.stop_gradient(as_tokens(log_ratio, "log_ratio"))
    as_mask(mask, lr.shape)
    hit = lr > jnp.log(jnp.asarray(self.cap, jnp.float32))
    return ISWeights(token_tis_weights(lr, self.cap), jnp.ones_like(lr),
                     hit.astype(jnp.float32))


@dataclasses.dataclass(frozen=True)
class SequenceTIS:
  """Sequence-level truncated IS, one weight per row (:func:`sequence_tis_weights`)."""

  cap: float = 2.0
  method: ClassVar[str] = "sequence_tis"

  def __post_init__(self):
    _check_positive("cap", self.cap)

  def weights(self, log_ratio: jax.Array, mask: jax.Array) -> ISWeights:
    """:class:`ISWeights`; ``clipped`` marks every token of a row whose ratio was capped."""
    lr = jax.lax.stop_gradient(as_tokens(log_ratio, "log_ratio"))
    m = as_mask(mask, lr.shape)
    hit = _sequence_sum(lr, m) > jnp.log(jnp.asarray(self.cap, jnp.float32))
    return ISWeights(sequence_tis_weights(lr, m, self.cap), jnp.ones_like(lr),
                     jnp.broadcast_to(hit, lr.shape).astype(jnp.float32))


@dataclasses.dataclass(frozen=True)
class MaskedIS:
  """Masked IS (Liu et al.): keep tokens (``level="token"``) or rows (``"sequence"``)
  whose ratio lies in ``[lo, hi]`` (:func:`masked_is_weights`)."""

  lo: float = 0.5
  hi: float = 2.0
  level: str = "token"
  method: ClassVar[str] = "masked_is"

  def __post_init__(self):
    if self.level not in LEVELS:
      raise ValueError(f"unknown masked-IS level {self.level!r}; expected one of {LEVELS}")
    _check_bounds(self.lo, self.hi)

  def weights(self, log_ratio: jax.Array, mask: jax.Array) -> ISWeights:
    """:class:`ISWeights`; ``keep`` is 0 on the rejected tokens."""
    lr = as_tokens(log_ratio, "log_ratio")
    w, keep = masked_is_weights(lr, mask, self.lo, self.hi, self.level)
    return ISWeights(w, keep, jnp.zeros_like(lr))


@dataclasses.dataclass(frozen=True)
class IcePop:
  """IcePop (Ring-1T): ``w_t = rho_t`` inside ``[lo, hi]``, dropped outside
  (:func:`icepop_weights`)."""

  lo: float = 0.5
  hi: float = 5.0
  method: ClassVar[str] = "icepop"

  def __post_init__(self):
    _check_bounds(self.lo, self.hi)

  def weights(self, log_ratio: jax.Array, mask: jax.Array) -> ISWeights:
    """:class:`ISWeights`; ``keep`` is 0 on the rejected tokens."""
    lr = as_tokens(log_ratio, "log_ratio")
    as_mask(mask, lr.shape)
    w, keep = icepop_weights(lr, self.lo, self.hi)
    return ISWeights(w, keep, jnp.zeros_like(lr))


Correction = NoCorrection | TokenTIS | SequenceTIS | MaskedIS | IcePop
_CORRECTIONS = {c.method: c for c in (NoCorrection, TokenTIS, SequenceTIS, MaskedIS, IcePop)}
CORRECTION_NAMES = tuple(c.__name__ for c in _CORRECTIONS.values())


def correction(method: str, *, cap: float = 2.0, lo: float = 0.5, hi: float = 2.0,
               level: str = "token") -> Correction:
  """The :data:`Correction` named ``method`` (one of ``METHODS``), built from the numbers
  it reads: ``cap`` (the TIS methods), ``lo``, ``hi`` (masked IS and IcePop) and
  ``level`` (masked IS); the others are not read. For resolving a configuration's
  method name and numbers once; code below that passes the object."""
  if method not in METHODS:
    raise ValueError(f"unknown IS method {method!r}; expected one of {METHODS}")
  cls = _CORRECTIONS[method]
  numbers = {"cap": cap, "lo": lo, "hi": hi, "level": level}
  return cls(**{f.name: numbers[f.name] for f in dataclasses.fields(cls)})


def importance_weights(method: str, log_ratio: jax.Array, mask: jax.Array, *,
                       cap: float = 2.0, lo: float = 0.5, hi: float = 2.0,
                       level: str = "token") -> ISWeights:
  """``correction(method, ...).weights(log_ratio, mask)``: :class:`ISWeights` (``[B, T]``
  float32 each) of one IS method named by a string.

  Args:
    method: one of ``METHODS`` (static): 'none' (w = 1), 'token_tis', 'sequence_tis'
      (use ``cap``), 'masked_is' (``lo``, ``hi``, ``level``), 'icepop' (``lo``, ``hi``).
    log_ratio: ``[B, T]`` clamped ``log pi - log mu`` (see :func:`log_ratio`).
    mask: ``[B, T]`` bool/float; only used by the sequence-level methods.
    cap: the TIS truncation C (> 0).
    lo, hi: the kept band of ratios for masked IS / IcePop (0 < lo <= hi).
    level: 'token' or 'sequence', masked IS only.
  """
  return correction(method, cap=cap, lo=lo, hi=hi, level=level).weights(log_ratio, mask)


def is_statistics(weights, mask: jax.Array) -> dict[str, jax.Array]:
  """Scalar float32 diagnostics of IS weights over the masked tokens.

  Args:
    weights: an :class:`ISWeights` (gives the clip/drop fractions too) or a ``[B, T]``
      weight array (then nothing counts as clipped or dropped).
    mask: ``[B, T]`` bool/float.

  Returns a dict with ``mean``, ``std`` (population), ``min``, ``max`` of the weights
  over masked tokens (dropped tokens count with weight 0), ``ess`` = normalised
  effective sample size ``(sum w)^2 / (n * sum w^2)`` in ``[0, 1]`` (1 = all equal),
  ``clipped_frac`` and ``dropped_frac`` (fractions of masked tokens with ``clipped``
  set / ``keep`` unset) and ``n_tokens``. With no masked tokens everything is 0.
  """
  if isinstance(weights, ISWeights):
    w, keep, clipped = weights
  else:
    w, keep, clipped = weights, None, None
  w = jax.lax.stop_gradient(as_tokens(w, "weights"))
  m = as_mask(mask, w.shape)
  keep = jnp.ones_like(w) if keep is None else as_tokens(keep, "keep", w.shape)
  clipped = jnp.zeros_like(w) if clipped is None else as_tokens(clipped, "clipped", w.shape)
  n = jnp.sum(m)
  safe_n = jnp.maximum(n, 1.0)
  any_tok = n > 0
  s1 = jnp.sum(w * m)
  s2 = jnp.sum(w * w * m)
  mean = s1 / safe_n
  var = jnp.maximum(s2 / safe_n - mean * mean, 0.0)
  big = jnp.finfo(jnp.float32).max
  wmin = jnp.where(any_tok, jnp.min(jnp.where(m > 0, w, big)), 0.0)
  wmax = jnp.where(any_tok, jnp.max(jnp.where(m > 0, w, -big)), 0.0)
  ess = jnp.where(s2 > 0, s1 * s1 / (safe_n * jnp.where(s2 > 0, s2, 1.0)), 0.0)
  return {
      "mean": mean,
      "std": jnp.sqrt(var),
      "min": wmin,
      "max": wmax,
      "ess": ess,
      "clipped_frac": jnp.sum(clipped * m) / safe_n,
      "dropped_frac": jnp.sum((1.0 - keep) * m) / safe_n,
      "n_tokens": n,
  }
