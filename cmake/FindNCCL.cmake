# Finds NCCL (libnccl and nccl.h) and defines the imported target NCCL::NCCL. Looks in NCCL_ROOT,
# then beside the CUDA toolkit (find CUDAToolkit first), where the toolkit's installers put it.
set(nccl_hints ${NCCL_ROOT})
if(CUDAToolkit_FOUND)
  list(APPEND nccl_hints ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_DIR}/../lib ${CUDAToolkit_LIBRARY_DIR}/../../lib
       ${CUDAToolkit_LIBRARY_DIR}/../../lib64 ${CUDAToolkit_TARGET_DIR}/lib)
  foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    list(APPEND nccl_include_hints ${dir} ${dir}/../../include)
  endforeach()
endif()
find_library(NCCL_LIBRARY nccl HINTS ${nccl_hints})
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_ROOT}/include ${nccl_include_hints})
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR)
if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}" INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
