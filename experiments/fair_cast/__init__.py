"""Fair Cast in miniature: float32 masters served to an RL sampler as bf16, exported
with nearest, stochastic or error-feedback rounding.

    python -m experiments.fair_cast [--export_rounding=stochastic]

This folder holds everything about the paper: ``experiment.py`` (the training script,
run as ``python -m experiments.fair_cast``), ``sweeps.py`` (its sweep declarations),
``appendix.py`` (the report tables and plots computed from a sweep's data), ``report/``
(the committed evidence: REPORT.md, FINDINGS.md, plots, manifest, results and each
run's TensorBoard events).
"""
