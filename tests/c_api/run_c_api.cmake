# ctest driver for the C API: install the build tree into a scratch prefix, check the installed
# shared library (SONAME, exported symbols), then build and run test_c_api (test_c_api.c and its parts
# c_api_*.c) and test_c_api_paged (test_c_api_paged.c, c_api_check.c) twice against it:
#   (a) with `cc -std=c11 -Wall -Wextra -pedantic -Werror` and `pkg-config --cflags --libs simdattn`;
#   (b) as the CMake project in SOURCE_DIR with find_package(simdattn) and simdattn::shared.
# Usage: cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... [-DCONFIG=Release] -P run_c_api.cmake
cmake_minimum_required(VERSION 3.22)  # this script's policies
foreach(var BUILD_DIR SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_c_api.cmake needs -D${var}=...")
  endif()
endforeach()
if(NOT CONFIG)
  set(CONFIG Release)
endif()

# Runs a command; fails the test with the command line on a non-zero exit. OUTPUT_VARIABLE <var>
# captures stdout (stderr still goes to the log).
function(run)
  cmake_parse_arguments(PARSE_ARGV 0 R "" "OUTPUT_VARIABLE" "")
  if(R_OUTPUT_VARIABLE)
    execute_process(COMMAND ${R_UNPARSED_ARGUMENTS} RESULT_VARIABLE rc OUTPUT_VARIABLE out)
    set(${R_OUTPUT_VARIABLE} "${out}" PARENT_SCOPE)
  else()
    execute_process(COMMAND ${R_UNPARSED_ARGUMENTS} RESULT_VARIABLE rc)
  endif()
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${R_UNPARSED_ARGUMENTS}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

function(require_program var name)
  find_program(${var} ${name})
  if(NOT ${var})
    message(FATAL_ERROR "run_c_api.cmake needs `${name}` (Debian: ${ARGN})")
  endif()
endfunction()
require_program(CC_EXE cc gcc)
require_program(PKG_CONFIG_EXE pkg-config pkg-config)
require_program(READELF_EXE readelf binutils)
require_program(NM_EXE nm binutils)

set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix} --config ${CONFIG})

# ---- where the install put things: the pkg-config file's directory gives the libdir ---------
file(GLOB_RECURSE pc_files ${prefix}/*/pkgconfig/simdattn.pc)
list(LENGTH pc_files n_pc)
if(NOT n_pc EQUAL 1)
  message(FATAL_ERROR "expected one installed pkgconfig/simdattn.pc under ${prefix}, found: ${pc_files}")
endif()
get_filename_component(pc_dir ${pc_files} DIRECTORY)
get_filename_component(libdir ${pc_dir} DIRECTORY)
message(STATUS "installed libdir: ${libdir}")
set(shared_lib ${libdir}/libsimdattn.so)
foreach(f ${shared_lib} ${libdir}/libsimdattn.a ${prefix}/include/simdattn/simdattn.h)
  if(NOT EXISTS ${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()

# ---- the shared library: its SONAME, and nothing internal exported --------------------------
run(${READELF_EXE} -d ${shared_lib} OUTPUT_VARIABLE dynamic)
if(NOT dynamic MATCHES "\\(SONAME\\)[^\n]*\\[([^]\n]*)\\]")
  message(FATAL_ERROR "${shared_lib} has no SONAME:\n${dynamic}")
endif()
if(NOT CMAKE_MATCH_1 STREQUAL "libsimdattn.so.0.1")
  message(FATAL_ERROR "${shared_lib}: SONAME is ${CMAKE_MATCH_1}, expected libsimdattn.so.0.1")
endif()
if(NOT EXISTS ${libdir}/libsimdattn.so.0.1)
  message(FATAL_ERROR "the SONAME's link ${libdir}/libsimdattn.so.0.1 is not installed")
endif()

# Symbols in simdattn::detail or simdattn::simd: their mangled names (functions, variables, and
# their vtables, typeinfo, guard variables, thunks, local statics, .cold clones) start with
# _Z[special]Z?N<qualifiers>8simdattn6detail or ...4simd (a nested name in that namespace); a
# std:: template instantiated with one of their types is std's, not theirs. Each hit is reported
# demangled (nm -C lists the same symbols in the same order).
run(${NM_EXE} -D --defined-only ${shared_lib} OUTPUT_VARIABLE mangled)
run(${NM_EXE} -D --defined-only -C ${shared_lib} OUTPUT_VARIABLE demangled)
# One list element a line: ';' escaped, and square brackets (which would stop list splitting in
# a demangled name) replaced, then restored in what is reported.
foreach(v mangled demangled)
  string(STRIP "${${v}}" ${v})
  string(REPLACE ";" "\\;" ${v} "${${v}}")
  string(REPLACE "[" "<LSQB>" ${v} "${${v}}")
  string(REPLACE "]" "<RSQB>" ${v} "${${v}}")
  string(REPLACE "\n" ";" ${v} "${${v}}")
endforeach()
list(LENGTH mangled n_mangled)
list(LENGTH demangled n_demangled)
if(NOT n_mangled EQUAL n_demangled OR n_mangled LESS 10)
  message(FATAL_ERROR "nm -D listed ${n_mangled} symbols mangled and ${n_demangled} demangled")
endif()
set(internal_re "^[0-9a-fA-F]+ [A-Za-z] _Z(T[VTISHW]|GV|Th[n]?[0-9]+_|Tv[n]?[0-9]+_[n]?[0-9]+_)?Z?N[rVKRO]*8simdattn(6detail|4simd)[0-9]")
set(leaks "")
set(n_c_api 0)
math(EXPR last "${n_mangled} - 1")
foreach(i RANGE ${last})
  list(GET mangled ${i} m)
  list(GET demangled ${i} d)
  if(m MATCHES "${internal_re}")
    string(REGEX REPLACE "^[0-9a-fA-F]+ [A-Za-z] " "" name "${d}")
    if(NOT name MATCHES "^simdattn::detail::printable\\(")
      string(REPLACE "<LSQB>" "[" name "${name}")
      string(REPLACE "<RSQB>" "]" name "${name}")
      string(APPEND leaks "\n  ${name}")
    endif()
  endif()
  if(m MATCHES " T simdattn_[a-z_]+$")
    math(EXPR n_c_api "${n_c_api} + 1")
  endif()
endforeach()
if(leaks)
  message(FATAL_ERROR "${shared_lib} exports internal symbols (simdattn::detail / simdattn::simd):${leaks}")
endif()
# Every function the header declares is exported.
file(STRINGS ${prefix}/include/simdattn/simdattn.h decls REGEX "^SIMDATTN_C_API ")
set(missing "")
foreach(decl ${decls})
  if(decl MATCHES "(simdattn_[a-z0-9_]+)\\(")
    if(NOT mangled MATCHES " T ${CMAKE_MATCH_1}(;|$)")
      string(APPEND missing " ${CMAKE_MATCH_1}")
    endif()
  endif()
endforeach()
if(missing)
  message(FATAL_ERROR "${shared_lib} does not export:${missing}")
endif()
message(STATUS "${shared_lib}: SONAME libsimdattn.so.0.1, ${n_c_api} C API functions, no internal symbol exported")

# ---- (a) cc + pkg-config --------------------------------------------------------------------
set(ENV{PKG_CONFIG_PATH} ${pc_dir})
run(${PKG_CONFIG_EXE} --modversion simdattn OUTPUT_VARIABLE pc_version)
run(${PKG_CONFIG_EXE} --cflags --libs simdattn OUTPUT_VARIABLE pc_flags)
string(STRIP "${pc_version}" pc_version)
string(STRIP "${pc_flags}" pc_flags)
separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
message(STATUS "pkg-config simdattn ${pc_version}: ${pc_flags}")
set(c_api_parts "")
foreach(part attention mha gguf errors check)
  list(APPEND c_api_parts ${SOURCE_DIR}/c_api_${part}.c)
endforeach()
run(${CC_EXE} -std=c11 -Wall -Wextra -pedantic -Werror -O1 -DSIMDATTN_EXPECTED_VERSION=${pc_version}
    ${SOURCE_DIR}/test_c_api.c ${c_api_parts} -o ${WORK_DIR}/test_c_api_pkgconfig ${pc_flags} -lm)
run(${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${libdir} ${WORK_DIR}/test_c_api_pkgconfig)
run(${CC_EXE} -std=c11 -Wall -Wextra -pedantic -Werror -O1 ${SOURCE_DIR}/test_c_api_paged.c
    ${SOURCE_DIR}/c_api_check.c -o ${WORK_DIR}/test_c_api_paged_pkgconfig ${pc_flags} -lm)
run(${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${libdir} ${WORK_DIR}/test_c_api_paged_pkgconfig)

# ---- (b) the CMake consumer: find_package(simdattn), simdattn::shared -----------------------
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/cmake-build -DCMAKE_BUILD_TYPE=${CONFIG}
    -DCMAKE_PREFIX_PATH=${prefix})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/cmake-build --config ${CONFIG})
set(exe ${WORK_DIR}/cmake-build/test_c_api)
if(NOT EXISTS ${exe} AND EXISTS ${WORK_DIR}/cmake-build/${CONFIG}/test_c_api)
  set(exe ${WORK_DIR}/cmake-build/${CONFIG}/test_c_api)
endif()
# Its rpath, not the environment, finds the installed library.
run(${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${exe})
get_filename_component(exe_dir ${exe} DIRECTORY)
run(${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${exe_dir}/test_c_api_paged)
