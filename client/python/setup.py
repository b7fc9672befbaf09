"""Installs the pure-Python package and copies libcarpool.so from the build beside it, so the
installed package needs no environment variable:

    /usr/bin/python3 -m pip install --no-deps --no-build-isolation client/python

The library is $CARPOOL_LIB, else $CARPOOL_BUILD_DIR/client/libcarpool.so, else the source tree's
build/client/libcarpool.so. Without one, the package is installed alone and looks for the library
at run time (carpool/_ffi.py)."""

import os
import pathlib
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent


def built_library():
    if os.environ.get("CARPOOL_LIB"):
        return pathlib.Path(os.environ["CARPOOL_LIB"])
    build = os.environ.get("CARPOOL_BUILD_DIR") or HERE.parents[1] / "build"
    return pathlib.Path(build) / "client" / "libcarpool.so"


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        lib = built_library()
        if lib.exists():
            shutil.copy2(lib.resolve(), pathlib.Path(self.build_lib) / "carpool" / "libcarpool.so")
            print(f"carpool: bundled {lib.resolve()}")
        else:
            print(f"carpool: {lib} not found; the package will look for libcarpool.so at run time "
                  "(CARPOOL_LIB, the build dir, the system library path)")


setup(cmdclass={"build_py": BuildPyWithLibrary})
