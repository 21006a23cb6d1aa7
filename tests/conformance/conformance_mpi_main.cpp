// main() of the MPI conformance executables: MPI's lifetime (eredu::mpi::Environment) and the
// world communicator around Catch2's session. Started as a plain process, as ctest does, MPI
// runs it as a singleton group of one rank. Listing the tests (catch_discover_tests does, at
// build time) starts no MPI: a build never waits for MPI, and under ASan no MPI allocation is
// left for LeakSanitizer to report.
//
// Not launched by mpirun, the process gives OpenMPI a session directory of its own
// (OMPI_MCA_orte_tmpdir_base, unless already set), removed at exit: OpenMPI 4.1 creates and
// removes /tmp/ompi.<host>.<uid> without a lock, and a singleton that started while another
// job on the host (ctest -j, another mpirun) was tearing its own down failed in MPI_Init_thread
// with "mkdir ... File exists" (once in 100 runs here).

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#include "conformance/conformance_mpi.hpp"
#include "eredu/mpi/environment.hpp"

namespace {

eredu::mpi::Communicator* world = nullptr;

/// True when the command line only asks Catch2 for lists or help.
bool only_lists(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with("--list") || arg == "-l" || arg == "-t" || arg == "-h" || arg == "-?" || arg == "--help")
      return true;
  }
  return false;
}

/// A session directory for OpenMPI's singleton start, private to this process (see file
/// comment); removed with everything OpenMPI left in it when destroyed. Does nothing under a
/// launcher, or where the variable is already set.
class PrivateSessionDir {
 public:
  PrivateSessionDir() {
    if (eredu::mpi::Environment::launched_by_mpirun() || std::getenv("OMPI_MCA_orte_tmpdir_base") != nullptr) return;
    std::string pattern = (std::filesystem::temp_directory_path() / "eredu-conformance-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) return;  // OpenMPI's default then, as before
    dir_ = pattern;
    setenv("OMPI_MCA_orte_tmpdir_base", dir_.c_str(), 1);
  }
  ~PrivateSessionDir() {
    std::error_code ignored;  // a directory left behind is no test failure
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }
  PrivateSessionDir(const PrivateSessionDir&) = delete;
  PrivateSessionDir& operator=(const PrivateSessionDir&) = delete;

 private:
  std::filesystem::path dir_;
};

}  // namespace

namespace eredu::test {
mpi::Communicator& conformance_world() {
  if (world == nullptr) throw std::logic_error("conformance_world() outside the MPI session of conformance_mpi_main");
  return *world;
}
}  // namespace eredu::test

int main(int argc, char** argv) {
  if (only_lists(argc, argv)) return Catch::Session().run(argc, argv);
  const PrivateSessionDir session_dir;  // outlives MPI
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
