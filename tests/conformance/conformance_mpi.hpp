#pragma once
// What the MPI conformance executables share with their main() (conformance_mpi_main.cpp): the
// world communicator of the process, made once around Catch2's session. Run as a plain process
// (no mpirun) it is a group of one rank, MPI's singleton start.

#include "eredu/mpi/communicator.hpp"

namespace eredu::test {

/// The world communicator conformance_mpi_main.cpp made before the session (timeout: 30 s, so
/// a broken collective fails instead of hanging ctest). Throws std::logic_error outside it.
mpi::Communicator& conformance_world();

}  // namespace eredu::test
