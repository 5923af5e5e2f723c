"""Optimizer-state memory in miniature: AdamW with its moments stored in low precision.

    python -m experiments.optimizer_state                          # MoE LM, fp32 moments
    python -m experiments.optimizer_state --moment_format=dynamic8  # bitsandbytes 8-bit
    python -m experiments.optimizer_state --moment_format=dynamic4 --sqrt_nu
    python -m experiments.optimizer_state --num_experts=0          # the dense LM

The model is ALTO's small mixture-of-experts char-LM on Shakespeare
(:class:`experiments.common.trainers.moe_lm.MoELMConfig`; ``--num_experts=0`` makes
every feed-forward dense), trained in bf16 (the projections' and expert GEMMs' recipe) with the LM's
AdamW schedule, except that AdamW is
:func:`numerics.optim.quantized_adam.quantized_adamw`: both moments are stored in
``moment_format`` between steps (:func:`numerics.optim.moment_codecs.state_format`:
``fp32`` is bit for bit ``optax.adamw``; ``bf16``; ``dynamic8`` and ``linear8``
blockwise 8-bit; ``dynamic4``, ``nf4``, ``e2m1`` 4-bit; ``fp8_e4m3``, ``fp8_e5m2``;
the MX formats), rounded to nearest or stochastically, the second moment optionally
stored as its square root (``sqrt_nu``). Leaves under ``min_quantized_size`` elements
keep float32 moments (the 4096 threshold of bitsandbytes and torchao).

Besides the LM's metrics, every logged step records what the state costs and how the
stored second moment behaves (``train/optim/...``, measured from the state pytree):

* ``state_bytes_per_param``: bytes of the whole optimizer state (codes, block scales,
  counters, the float32 moments of small leaves) per model parameter;
* ``nu_zero_frac``: the fraction of quantized-leaf elements whose stored second moment
  decodes to exactly 0 while the first moment does not (the 4-bit second moment's
  zero-point failure: the next update there is ``m / eps``);
* ``max_update_ratio``: ``max |m| / (sqrt(v) + eps)`` over all elements of the stored
  moments (before bias correction): the largest update the stored state asks for;
* ``state_bytes``, ``param_bytes``: the state's and the float32 parameters' bytes.

Training, logging, checkpointing and resume are
:func:`experiments.common.trainers.lm_trainer.train_and_evaluate`'s.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.common.harness.config_flags import config_field
from experiments.common.harness.run_options import RunOptions
from experiments.common.trainers import lm_trainer
from experiments.common.trainers import moe_lm
from lowprec.numerics import memory
from lowprec.numerics.optim import moment_codecs
from lowprec.numerics.optim.quantized_adam import (QuantizedAdamState, decoded_moments,
                                           quantized_adamw)
from lowprec.numerics import rounding as rounding_lib

EXPERIMENT = "optimizer_state"
ROUNDINGS = moment_codecs.ROUNDINGS
# Stochastic rounding of the moments draws from PRNGKey(seed + this): a stream apart
# from the init / data / step keys of PRNGKey(seed).
_MOMENT_KEY_OFFSET = 0x0AD4


@dataclasses.dataclass(frozen=True)
class OptimizerStateConfig(moe_lm.MoELMConfig):
  """An MoE LM run (ALTO's model) whose AdamW moments are stored in ``moment_format``."""

  recipe: str = config_field(
      "bf16", "Recipe of the projections and expert GEMMs (bf16: the unquantized "
      "MoE baseline; the study varies the optimizer state, not the GEMMs).")
  moment_format: str = config_field(
      "fp32", "Storage of both AdamW moments between steps: "
      + ", ".join(moment_codecs.state_format_names()) + ".",
      choices=moment_codecs.state_format_names())
  moment_rounding: str = config_field(
      "nearest", "Rounding of the stored moments (stochastic: keyed by step and leaf).",
      choices=ROUNDINGS)
  sqrt_nu: bool = config_field(
      False, "Store the second moment as sqrt(v) (the same codec; squares on decoding).")
  moment_block_size: int = config_field(
      0, "Block size of the moment codecs (0: the format's default).", domain="[0, inf)")
  min_quantized_size: int = config_field(
      4096, "Leaves with fewer elements keep float32 moments.", domain="[0, inf)")

  def __post_init__(self):
    super().__post_init__()
    self.state_format()  # an inconsistent format / rounding / block combination fails here

  def state_format(self) -> moment_codecs.StateFormat:
    """The :class:`~numerics.optim.moment_codecs.StateFormat` of the moments."""
    if self.moment_format == "fp32" and (self.moment_rounding != "nearest" or self.sqrt_nu
                                         or self.moment_block_size):
      raise ValueError("moment_format 'fp32' is lossless: moment_rounding, sqrt_nu and "
                       "moment_block_size would be ignored")
    return moment_codecs.state_format(
        self.moment_format, block_size=self.moment_block_size or None,
        rounding=rounding_lib.parse(self.moment_rounding), sqrt_nu=self.sqrt_nu,
        min_size=self.min_quantized_size)

  def optimizer(self) -> optax.GradientTransformation:
    fmt = self.state_format()
    key = self.seed + _MOMENT_KEY_OFFSET if fmt.is_stochastic else None
    adamw = functools.partial(quantized_adamw, state_format=fmt, key=key)
    return lm_trainer.make_optimizer(self, adamw)

  def optimizer_metrics(self, opt_state: Any) -> dict[str, jax.Array]:
    return state_metrics(opt_state)


def _adam_state(opt_state: Any) -> QuantizedAdamState:
  states = [s for s in jax.tree.leaves(
      opt_state, is_leaf=lambda x: isinstance(x, QuantizedAdamState))
            if isinstance(s, QuantizedAdamState)]
  if len(states) != 1:
    raise ValueError(f"expected one QuantizedAdamState in the optimizer state, found "
                     f"{len(states)}")
  return states[0]


def state_metrics(opt_state: Any) -> dict[str, jax.Array]:
  """The optimizer state's cost and its stored second moment's health (module doc).

  Works on concrete or traced states: byte counts come from leaf shapes and dtypes.
  """
  adam = _adam_state(opt_state)
  encoded_mu = jax.tree.leaves(adam.mu, is_leaf=lambda x: isinstance(
      x, moment_codecs.EncodedMoment))
  n_params = sum(int(np.prod(e.shape, dtype=np.int64)) for e in encoded_mu)
  state_bytes = memory.tree_bytes(opt_state)
  mu, nu = decoded_moments(adam)
  quantized = [e.codec.kind != "identity" for e in encoded_mu]
  zero = [jnp.sum((v == 0) & (m != 0)) for m, v, q in
          zip(jax.tree.leaves(mu), jax.tree.leaves(nu), quantized) if q]
  n_quantized = sum(int(np.prod(e.shape, dtype=np.int64))
                    for e, q in zip(encoded_mu, quantized) if q)
  eps = 1e-8  # quantized_adamw's default, which make_optimizer keeps
  ratio = jnp.max(jnp.stack([jnp.max(jnp.abs(m) / (jnp.sqrt(v) + eps))
                             for m, v in zip(jax.tree.leaves(mu), jax.tree.leaves(nu))]))
  return {
      "optim/state_bytes_per_param": jnp.float32(state_bytes / n_params),
      "optim/state_bytes": jnp.float32(state_bytes),
      "optim/param_bytes": jnp.float32(4 * n_params),
      "optim/nu_zero_frac": (sum(zero) / n_quantized if n_quantized
                             else jnp.float32(0)).astype(jnp.float32),
      "optim/max_update_ratio": ratio,
  }


def train_and_evaluate(config: OptimizerStateConfig, options: RunOptions) -> dict[str, Any]:
  """Trains and evaluates one run; returns its summary (see
  experiments.common.trainers.lm_trainer)."""
  return lm_trainer.train_and_evaluate(config, options, experiment=EXPERIMENT)
