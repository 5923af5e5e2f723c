"""Benchmarks of the library, as ratios measured in one run (scripts, not tests).

    python -m experiments.benchmarks.numerics_throughput   # cast / quantize vs a copy
    python -m experiments.benchmarks.qtrain_step           # a train step per recipe vs bf16
    python -m experiments.benchmarks.step_compile          # the step compiled for H200/B200/TPU
"""
