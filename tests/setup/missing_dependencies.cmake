# ctest driver: configures the project in a scratch directory with some dependencies hidden
# (CMAKE_DISABLE_FIND_PACKAGE_<Package>) and checks that configuration stops with one message
# naming each missing Debian package, and that nothing else went wrong first.
foreach(var SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "missing_dependencies.cmake needs -D${var}=...")
  endif()
endforeach()

file(REMOVE_RECURSE ${WORK_DIR})
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}
          -DCMAKE_DISABLE_FIND_PACKAGE_OpenCL=ON -DCMAKE_DISABLE_FIND_PACKAGE_doctest=ON
          -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(REMOVE_RECURSE ${WORK_DIR})
string(REGEX REPLACE "[ \n]+" " " text "${out} ${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "configuration succeeded with OpenCL, doctest and CLI11 hidden:\n${out}${err}")
endif()
set(expected "simdattn: missing Debian packages (oneDNN's CMake config from libdnnl-dev needs OpenCL's headers): ocl-icd-opencl-dev libcli11-dev doctest-dev")
string(FIND "${text}" "${expected}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "expected '${expected}' in:\n${out}${err}")
endif()
string(FIND "${text}" "Install them with: apt-get install ocl-icd-opencl-dev libcli11-dev doctest-dev" at)
if(at EQUAL -1)
  message(FATAL_ERROR "expected the apt-get line in:\n${out}${err}")
endif()
# One message: no other CMake error (such as dnnl's own OpenCL failure) before it.
string(REGEX MATCHALL "CMake Error" errors "${err}")
list(LENGTH errors n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "expected exactly one CMake error, got ${n}:\n${err}")
endif()
