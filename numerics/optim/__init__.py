"""optax GradientTransformations for optimizer experiments (jax/optax/numpy only).

    muon(lr, ...)                       Newton-Schulz orthogonalised momentum (+ fallback)
    sam(inner, rho)                     two-pass SAM; update(..., grad_fn=...)
    handoff(first, second, switch_step, transfer="momentum")
    warm_restarts_schedule / cosine_schedule
    deoscillate(Q, period, ratio, start_step)   ALTO weight de-oscillation (post-step)
    quantized_adamw(lr, ..., state_format="dynamic8")   Adam(W) with quantized moments
    state_format(name, ...) / MomentCodec / StateFormat  how the moments are stored
    bf16_master_weights(rounding=Stochastic() | Kahan() | Nearest())    last in a chain
"""

from lowprec.numerics.optim.deoscillation import DeoscillationState, deoscillate
from lowprec.numerics.optim.master_weights import (Kahan, MasterWeightsState,
                                                   bf16_master_weights)
from lowprec.numerics.optim.moment_codecs import (EncodedMoment, MomentCodec, StateFormat,
                                          state_format, state_format_names)
from lowprec.numerics.optim.quantized_adam import (QuantizedAdamState, decoded_moments,
                                           quantized_adamw, scale_by_quantized_adam)
from lowprec.numerics.optim.handoff import (HandoffState, handoff, in_second_phase,
                                    momentum_transfer, no_transfer)
from lowprec.numerics.optim.muon import (MuonState, all_matrices_labels, default_param_labels, muon,
                                 newton_schulz, scale_by_muon, shape_scale)
from lowprec.numerics.optim.sam import SAMState, perturbation, sam
from lowprec.numerics.optim.schedules import cosine_schedule, cycle_lengths, warm_restarts_schedule

__all__ = [
    "DeoscillationState", "deoscillate", "HandoffState", "MuonState", "SAMState", "all_matrices_labels", "cosine_schedule",
    "cycle_lengths", "default_param_labels", "handoff", "in_second_phase",
    "momentum_transfer", "muon", "newton_schulz", "no_transfer", "perturbation", "sam",
    "scale_by_muon", "shape_scale", "warm_restarts_schedule",
    "EncodedMoment", "Kahan", "MasterWeightsState", "MomentCodec", "QuantizedAdamState",
    "StateFormat", "bf16_master_weights", "decoded_moments", "quantized_adamw",
    "scale_by_quantized_adam", "state_format", "state_format_names",
]
