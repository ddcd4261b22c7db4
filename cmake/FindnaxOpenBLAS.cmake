# Finds OpenBLAS through its CMake config (Debian's libopenblas-dev) and wraps what that sets in the
# imported target nax::OpenBLAS, so that nax's installed targets name a target, found again on the
# consumer's machine, rather than this machine's paths.
find_package(OpenBLAS CONFIG QUIET)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(naxOpenBLAS REQUIRED_VARS OpenBLAS_LIBRARIES OpenBLAS_INCLUDE_DIRS
                                  VERSION_VAR OpenBLAS_VERSION)
if(naxOpenBLAS_FOUND AND NOT TARGET nax::OpenBLAS)
  add_library(nax::OpenBLAS INTERFACE IMPORTED)
  set_target_properties(nax::OpenBLAS PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${OpenBLAS_INCLUDE_DIRS}"
                                                 INTERFACE_LINK_LIBRARIES "${OpenBLAS_LIBRARIES}")
endif()
