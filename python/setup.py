"""Builds the ckptfs Python package (metadata in pyproject.toml).

    /usr/bin/python3 -m pip install --no-build-isolation --break-system-packages ./python

When the source tree has a built libckptfs_snapshot.so (build/, or the file named by
$CKPTFS_SNAPSHOT_LIB at build time), it is copied into the package, so that ckptfs.snapshot
finds it without environment variables; the wheel is then tagged for this platform. Without one,
the package finds the library of an installed ckptfs (the .deb, `cmake --install`) at run time.
"""
import os

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY = "libckptfs_snapshot.so"


def built_library():
    env = os.environ.get("CKPTFS_SNAPSHOT_LIB")
    if env:
        return env
    path = os.path.join(HERE, "..", "build", LIBRARY)
    return path if os.path.exists(path) else None


class BuildPy(build_py):
    def run(self):
        super().run()
        lib = built_library()
        if lib:
            self.copy_file(lib, os.path.join(self.build_lib, "ckptfs", LIBRARY))


class PlatformDistribution(Distribution):
    def has_ext_modules(self):  # a bundled shared library makes the wheel platform-specific
        return built_library() is not None


setup(cmdclass={"build_py": BuildPy}, distclass=PlatformDistribution)
