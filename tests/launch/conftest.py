"""The SLURM cluster the ``slurm`` tests submit to (CI starts one: launch/local_slurm.py)."""

from __future__ import annotations

import os

import pytest

from launch.slurm_runner import scheduler_available


@pytest.fixture
def slurm_env() -> dict[str, str]:
  """The environment to call SLURM's commands with.

  Skips when no cluster answers, or fails when ``REQUIRE_SLURM=1`` (as in CI, which must
  not pass by skipping them).
  """
  why = scheduler_available()
  if why:
    message = (f"no SLURM cluster ({why}). As root with slurmctld, slurmd, slurm-client "
               "and munge installed: python -m launch.local_slurm run --dir=/tmp/slurm -- "
               "python -m pytest -m slurm tests/launch")
    if os.environ.get("REQUIRE_SLURM") == "1":
      pytest.fail(f"REQUIRE_SLURM=1 but {message}")
    pytest.skip(message)
  return dict(os.environ)
