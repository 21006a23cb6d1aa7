// main() of the NCCL tests: MPI's lifetime (eredu::mpi::Environment) around Catch2's session,
// so that every test case runs on every rank, in the same order, as collectives require.
// mpirun's exit status is non-zero when any rank's is.

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>

#include "nccl/nccl_fixture.hpp"

namespace {
eredu::mpi::Communicator* world = nullptr;
}  // namespace

namespace eredu::test {
mpi::Communicator& mpi_world() { return *world; }
}  // namespace eredu::test

int main(int argc, char** argv) {
  if (!eredu::mpi::Environment::launched_by_mpirun())
    std::fprintf(stderr, "note: not launched by mpirun: running as a group of one rank\n");
  eredu::mpi::Environment env(argc, argv);
  int rc = 0;
  {
    eredu::mpi::Communicator w = eredu::mpi::Communicator::world(env, {.timeout = std::chrono::seconds(30)});
    world = &w;
    rc = Catch::Session().run(argc, argv);
    world = nullptr;
  }
  return rc;
}
