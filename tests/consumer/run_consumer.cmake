# ctest driver: install the build tree into a scratch prefix, then configure, build and run the
# consumer project against it with find_package(simdattn).
foreach(var BUILD_DIR SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer.cmake needs -D${var}=...")
  endif()
endforeach()
if(NOT CONFIG)
  set(CONFIG Release)
endif()

function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGV}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix --config ${CONFIG})
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -DCMAKE_BUILD_TYPE=${CONFIG}
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
# simdattn::mpi's consumer, built when the package and the machine have MPI
if(EXISTS ${WORK_DIR}/build/consumer_mpi AND MPIEXEC)
  run(${MPIEXEC} -np 2 --oversubscribe --allow-run-as-root ${WORK_DIR}/build/consumer_mpi)
endif()
