# eredu::libnccl: NCCL (the CUDA toolkit's nccl.h and libnccl, or a system NCCL), for eredu::nccl.
# An IMPORTED target, so that it is never exported: the build includes this file from
# backends/nccl/enable_nccl.cmake and the installed package from ereduConfig.cmake, and both
# find NCCL the same way. Needs find_package(CUDAToolkit) first (its directories are the hints).
# Sets EREDU_NCCL_FOUND, EREDU_NCCL_INCLUDE_DIR, EREDU_NCCL_LIBRARY and EREDU_NCCL_VERSION.
if(TARGET eredu::libnccl)
  set(EREDU_NCCL_FOUND TRUE)
  return()
endif()
set(EREDU_NCCL_FOUND FALSE)
find_path(EREDU_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} DOC "directory of NCCL's nccl.h")
find_library(EREDU_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} DOC "NCCL's shared library")
if(EREDU_NCCL_INCLUDE_DIR AND EREDU_NCCL_LIBRARY)
  file(STRINGS "${EREDU_NCCL_INCLUDE_DIR}/nccl.h" _eredu_nccl_version REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*" "\\1.\\2.\\3"
                       EREDU_NCCL_VERSION "${_eredu_nccl_version}")
  # The build tree needs it in every directory (EREDU_NCCL_GLOBAL=GLOBAL); a consumer in the
  # directory that found the package.
  add_library(eredu::libnccl SHARED IMPORTED ${EREDU_NCCL_GLOBAL})
  set_target_properties(eredu::libnccl PROPERTIES IMPORTED_LOCATION "${EREDU_NCCL_LIBRARY}"
                                                  INTERFACE_INCLUDE_DIRECTORIES "${EREDU_NCCL_INCLUDE_DIR}")
  set(EREDU_NCCL_FOUND TRUE)
endif()
