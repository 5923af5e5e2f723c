"""The compile toolchain for the deviceless compile tests (test_compile.py,
test_step_compile.py).

CI installs it into a directory of its own and names it in NUMERICS_COMPILE_TOOLCHAIN,
with REQUIRE_COMPILE=1 so that a missing toolchain fails instead of skipping. Elsewhere
the tests run where the toolchain is importable (``pip install -e ".[compile]"``) and
skip otherwise.
"""

import os

import pytest

from lowprec.numerics.kernels import compile_check


@pytest.fixture(scope="module")
def toolchain():
  directory = os.environ.get("NUMERICS_COMPILE_TOOLCHAIN")
  if directory:
    if not os.path.isdir(directory):
      pytest.fail(f"NUMERICS_COMPILE_TOOLCHAIN={directory!r} is not a directory")
    return directory
  why = compile_check.toolchain_missing()
  if why is None:
    return None
  if os.environ.get("REQUIRE_COMPILE") == "1":
    pytest.fail(why)
  pytest.skip(why)
