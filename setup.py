"""The CMake build behind pyproject.toml: builds the target simdattn_python (the library and the
compiled module simdattn._simdattn) and puts the module into the package setuptools installs.

SIMDATTN_BUILD_DIR: an already configured CMake build directory to build the target in (the
test suite's install test uses the project's own); otherwise a Release build of just the
library and the module in build/python-package/cmake. SIMDATTN_CMAKE_ARGS: more -D arguments for
that configuration. CMAKE_BUILD_PARALLEL_LEVEL: build jobs (default: the CPUs).
"""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        given = os.environ.get("SIMDATTN_BUILD_DIR")
        if given and (Path(given) / "CMakeCache.txt").exists():
            build = Path(given).resolve()
        else:
            build = ROOT / "build" / "python-package" / "cmake"
            args = ["-DCMAKE_BUILD_TYPE=Release", "-DSIMDATTN_BUILD_TESTS=OFF", "-DSIMDATTN_BUILD_PERF=OFF",
                    "-DSIMDATTN_BUILD_TOOLS=OFF", "-DSIMDATTN_BUILD_PYTHON=ON", f"-DSIMDATTN_PYTHON={sys.executable}"]
            args += shlex.split(os.environ.get("SIMDATTN_CMAKE_ARGS", ""))
            subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), *args], check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.run(["cmake", "--build", str(build), "--target", "simdattn_python", "-j", jobs], check=True)
        built = sorted((build / "python" / "simdattn").glob("_simdattn*.so"))
        if not built:
            raise RuntimeError(f"the CMake build in {build} made no simdattn/_simdattn*.so")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[-1], target)


setup(ext_modules=[Extension("simdattn._simdattn", sources=[])], cmdclass={"build_ext": CMakeBuild},
      options={"build": {"build_base": "build/python-package"}, "egg_info": {"egg_base": "build/python-package"}})
