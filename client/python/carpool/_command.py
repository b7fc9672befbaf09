"""The `carpool` command that the platform wheel installs (scripts/wheel.sh): it runs the binary
inside the package, so that `pip install` puts carpool on PATH with no environment variable."""

import os
import sys

from .server import bundled_binary


def main() -> None:
    path = bundled_binary()
    if path is None:  # never fall back to PATH: that `carpool` may be this very script
        sys.exit(f"carpool: this installation of the Python package has no carpool binary in "
                 f"{os.path.join(os.path.dirname(__file__), 'bin')}; install the platform wheel "
                 "(scripts/wheel.sh) or build the binary ('cmake --build build')")
    os.execv(path, ["carpool", *sys.argv[1:]])
