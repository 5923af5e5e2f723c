"""Installs the numerics research library: numerics, models, experiments, launch."""

import os

from setuptools import find_packages, setup


def _requirements(path):
  with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), path)) as f:
    return [line.strip() for line in f if line.strip() and not line.startswith("#")]


setup(
    name="lowprec-numerics",
    version="0.1.0",
    description=("Bit-exact low-precision formats, stochastic rounding, block scaling "
                 "and quantized training experiments in JAX"),
    python_requires=">=3.11",
    packages=find_packages(include=["numerics", "numerics.*", "models", "models.*",
                                    "experiments", "experiments.*", "launch",
                                    "launch.*"]),
    package_data={"experiments": ["data/*.gz", "data/*.md"],
                  "numerics": ["kernels/targets/*.txtpb",
                               "kernels/compile_requirements.txt"]},
    install_requires=[
        "jax>=0.10.2",
        "flax>=0.12.8",
        "optax>=0.2.8",
        "orbax-checkpoint>=0.12.8",
        "chex>=0.1.92",
        "absl-py>=2.5.1",
        "tensorboard>=2.21.0",
        "ml_dtypes>=0.7.0",
        "numpy>=2.4",
        "scipy>=1.17",
        "matplotlib>=3.11",
    ],
    extras_require={
        "dev": [
            "pytest>=9.0",
            "hypothesis>=6.150",
            "scikit-learn>=1.9",
            "pytest-xdist>=3.8",
        ],
        # Deviceless compilation for H200/B200 and TPU v5e/v6e
        # (python -m numerics.kernels.compile_check).
        "compile": _requirements("numerics/kernels/compile_requirements.txt"),
    },
)
