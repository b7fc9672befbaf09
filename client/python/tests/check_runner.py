"""The frame of a standalone CI check script: `check` raises, `run` turns that into exit 1."""

import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def run(main, name):
    """Exits with main()'s code, or 1 after printing "<name> FAILED: <what>" for a failed check."""
    try:
        sys.exit(main())
    except AssertionError as e:
        print(f"{name} FAILED: {e}")
        sys.exit(1)


def source_env(env=None):
    """`env` (default os.environ) with the repository root (the bench package) and client/python
    (the carpool package) first on PYTHONPATH: what examples/ and `python -m bench.X` need, as
    the shell wrappers set it."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "client" / "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def missing(modules, install):
    """None when every module imports; else prints a SKIP line naming what to install, and
    returns 77 (ctest's skip code here)."""
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as e:
            print(f"SKIP: {e}; install {install}")
            return 77
    return None
