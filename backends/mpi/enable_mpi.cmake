# Decides whether the MPI parts are built (EREDU_MPI = ON | OFF | AUTO): the eredu::mpi library
# (collectives for CPU ranks, backends/mpi), its tests and the example, `eredu load
# --tensor-parallel`, and NCCL's bootstrap where CUDA is on. Included from the top-level
# CMakeLists.txt so that every directory sees EREDU_MPI_ENABLED.
#
# AUTO builds them when CMake's FindMPI finds an MPI (Debian's libopenmpi-dev) and
# mpiexec (openmpi-bin, which the tests launch); otherwise it prints one status line and the
# rest of the project builds without them. ON makes a missing MPI an error; OFF never looks.
set(EREDU_MPI AUTO CACHE STRING "Build the MPI parts: ON, OFF or AUTO")
set_property(CACHE EREDU_MPI PROPERTY STRINGS ON OFF AUTO)
string(TOUPPER "${EREDU_MPI}" _eredu_mpi_mode)
set(EREDU_MPI_ENABLED OFF)

if(NOT _eredu_mpi_mode STREQUAL "OFF")
  # The C API through the CXX component (the project enables no C language); eredu never uses
  # MPI's deprecated C++ bindings, so their header is skipped.
  set(MPI_CXX_SKIP_MPICXX ON)
  find_package(MPI QUIET COMPONENTS CXX)
  set(_eredu_mpi_why "")
  if(NOT MPI_CXX_FOUND)
    set(_eredu_mpi_why "no MPI found (apt-get install libopenmpi-dev openmpi-bin)")
  elseif(NOT MPIEXEC_EXECUTABLE)
    set(_eredu_mpi_why "MPI ${MPI_CXX_VERSION} found but no mpiexec to run its tests (apt-get install openmpi-bin)")
  endif()
  if(NOT _eredu_mpi_why)
    set(EREDU_MPI_ENABLED ON)
    message(STATUS "eredu: MPI parts on (MPI ${MPI_CXX_VERSION}, ${MPIEXEC_EXECUTABLE})")
  elseif(_eredu_mpi_mode STREQUAL "ON")
    message(FATAL_ERROR "eredu: EREDU_MPI=ON but ${_eredu_mpi_why}")
  else()
    message(STATUS "eredu: MPI parts skipped: ${_eredu_mpi_why}")
  endif()
endif()
