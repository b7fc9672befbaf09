#!/usr/bin/python3
"""Runs the Python package's tests with unittest (pytest is not assumed) and ends with the line
`python tests: N passed, N failed, N skipped`. Exit 0 if all passed, 1 on a failure, 77 (ctest's
skip code here) when numpy is missing. Usage: run_tests.py [-k PATTERN] [-v]."""

import os
import pathlib
import sys
import time
import unittest

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # fixture.py, then the package from this tree


def main():
    try:
        import numpy  # noqa: F401
    except ImportError:
        print(f"SKIP: numpy is not importable by {sys.executable}; install python3-numpy "
              "(scripts/setup.sh) to run the Python tests")
        return 77
    import carpool
    try:
        lib, binary = carpool.library_path(), carpool.binary()
    except carpool.CarpoolError as e:
        print(f"python tests cannot start: {e}")
        return 1
    print(f"python {sys.version.split()[0]}; libcarpool: {lib}; carpool: {binary}")
    loader = unittest.defaultTestLoader
    if "-k" in sys.argv:
        loader.testNamePatterns = ["*" + sys.argv[sys.argv.index("-k") + 1] + "*"]
    suite = loader.discover(str(HERE), pattern="test_*.py", top_level_dir=str(HERE))
    start = time.monotonic()
    result = unittest.TextTestRunner(verbosity=2 if "-v" in sys.argv else 1,
                                     stream=sys.stdout).run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    skipped = len(result.skipped)
    passed = max(0, result.testsRun - failed - skipped)  # a module-level skip is not a run
    print(f"python tests: {passed} passed, {failed} failed, {skipped} skipped "
          f"({time.monotonic() - start:.1f} s)")
    return 0 if failed == 0 and result.testsRun > 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
