"""Memoir in miniature: coupled vs read-only latent pondering over a fast memory, on
associative recall with key interference.

    python -m experiments.memoir [--mode=coupled]

This folder holds everything about the paper: ``experiment.py`` (the training script,
run as ``python -m experiments.memoir``), ``sweeps.py`` (its sweep declarations),
``appendix.py`` (the report tables and plots computed from a sweep's data), ``report/``
(the committed evidence: REPORT.md, FINDINGS.md, plots, manifest, results and each
run's TensorBoard events).
"""
