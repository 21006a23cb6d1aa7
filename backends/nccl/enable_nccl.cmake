# Decides whether eredu::nccl (NCCL collectives for the CUDA backend, backends/nccl) is built
# (EREDU_NCCL = ON | OFF | AUTO). Included from the top-level CMakeLists.txt after the CUDA and
# MPI decisions, so that every directory sees EREDU_NCCL_ENABLED.
#
# It needs three things: the CUDA backend (EREDU_CUDA_ENABLED), NCCL (nccl.h and libnccl, which
# the CUDA toolkit's NCCL package puts beside the toolkit; cmake/ereduNCCL.cmake finds them), and
# eredu::mpi (EREDU_MPI_ENABLED), because the ranks exchange NCCL's unique id over MPI. AUTO
# builds it when all three are there and otherwise prints one status line; ON makes a missing
# one an error; OFF never looks.
set(EREDU_NCCL AUTO CACHE STRING "Build the NCCL collectives: ON, OFF or AUTO")
set_property(CACHE EREDU_NCCL PROPERTY STRINGS ON OFF AUTO)
string(TOUPPER "${EREDU_NCCL}" _eredu_nccl_mode)
set(EREDU_NCCL_ENABLED OFF)

if(NOT _eredu_nccl_mode STREQUAL "OFF")
  set(_eredu_nccl_why "")
  if(NOT EREDU_CUDA_ENABLED)
    set(_eredu_nccl_why "the CUDA backend is not built")
  elseif(NOT EREDU_MPI_ENABLED)
    set(_eredu_nccl_why "the MPI parts are not built (NCCL's unique id is exchanged over MPI)")
  else()
    set(EREDU_NCCL_GLOBAL GLOBAL)
    include(${PROJECT_SOURCE_DIR}/cmake/ereduNCCL.cmake)
    if(NOT EREDU_NCCL_FOUND)
      set(_eredu_nccl_why "no NCCL found beside the CUDA toolkit (nccl.h and libnccl)")
    endif()
  endif()
  if(NOT _eredu_nccl_why)
    set(EREDU_NCCL_ENABLED ON)
    message(STATUS "eredu: NCCL collectives on (NCCL ${EREDU_NCCL_VERSION}, ${EREDU_NCCL_LIBRARY})")
  elseif(_eredu_nccl_mode STREQUAL "ON")
    message(FATAL_ERROR "eredu: EREDU_NCCL=ON but ${_eredu_nccl_why}")
  else()
    message(STATUS "eredu: NCCL collectives skipped: ${_eredu_nccl_why}")
  endif()
endif()
