# Every package simdattn's build finds, each with the Debian 12 package that provides it.
# A missing one does not stop at the first find_package: all are looked up, then configuration
# stops with one message naming every Debian package to install. tools/setup.sh installs the
# same list (tools/debian-packages.txt); scripts/fresh-machine-check.sh proves it on a bare root.

set(_simdattn_missing "")
file(STRINGS ${PROJECT_SOURCE_DIR}/tools/debian-packages.txt _simdattn_listed REGEX "^[a-z0-9]")
list(TRANSFORM _simdattn_listed REPLACE "[ \t]*#.*$" "")

# simdattn_missing(<debian-package>): note a missing package (it must be in setup.sh's list).
macro(simdattn_missing _deb)
  if(NOT "${_deb}" IN_LIST _simdattn_listed)
    message(FATAL_ERROR "cmake/Dependencies.cmake names ${_deb}, which tools/debian-packages.txt lacks")
  endif()
  list(APPEND _simdattn_missing ${_deb})
endmacro()

# simdattn_find(<Package> <debian-package> [find_package arguments...])
macro(simdattn_find _pkg _deb)
  find_package(${_pkg} ${ARGN} QUIET)
  if(NOT ${_pkg}_FOUND)
    simdattn_missing(${_deb})
  endif()
endmacro()

# simdattn_find_python_module(<module> <debian-package>): SIMDATTN_PYTHON must import it.
macro(simdattn_find_python_module _mod _deb)
  set(_simdattn_rc 1)
  if(SIMDATTN_PYTHON)
    execute_process(COMMAND ${SIMDATTN_PYTHON} -c "import ${_mod}"
                    RESULT_VARIABLE _simdattn_rc OUTPUT_QUIET ERROR_QUIET)
  endif()
  if(NOT _simdattn_rc EQUAL 0)
    simdattn_missing(${_deb})
  endif()
endmacro()

simdattn_find(OpenMP g++ COMPONENTS CXX)       # GCC's libgomp
simdattn_find(xtl xtl-dev)                     # Debian's xsimd target links xtl
simdattn_find(xsimd libxsimd-dev 8.1)
simdattn_find(nlohmann_json nlohmann-json3-dev 3)
if(SIMDATTN_WITH_ONEDNN)
  # Debian's dnnl-config.cmake calls find_package(OpenCL REQUIRED) for oneDNN's GPU runtime, and
  # libdnnl-dev only recommends the package with OpenCL's headers: look for it first, since a
  # failure inside dnnl's config would stop configuration with a message that names no package.
  simdattn_find(OpenCL ocl-icd-opencl-dev)
  if(OpenCL_FOUND)
    simdattn_find(dnnl libdnnl-dev)
  else()
    find_path(SIMDATTN_DNNL_INCLUDE oneapi/dnnl/dnnl.hpp)
    if(NOT SIMDATTN_DNNL_INCLUDE)
      simdattn_missing(libdnnl-dev)
    endif()
  endif()
endif()
if(SIMDATTN_WITH_MPI)
  # simdattn::mpi (its C API from C++) and, for its tests, mpiexec (OpenMPI's mpirun)
  simdattn_find(MPI libopenmpi-dev COMPONENTS CXX)
  if(MPI_FOUND AND SIMDATTN_BUILD_TESTS AND NOT MPIEXEC_EXECUTABLE)
    simdattn_missing(openmpi-bin)
  endif()
endif()
if(SIMDATTN_BUILD_TOOLS)
  simdattn_find(CLI11 libcli11-dev)
endif()
# Debian's python3 (where Debian's Python packages install): the CLI's end-to-end tests and the
# Python module's build and tests run it.
if((SIMDATTN_BUILD_TESTS AND SIMDATTN_BUILD_TOOLS) OR SIMDATTN_BUILD_PYTHON)
  find_program(SIMDATTN_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
  if(NOT SIMDATTN_PYTHON)
    find_program(SIMDATTN_PYTHON NAMES python3)
  endif()
  if(NOT SIMDATTN_PYTHON)
    simdattn_missing(python3)
  endif()
endif()
if(SIMDATTN_BUILD_PYTHON)
  # pybind11's CMake config finds the interpreter and its headers with FindPython.
  set(PYBIND11_FINDPYTHON ON)
  set(Python_EXECUTABLE ${SIMDATTN_PYTHON})
  find_package(Python 3 COMPONENTS Interpreter Development.Module QUIET)
  if(NOT Python_Development.Module_FOUND)
    simdattn_missing(python3-dev)
  endif()
  simdattn_find(pybind11 pybind11-dev CONFIG)
  find_path(SIMDATTN_DLPACK_INCLUDE dlpack/dlpack.h)  # torch tensors in and out (DLPack)
  if(NOT SIMDATTN_DLPACK_INCLUDE)
    simdattn_missing(libdlpack-dev)
  endif()
  simdattn_find_python_module(numpy python3-numpy)
  if(SIMDATTN_BUILD_TESTS)  # the module's pytest suite checks it against PyTorch
    simdattn_find_python_module(pytest python3-pytest)
    simdattn_find_python_module(torch python3-torch)
    # the pip install test (tests/setup/pip_install.sh): Debian's venv needs ensurepip (python3-venv)
    simdattn_find_python_module(ensurepip python3-venv)
    simdattn_find_python_module(pip python3-pip)
    simdattn_find_python_module(setuptools python3-setuptools)
    simdattn_find_python_module(wheel python3-wheel)
    simdattn_find_python_module(build python3-build)
  endif()
endif()
if(SIMDATTN_BUILD_TESTS)
  simdattn_find(doctest doctest-dev)
  if(SIMDATTN_BUILD_TOOLS)
    simdattn_find_python_module(numpy python3-numpy)
    if(SIMDATTN_BUILD_PERF)  # the perf_report test draws a chart with scripts/perf_report.py plot
      simdattn_find_python_module(matplotlib python3-matplotlib)
    endif()
  endif()
endif()
if(SIMDATTN_BUILD_PERF)
  simdattn_find(benchmark libbenchmark-dev)
endif()

if(_simdattn_missing)
  list(REMOVE_DUPLICATES _simdattn_missing)
  string(REPLACE ";" " " _simdattn_missing "${_simdattn_missing}")
  if(SIMDATTN_WITH_ONEDNN AND NOT OpenCL_FOUND)
    set(_simdattn_note " (oneDNN's CMake config from libdnnl-dev needs OpenCL's headers)")
  endif()
  message(FATAL_ERROR
    "simdattn: missing Debian packages${_simdattn_note}: ${_simdattn_missing}\n"
    "Install them with: apt-get install ${_simdattn_missing}\n"
    "or run bash tools/setup.sh, which installs every dependency and builds. "
    "-DSIMDATTN_WITH_ONEDNN=OFF, -DSIMDATTN_WITH_MPI=OFF, -DSIMDATTN_BUILD_PYTHON=OFF, -DSIMDATTN_BUILD_TESTS=OFF, -DSIMDATTN_BUILD_PERF=OFF and "
    "-DSIMDATTN_BUILD_TOOLS=OFF leave out the parts that need some of them.")
endif()
