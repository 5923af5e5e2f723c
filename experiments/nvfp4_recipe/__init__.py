"""NVIDIA's NVFP4 pretraining recipe (arXiv 2509.25149) in miniature: the full recipe
against each component removed, and the same recipe in MXFP4, on the dense char LM.

    python -m experiments.nvfp4_recipe [--fmt=nvfp4 --grad_sr=false ...]

This folder holds everything about the paper: ``experiment.py`` (the training script,
run as ``python -m experiments.nvfp4_recipe``), ``sweeps.py`` (its sweep declaration,
claims and sequential plan, declared before any evaluation run) and, once the sweep has
run, ``report/`` (the committed evidence).
"""
