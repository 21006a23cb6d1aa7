// main() of the MPI tests: MPI's lifetime (eredu::mpi::Environment) around Catch2's session,
// so that every test case runs on every rank, in the same order, as collectives require.
// mpirun's exit status is non-zero when any rank's is.
//
// EREDU_TEST_JOIN=accept:SERVICE or connect:SERVICE makes the "world" of the tests the
// communicator of two separately started jobs (tests/distributed/two_jobs.sh): the accepting
// job's ranks first. That and EREDU_TEST_MPI_THREADS=multiple start MPI with
// MPI_THREAD_MULTIPLE, which joining jobs needs.
//
// EREDU_TEST_STALE_SERVICE=SERVICE runs no test: rank 0 opens a port, offers it as SERVICE,
// and exits without withdrawing it, as a trainer job that crashed after offering its service
// leaves the name server (two_jobs.sh, EREDU_TWO_JOBS_STALE).

#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "distributed/mpi_fixture.hpp"

namespace {
eredu::mpi::Environment* the_environment = nullptr;
eredu::mpi::Communicator* the_world = nullptr;
}  // namespace

namespace eredu::test {
mpi::Environment& mpi_environment() { return *the_environment; }
mpi::Communicator& mpi_world() { return *the_world; }
}  // namespace eredu::test

int main(int argc, char** argv) {
  if (!eredu::mpi::Environment::launched_by_mpirun())
    std::fprintf(stderr, "note: not launched by mpirun: running as a group of one rank\n");
  const char* join = std::getenv("EREDU_TEST_JOIN");
  const char* threads = std::getenv("EREDU_TEST_MPI_THREADS");
  eredu::mpi::EnvironmentOptions options;
  if (join != nullptr || (threads != nullptr && std::string(threads) == "multiple"))
    options.required = eredu::mpi::ThreadLevel::multiple;
  const char* stale = std::getenv("EREDU_TEST_STALE_SERVICE");
  if (stale != nullptr) options.required = eredu::mpi::ThreadLevel::multiple;
  eredu::mpi::Environment env(argc, argv, options);
  the_environment = &env;
  if (stale != nullptr) {
    char port[MPI_MAX_PORT_NAME] = {};
    if (MPI_Open_port(MPI_INFO_NULL, port) != MPI_SUCCESS ||
        MPI_Publish_name(stale, MPI_INFO_NULL, port) != MPI_SUCCESS) {
      std::fprintf(stderr, "could not offer '%s'\n", stale);
      return 1;
    }
    std::fprintf(stderr, "offered '%s' at %s, and left it there\n", stale, port);
    return 0;
  }
  int rc = 0;
  {
    eredu::mpi::Communicator w = eredu::mpi::Communicator::world(env, {.timeout = std::chrono::seconds(30)});
    if (join != nullptr) {
      const std::string how = join;
      const std::string service = how.substr(how.find(':') + 1);
      w = how.starts_with("accept:") ? eredu::mpi::Communicator::accept(env, w, service, {.name = "world"})
                                     : eredu::mpi::Communicator::connect(env, w, service, {.name = "world"});
      std::fprintf(stderr, "joined '%s': rank %d of %d\n", service.c_str(), w.rank(), w.size());
    }
    the_world = &w;
    rc = Catch::Session().run(argc, argv);
    the_world = nullptr;
  }
  the_environment = nullptr;
  return rc;
}
