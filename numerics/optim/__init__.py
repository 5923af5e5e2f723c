"""optax GradientTransformations for optimizer experiments (jax/optax/numpy only).

    muon(lr, ...)                       Newton-Schulz orthogonalised momentum (+ fallback)
    sam(inner, rho)                     two-pass SAM; update(..., grad_fn=...)
    handoff(first, second, switch_step, transfer="momentum")
    warm_restarts_schedule / cosine_schedule
    deoscillate(Q, period, ratio, start_step)   ALTO weight de-oscillation (post-step)
"""

from numerics.optim.deoscillation import DeoscillationState, deoscillate
from numerics.optim.handoff import (HandoffState, handoff, in_second_phase,
                                    momentum_transfer, no_transfer)
from numerics.optim.muon import (MuonState, all_matrices_labels, default_param_labels, muon,
                                 newton_schulz, scale_by_muon, shape_scale)
from numerics.optim.sam import SAMState, perturbation, sam
from numerics.optim.schedules import cosine_schedule, cycle_lengths, warm_restarts_schedule

__all__ = [
    "DeoscillationState", "deoscillate", "HandoffState", "MuonState", "SAMState", "all_matrices_labels", "cosine_schedule",
    "cycle_lengths", "default_param_labels", "handoff", "in_second_phase",
    "momentum_transfer", "muon", "newton_schulz", "no_transfer", "perturbation", "sam",
    "scale_by_muon", "shape_scale", "warm_restarts_schedule",
]
