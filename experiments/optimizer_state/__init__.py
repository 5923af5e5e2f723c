"""MoE optimizer-state memory (arXiv 2607.19058, abstract only) in miniature: AdamW
with its moments stored in 8-bit, 4-bit, FP8 or MX formats on a small MoE LM and its
dense control.

    python -m experiments.optimizer_state [--moment_format=dynamic8 --num_experts=0]

This folder holds everything about the paper: ``experiment.py`` (the training script,
run as ``python -m experiments.optimizer_state``), ``sweeps.py`` (its sweep
declarations), ``appendix.py`` (the report tables computed from a sweep's data),
``report/`` (the committed evidence: REPORT.md, FINDINGS.md, plots, manifest, results
and each run's TensorBoard events).
"""
