"""Pan, "Cool the Sampler, Not the Learner", in miniature: GRPO with a sampler that
lags the learner by up to K updates, importance correction and decoupled cooling.

    python -m experiments.stale_sampler [--refresh_interval=32 --sampler_temperature=0.8]

This folder holds everything about the paper: ``experiment.py`` (the training script,
run as ``python -m experiments.stale_sampler``), ``sweeps.py`` (its sweep declarations),
``appendix.py`` (the report tables and plots computed from a sweep's data), ``report/``
(the committed evidence: REPORT.md, FINDINGS.md, plots, manifest, results and each
run's TensorBoard events).
"""
