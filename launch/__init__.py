"""Sweeps (base config x arms x seeds) -> manifests -> local / SLURM / multi-process runs,
and the report over a sweep's results (``python -m launch.sweep``, ``python -m launch.report``).
"""
