"""Installs the pure-Python package and copies libcarpool.so from the build beside it, so the
installed package needs no environment variable:

    /usr/bin/python3 -m pip install --no-deps --no-build-isolation client/python

The library is $CARPOOL_LIB, else $CARPOOL_BUILD_DIR/client/libcarpool.so, else the source tree's
build/client/libcarpool.so. Without one, the package is installed alone and looks for the library
at run time (carpool/_ffi.py). A wheel with the library is tagged py3-none-<this platform>
(linux_x86_64: a local build, not audited for manylinux; scripts/wheel.sh makes the portable
one); without it, py3-none-any."""

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


cmdclass = {"build_py": BuildPyWithLibrary}
try:
    from wheel.bdist_wheel import bdist_wheel

    class PlatformWheel(bdist_wheel):
        """A bundled libcarpool.so is machine code: the wheel is not pure."""

        def finalize_options(self):
            if built_library().exists():  # platlib at the wheel's root, not .data/purelib
                self.distribution.has_ext_modules = lambda: True
            super().finalize_options()

        def get_tag(self):
            python, abi, plat = super().get_tag()
            return (python, abi, plat) if self.root_is_pure else ("py3", "none", plat)

    cmdclass["bdist_wheel"] = PlatformWheel
except ImportError:  # no wheel package: pip builds no wheel to tag either
    pass

setup(cmdclass=cmdclass)
