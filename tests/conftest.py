"""Test order for the xdist workers: ``pytest.ini`` sends each file whole to one worker
(``--dist loadfile``), so the programs a file's tests share are compiled once, not once
per worker; the files that hold a worker longest go first, so none of them is the tail
of the run while the other workers sit idle."""

# Each holds one worker for a minute or more (the whole-step compiles about four, the
# kernel compile check about three).
_LONGEST_FIRST = ("tests/numerics/kernels/test_step_compile.py",
                  "tests/numerics/kernels/test_compile.py", "tests/test_readme.py",
                  "tests/experiments/test_scripts.py")


def pytest_collection_modifyitems(session, config, items):
  rank = {path: i for i, path in enumerate(_LONGEST_FIRST)}
  # sorted() is stable: every other file keeps its collection order, after these.
  items[:] = sorted(items, key=lambda item: rank.get(item.nodeid.split("::")[0],
                                                     len(rank)))
