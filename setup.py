"""Installs the library as ``lowprec`` (``lowprec.numerics``, ``lowprec.models``).

The repository keeps its top-level folders; an install maps ``numerics/`` and
``models/`` under ``lowprec/``, so no top-level ``numerics`` or ``models`` package
collides with a project's own. ``experiments/`` and ``launch/`` (the harness) run from
the clone and are not installed; the ``experiments`` extra brings their dependencies.
"""

import os

from setuptools import find_packages, setup

_HERE = os.path.dirname(os.path.abspath(__file__))


def _requirements(path):
  with open(os.path.join(_HERE, path)) as f:
    return [line.strip() for line in f if line.strip() and not line.startswith("#")]


_LIBRARY = find_packages(_HERE, include=["numerics", "numerics.*", "models", "models.*"])
# The harness: checkpoints, TensorBoard, plots, statistics, flags.
_EXPERIMENTS = ["orbax-checkpoint>=0.12.8", "tensorboard>=2.21.0", "matplotlib>=3.11",
                "scipy>=1.17", "absl-py>=2.5.1", "chex>=0.1.92"]

setup(
    name="lowprec-numerics",
    version="0.1.0",
    description=("Bit-exact low-precision formats, stochastic rounding, block scaling "
                 "and quantized training experiments in JAX"),
    python_requires=">=3.11",
    packages=["lowprec"] + [f"lowprec.{p}" for p in _LIBRARY],
    package_dir={"lowprec": "lowprec", "lowprec.numerics": "numerics",
                 "lowprec.models": "models"},
    package_data={"lowprec.numerics": ["kernels/targets/*.txtpb",
                                       "kernels/compile_requirements.txt",
                                       "conformance/vectors.json.gz"]},
    install_requires=[
        "jax>=0.10.2",
        "optax>=0.2.8",
        "ml_dtypes>=0.7.0",
        "numpy>=2.4",
        "flax>=0.12.8",  # lowprec.models (lowprec.numerics does not import it)
    ],
    extras_require={
        "experiments": _EXPERIMENTS,
        "dev": _EXPERIMENTS + [
            "pytest>=9.0",
            "hypothesis>=6.150",
            "scikit-learn>=1.9",
            "pytest-xdist>=3.8",
            # Tests only: the oracle of convention="qwix" (never imported by the library).
            "qwix==0.1.8",
        ],
        # Deviceless compilation for H200/B200 and TPU v5e/v6e
        # (python -m lowprec.numerics.kernels.compile_check).
        "compile": _requirements("numerics/kernels/compile_requirements.txt"),
    },
)
