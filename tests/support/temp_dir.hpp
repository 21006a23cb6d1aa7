#pragma once
// A temporary directory removed with everything in it when the object dies.

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace eredu::test {

/// Unique directory under $TMPDIR (or /tmp), deleted recursively on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/eredu-test-XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  /// The directory.
  const std::filesystem::path& path() const noexcept { return path_; }
  /// A path inside the directory.
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

/// The shared test data: $EREDU_SHARED_DATA_DIR when set (as in the Python tests, so a test
/// binary built elsewhere can run on a machine where ../shared lies somewhere else), else
/// ../shared/data beside the source tree it was built from.
inline std::filesystem::path shared_data_dir() {
  const char* env = std::getenv("EREDU_SHARED_DATA_DIR");
  return std::filesystem::path(env && *env ? env : EREDU_SHARED_DATA_DIR);
}

/// The shared real-checkpoint directory (../shared/data/real), or empty when absent.
inline std::filesystem::path real_data_dir() {
  std::filesystem::path p = shared_data_dir() / "real";
  std::error_code ec;
  return std::filesystem::is_directory(p, ec) ? p : std::filesystem::path{};
}

}  // namespace eredu::test
