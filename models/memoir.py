"""Memoir in miniature: should a model write to its memory while it thinks?

Only the abstract of Memoir (Jaber & Jaber, arXiv:2607.20792) is known, so this design
is ours, assembled from the prior work the abstract names. What comes from where:

From the paper's abstract [PAPER]:
  * shared slow parameters + a per-sample fast memory + a variable-depth latent
    recurrence ("pondering") + a future-latent energy objective;
  * two arms: **coupled** (each pondering iteration may rewrite the fast memory that
    the same iteration reads) and **read-only** (the memory is fixed while pondering),
    matched in parameters, forward multiply-accumulates, data, optimizer, schedule, seeds;
  * procedural associative recall with key interference; about 80k parameters;
  * the energy margin as the diagnostic of the energy signal.

From prior work [PRIOR]:
  * the fast memory is a delta-rule fast-weight matrix (Schlag et al. 2021):
    ``S <- S + beta (v - S phi(k)) phi(k)^T``, read ``S phi(q)``;
  * halting is PonderNet's (Banino et al. 2021): ``p_n = lambda_n prod_{j<n}(1 - lambda_j)``
    with the last step taking the remainder, the loss is ``sum_n p_n CE_n`` plus
    ``kl_weight * KL(p || truncated Geometric(prior_lambda))``;
  * the energy is JEPA-style: ``E = mean((ln g(ln h_n) - sg(ln h_{n+1}))^2)``, trained with a
    hinge of margin ``m`` against a negative (another sample's future latent).

Our choices [OURS] (none of these is known to match the paper):
  * ``phi`` is L2 normalisation of a linear projection (keeps the delta rule a
    contraction when ``beta`` is in (0, 1));
  * the sample's stream is written first (chunked delta rule, :mod:`models.delta_rule`),
    memory starts at zero; the query's latent is ``h_0 = W_q q``;
  * pondering iteration ``n`` (``n = 1..N``), with the same slow parameters each time::

        k_w, v_w, b_w = phi(W_wk h_{n-1}), W_wv h_{n-1}, sigmoid(w_b h_{n-1})
        coupled:   S_n = write(S_{n-1}; k_w, v_w, b_w)      shadow unused
        read-only: S_n = S_0;  shadow_n = write(shadow_{n-1}; k_w, v_w, b_w)
        r_n = S_n phi(W_r h_{n-1})
        h_n = h_{n-1} + W_2 gelu(W_1 ln([h_{n-1}, r_n]))
        logits_n = W_o ln(h_n),  lambda_n = sigmoid(w_h h_n)

    so the read-only arm computes exactly the same write (into a shadow copy whose
    drift is logged, which also keeps it live under XLA) and the two arms have identical
    parameter trees and identical forward multiply-accumulates (:func:`forward_macs`).
    The shadow is never read, so in the read-only arm the write heads get zero
    gradient: it trains fewer live parameters;
  * ``no_write`` is the control for that: no write heads and no shadow, with the core
    widened (:func:`matched_hidden`) so its live parameters match the coupled arm's
    (its forward MACs are lower: :func:`forward_macs`);
  * the energy is taken between consecutive pondering latents (``h_n -> h_{n+1}``,
    ``n = 0..N-1``), ``ln`` is a parameter-free layer norm, the negative is the batch
    rolled by one; prediction is ``argmax sum_n p_n softmax(logits_n)``;
  * ``halting="fixed"`` puts all halting mass on step ``N`` (fixed depth).

Shapes: keys ``[B, K, key_dim]`` float32, values ``[B, K]`` int32, query ``[B, key_dim]``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lowprec.models import delta_rule

MODES = ("coupled", "read_only", "no_write")
HALTINGS = ("ponder", "fixed")


@dataclasses.dataclass(frozen=True)
class MemoirConfig:
  """Model sizes and objective weights (the defaults give 79,603 parameters)."""

  key_dim: int = 32
  num_values: int = 16
  d_latent: int = 64
  d_mem: int = 32
  d_hidden: int = 320
  d_pred: int = 128
  max_steps: int = 4
  mode: str = "read_only"
  halting: str = "ponder"
  prior_lambda: float = 0.3
  kl_weight: float = 0.01
  energy_weight: float = 0.1
  energy_margin: float = 1.0
  chunk: int = 16

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
    if self.halting not in HALTINGS:
      raise ValueError(f"halting must be one of {HALTINGS}, got {self.halting!r}")
    for name in ("key_dim", "num_values", "d_latent", "d_mem", "d_hidden", "d_pred",
                 "max_steps", "chunk"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
    if not 0.0 < self.prior_lambda < 1.0:
      raise ValueError(f"prior_lambda must be in (0, 1), got {self.prior_lambda}")
    for name in ("kl_weight", "energy_weight", "energy_margin"):
      if getattr(self, name) < 0.0:
        raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


# ----------------------------------------------------------------------------- pure parts


def l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
  """``x / ||x||`` over the last axis (the feature map phi of keys and queries)."""
  return x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def halting_distribution(lambdas: jax.Array) -> jax.Array:
  """PonderNet halting: ``lambdas [N, B]`` in (0, 1) -> probabilities ``p [N, B]``.

  ``p_n = lambda_n prod_{j<n} (1 - lambda_j)``; the last step takes the remaining mass, so
  each column sums to 1 whatever ``lambdas[-1]`` is.
  """
  if lambdas.ndim != 2:
    raise ValueError(f"lambdas must be [N, B], got {lambdas.shape}")
  survive = jnp.cumprod(1.0 - lambdas, axis=0)
  before = jnp.concatenate([jnp.ones_like(survive[:1]), survive[:-1]], axis=0)
  p = lambdas * before
  return p.at[-1].set(before[-1])


def geometric_prior(num_steps: int, prior_lambda: float) -> jax.Array:
  """Geometric(prior_lambda) truncated to ``num_steps`` (remainder on the last) ``[N]``."""
  lam = jnp.full((num_steps, 1), prior_lambda, jnp.float32)
  return halting_distribution(lam)[:, 0]


def halting_kl(p: jax.Array, prior: jax.Array, eps: float = 1e-8) -> jax.Array:
  """Mean over the batch of ``KL(p || prior)``; p ``[N, B]``, prior ``[N]`` -> scalar."""
  return jnp.mean(jnp.sum(p * (jnp.log(p + eps) - jnp.log(prior[:, None] + eps)), axis=0))


def _layer_norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
  mu = jnp.mean(x, axis=-1, keepdims=True)
  return (x - mu) * jax.lax.rsqrt(jnp.var(x, axis=-1, keepdims=True) + eps)


def energy_terms(prediction: jax.Array, future: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Positive and negative energies ``[N, B]`` of predictions ``[N, B, D]`` of ``future``.

  Both are layer-normalised here and ``future`` is stop-gradiented; the negative of sample ``b`` is
  sample ``b + 1``'s future (the batch rolled by one), so ``B`` must be >= 2.
  """
  if prediction.shape != future.shape or prediction.ndim != 3:
    raise ValueError(f"prediction and future must be equal [N, B, D], got "
                     f"{prediction.shape}, {future.shape}")
  if prediction.shape[1] < 2:
    raise ValueError("energy negatives need a batch of at least 2")
  # Both sides are layer-normalised so an energy cannot be lowered (or the margin met)
  # by scaling: E is 2 - 2 cos for centred vectors, in [0, 4].
  prediction = _layer_norm(prediction)
  target = jax.lax.stop_gradient(_layer_norm(future))
  e_pos = jnp.mean((prediction - target) ** 2, axis=-1)
  e_neg = jnp.mean((prediction - jnp.roll(target, 1, axis=1)) ** 2, axis=-1)
  return e_pos, e_neg


def energy_hinge(e_pos: jax.Array, e_neg: jax.Array, margin: float) -> jax.Array:
  """``mean(max(0, margin + E_pos - E_neg))``: push positives ``margin`` below negatives."""
  return jnp.mean(jax.nn.relu(margin + e_pos - e_neg))


def forward_macs(config: MemoirConfig, num_pairs: int) -> int:
  """Declared forward multiply-accumulates per sample (matmuls and memory ops).

  Counts every dense layer, each delta-rule write (``2 d_mem^2``) and read (``d_mem^2``);
  elementwise ops, norms and the softmax are not counted. Coupled and read-only count
  the same (the read-only arm performs the same write into its shadow memory);
  ``no_write`` has no write heads and no write.
  """
  if num_pairs < 1:
    raise ValueError(f"num_pairs must be >= 1, got {num_pairs}")
  c = config
  stream = num_pairs * (c.key_dim * c.d_mem + c.d_mem) \
      + delta_rule.delta_rule_macs(num_pairs, c.d_mem, c.d_mem, with_reads=False)
  query_in = c.key_dim * c.d_latent
  write = 2 * c.d_latent * c.d_mem + c.d_latent + 2 * c.d_mem * c.d_mem  # heads + write
  per_step = (write * (c.mode != "no_write")
              + c.d_latent * c.d_mem + c.d_mem * c.d_mem      # read key, read
              + (c.d_latent + c.d_mem) * c.d_hidden + c.d_hidden * c.d_latent   # core
              + c.d_latent + c.d_latent * c.num_values        # halt, output
              + c.d_latent * c.d_pred + c.d_pred * c.d_latent)  # energy predictor
  return stream + query_in + c.max_steps * per_step


def write_head_params(config: MemoirConfig) -> int:
  """Parameters of the pondering write heads (key, value, beta; weights and biases)."""
  c = config
  return 2 * (c.d_latent * c.d_mem + c.d_mem) + c.d_latent + 1


def matched_hidden(config: MemoirConfig) -> int:
  """The ``d_hidden`` at which ``no_write`` has (nearest) as many parameters as the
  model with write heads: each hidden unit of the core holds ``d_latent + d_mem``
  input weights, a bias and ``d_latent`` output weights."""
  per_unit = 2 * config.d_latent + config.d_mem + 1
  return config.d_hidden + int(round(write_head_params(config) / per_unit))


# ----------------------------------------------------------------------------- module


class Memoir(nn.Module):
  """The Memoir model; ``__call__`` returns a dict of per-step outputs (see below)."""

  config: MemoirConfig

  @nn.compact
  def __call__(self, keys: jax.Array, values: jax.Array, query: jax.Array
               ) -> dict[str, jax.Array]:
    """Writes the stream, ponders on the query.

    Returns ``logits [N, B, V]``, ``halt_p [N, B]``, ``e_pos``/``e_neg [N, B]`` and
    ``drift [B]`` (relative change of the memory the pondering writes: the real one in
    coupled mode, the shadow in read-only mode, zero in no-write mode).
    """
    c = self.config
    if keys.ndim != 3 or keys.shape[2] != c.key_dim:
      raise ValueError(f"keys must be [B, K, {c.key_dim}], got {keys.shape}")
    b, k = keys.shape[:2]
    if values.shape != (b, k):
      raise ValueError(f"values must be [{b}, {k}], got {values.shape}")
    if query.shape != (b, c.key_dim):
      raise ValueError(f"query must be [{b}, {c.key_dim}], got {query.shape}")

    key_proj = nn.Dense(c.d_mem, name="stream_key")(keys)
    phi_k = l2_normalize(key_proj)
    beta = jax.nn.sigmoid(nn.Dense(1, name="stream_beta")(key_proj)[..., 0])
    v = nn.Embed(c.num_values, c.d_mem, name="value_embed")(values)
    s0 = jnp.zeros((b, c.d_mem, c.d_mem), keys.dtype)
    _, memory = delta_rule.delta_rule_chunked(phi_k, phi_k, v, beta, s0, chunk=c.chunk)

    if c.mode != "no_write":
      write_key = nn.Dense(c.d_mem, name="write_key")
      write_value = nn.Dense(c.d_mem, name="write_value")
      write_beta = nn.Dense(1, name="write_beta")
    read_key = nn.Dense(c.d_mem, name="read_key")
    core_norm = nn.LayerNorm(name="core_norm")
    core_in = nn.Dense(c.d_hidden, name="core_in")
    core_out = nn.Dense(c.d_latent, name="core_out")
    halt = nn.Dense(1, name="halt")
    out_norm = nn.LayerNorm(name="out_norm")
    out = nn.Dense(c.num_values, name="out")
    pred_in = nn.Dense(c.d_pred, name="pred_in")
    pred_out = nn.Dense(c.d_latent, name="pred_out")

    h = nn.Dense(c.d_latent, name="query_in")(query)
    read_mem, shadow = memory, memory
    latents, logits, lambdas = [h], [], []
    for _ in range(c.max_steps):
      if c.mode != "no_write":
        wk = l2_normalize(write_key(h))
        wv = write_value(h)
        wb = jax.nn.sigmoid(write_beta(h)[:, 0])
        if c.mode == "coupled":
          read_mem = delta_rule.delta_write(read_mem, wk, wv, wb)
        else:
          shadow = delta_rule.delta_write(shadow, wk, wv, wb)
      r = delta_rule.delta_read(read_mem, l2_normalize(read_key(h)))
      h = h + core_out(nn.gelu(core_in(core_norm(jnp.concatenate([h, r], axis=-1)))))
      latents.append(h)
      logits.append(out(out_norm(h)))
      lambdas.append(jax.nn.sigmoid(halt(h)[:, 0]))

    lam = jnp.stack(lambdas)
    if c.halting == "fixed":
      halt_p = jnp.zeros_like(lam).at[-1].set(1.0)
    else:
      halt_p = halting_distribution(lam)
    stacked = jnp.stack(latents)  # [N + 1, B, D]
    prediction = pred_out(nn.gelu(pred_in(_layer_norm(stacked[:-1]))))
    e_pos, e_neg = energy_terms(prediction, stacked[1:])
    written = read_mem if c.mode == "coupled" else shadow
    drift = jnp.sqrt(jnp.sum((written - memory) ** 2, axis=(1, 2))
                     / (jnp.sum(memory ** 2, axis=(1, 2)) + 1e-6))
    return {"logits": jnp.stack(logits), "halt_p": halt_p, "e_pos": e_pos, "e_neg": e_neg,
            "drift": drift}


def memoir_loss(config: MemoirConfig, outputs: dict[str, jax.Array], target: jax.Array
                ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The training objective and its parts.

  ``loss = sum_n p_n CE(logits_n, target) + kl_weight KL(p || prior)
  + energy_weight hinge(E_pos, E_neg)`` (the KL is dropped for fixed halting).
  ``target`` int32 ``[B]``. Metrics: ``ce``, ``kl``, ``energy_loss``, ``energy_margin``
  (mean ``E_neg - E_pos``), ``e_pos``, ``e_neg``, ``recall``, ``expected_depth``,
  ``memory_drift``.
  """
  logits, p = outputs["logits"], outputs["halt_p"]
  if target.shape != logits.shape[1:2]:
    raise ValueError(f"target must be [{logits.shape[1]}], got {target.shape}")
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  ce_n = -jnp.take_along_axis(log_probs, target[None, :, None], axis=-1)[..., 0]  # [N, B]
  ce = jnp.mean(jnp.sum(p * ce_n, axis=0))
  if config.halting == "ponder":
    kl = halting_kl(p, geometric_prior(config.max_steps, config.prior_lambda))
  else:
    kl = jnp.zeros(())
  energy = energy_hinge(outputs["e_pos"], outputs["e_neg"], config.energy_margin)
  loss = ce + config.kl_weight * kl + config.energy_weight * energy
  mixture = jnp.sum(p[..., None] * jnp.exp(log_probs), axis=0)
  steps = jnp.arange(1, p.shape[0] + 1, dtype=p.dtype)[:, None]
  metrics = {
      "ce": ce, "kl": kl, "energy_loss": energy,
      "energy_margin": jnp.mean(outputs["e_neg"] - outputs["e_pos"]),
      "e_pos": jnp.mean(outputs["e_pos"]), "e_neg": jnp.mean(outputs["e_neg"]),
      "recall": jnp.mean((jnp.argmax(mixture, axis=-1) == target).astype(jnp.float32)),
      "expected_depth": jnp.mean(jnp.sum(p * steps, axis=0)),
      "memory_drift": jnp.mean(outputs["drift"]),
  }
  return loss, metrics


def count_params(params: Any) -> int:
  """Number of scalars in a parameter pytree."""
  return int(sum(x.size for x in jax.tree.leaves(params)))
