"""MXFP4 in the backward pass (Tseng et al., arXiv 2502.20586; arXiv 2605.09825) in
miniature: stochastic rounding x random / deterministic Hadamard transforms on the
backward GEMMs of the char LM.

    python -m experiments.mxfp4_backward --backward=mxfp4 --stochastic_rounding --hadamard=random

``experiment.py`` (the training script), ``sweeps.py`` (its sweep declarations),
``report/`` (the committed evidence).
"""
