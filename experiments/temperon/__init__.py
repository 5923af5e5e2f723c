"""Temperon in miniature: an SGD explorer with warm restarts handed off to a SAM-Muon
refiner, on a small ResNet.

    python -m experiments.temperon [--explorer=sgd_sam --refiner=none]

This folder holds everything about the paper: ``experiment.py`` (the training script,
run as ``python -m experiments.temperon``), ``sweeps.py`` (its sweep declarations),
``appendix.py`` (the report tables and plots computed from a sweep's data), ``report/``
(the committed evidence: REPORT.md, FINDINGS.md, plots, manifest, results and each
run's TensorBoard events).
"""
