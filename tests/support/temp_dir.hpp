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

/// The shared real-checkpoint directory (../shared/data/real), or empty when absent.
inline std::filesystem::path real_data_dir() {
  std::filesystem::path p = std::filesystem::path(EREDU_SHARED_DATA_DIR) / "real";
  std::error_code ec;
  return std::filesystem::is_directory(p, ec) ? p : std::filesystem::path{};
}

}  // namespace eredu::test
