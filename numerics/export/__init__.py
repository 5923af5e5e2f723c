"""Exporting float32 master weights to a served copy, and measuring the copy.

* :mod:`numerics.export.served_copy`: :class:`ExportSpec`, :func:`export` (nearest,
  stochastic or error-feedback rounding; the error-feedback residual lives in the
  checkpointable :class:`ExportState`), :func:`make_export` (stateless nearest).
* :mod:`numerics.export.straight_through`: :func:`straight_through`, the loss on the
  served copy with the identity gradient to the master.
* :mod:`numerics.export.metrics`: :func:`unchanged_fraction`, :func:`ulp_distance`,
  :func:`relative_drift`.
* :mod:`numerics.export.lag`: the per-element lag tracker (:func:`init_lag_state`,
  :func:`update_lag`).

Leaves: every floating leaf of the master must be float32 (TypeError otherwise);
non-floating leaves pass through. Metrics are keyed by each floating leaf's
'/'-joined pytree path plus ``"global"``.
"""

from lowprec.numerics.export._leaves import GLOBAL
from lowprec.numerics.export.lag import LagState, init_lag_state, update_lag
from lowprec.numerics.export.metrics import relative_drift, ulp_distance, unchanged_fraction
from lowprec.numerics.export.served_copy import (EXPORT_ROUNDINGS, ErrorFeedback, Export,
                                                 ExportSpec, ExportState, export,
                                                 init_export_state, make_export,
                                                 parse_rounding)
from lowprec.numerics.export.straight_through import straight_through

__all__ = [
    "EXPORT_ROUNDINGS", "ErrorFeedback", "Export", "ExportSpec", "ExportState", "GLOBAL",
    "LagState", "export", "init_export_state", "init_lag_state", "make_export",
    "parse_rounding", "relative_drift",
    "straight_through", "ulp_distance", "unchanged_fraction", "update_lag",
]
