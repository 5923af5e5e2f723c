"""The main job: a char-level transformer LM on the shipped Shakespeare corpus, with a
numerics recipe per run.

    python -m experiments.lm [--recipe=mxfp8]

This folder holds everything about the paper: ``experiment.py`` (the training script,
run as ``python -m experiments.lm``), ``sweeps.py`` (its sweep declarations),
``report/``
(the committed evidence: REPORT.md, FINDINGS.md, plots, manifest, results and each
run's TensorBoard events).
"""
