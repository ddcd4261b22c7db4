# Installs nax from BUILD_DIR into a scratch prefix and moves it elsewhere (a relocated install),
# then builds and runs outside projects that find it there with find_package(nax):
# - consumer: CPU only (nax::nax); `ldd` must show no CUDA, NCCL or MPI library;
# - consumer_mpi (when the install has MPI): COMPONENTS mpi, run under MPIRUN -np 2.
# Arguments: BUILD_DIR, SOURCE_DIR (tests/install), WORK_DIR, MPIRUN (a ;-list; empty: no MPI).
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/staged)
file(RENAME ${WORK_DIR}/staged ${WORK_DIR}/prefix)  # nothing may point back at the first prefix
set(prefix ${WORK_DIR}/prefix)

function(build_consumer name)
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/${name} -B ${WORK_DIR}/${name} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/${name})
endfunction()

build_consumer(consumer)
run(${WORK_DIR}/consumer/consumer)
run(ldd ${WORK_DIR}/consumer/consumer)
string(REGEX MATCHALL "[^\n\t ]*(cuda|cublas|nccl|libmpi|open-pal|open-rte)[^\n\t ]*" backend_libraries "${run_output}")
if(backend_libraries)
  message(FATAL_ERROR "the CPU-only consumer loads backend libraries: ${backend_libraries}\n${run_output}")
endif()
file(GLOB_RECURSE installed_cmake ${prefix}/*.cmake)
foreach(file IN LISTS installed_cmake)
  file(READ ${file} text)
  string(FIND "${text}" "${WORK_DIR}/staged" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "${file} names the install's first prefix ${WORK_DIR}/staged")
  endif()
endforeach()

if(MPIRUN)
  build_consumer(consumer_mpi)
  run(${MPIRUN} -np 2 ${WORK_DIR}/consumer_mpi/consumer_mpi)
  string(REGEX MATCHALL "consumer_mpi: process [01] of 2" lines "${run_output}")
  list(LENGTH lines count)
  if(NOT count EQUAL 2)
    message(FATAL_ERROR "expected a line from each of 2 processes:\n${run_output}")
  endif()
endif()
