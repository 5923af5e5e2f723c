"""MXFP8 RL in miniature: learner and sampler each in a recipe, with weight-sync
checks at every sync.

    python -m experiments.mxfp8_rl [--learner_recipe=bf16 --sampler_recipe=mxfp8]

This folder holds everything about the paper: ``experiment.py`` (the training script,
run as ``python -m experiments.mxfp8_rl``), ``sweeps.py`` (its sweep declarations),
``appendix.py`` (the report tables and plots computed from a sweep's data), ``report/``
(the committed evidence: REPORT.md, FINDINGS.md, plots, manifest, results and each
run's TensorBoard events).
"""
