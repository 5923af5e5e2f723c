"""ALTO (AMD, MXFP4 training of an MoE LM) in miniature: the recipe ladder, the
negative-result options and de-oscillation on a small MoE char-LM.

    python -m experiments.alto [--recipe=mxfp4 --deoscillation]

This folder holds everything about the paper: ``experiment.py`` (the training script,
run as ``python -m experiments.alto``), ``sweeps.py`` (its sweep declarations),
``appendix.py`` (the report tables and plots computed from a sweep's data), ``report/``
(the committed evidence: REPORT.md, FINDINGS.md, plots, manifest, results and each
run's TensorBoard events).
"""
