#pragma once
/// \file
/// eredu::example::TempDir: a scratch directory for the examples' generated checkpoints.

#include <stdlib.h>  // mkdtemp

#include <cerrno>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

namespace eredu::example {

/// A fresh directory under the system's temporary directory, removed with its contents when
/// this goes out of scope (removal errors are ignored: cleanup must not hide the real error).
class TempDir {
 public:
  /// Creates "<tmp>/<prefix>-XXXXXX"; throws std::system_error when it cannot.
  explicit TempDir(std::string_view prefix) {
    std::string name = (std::filesystem::temp_directory_path() / (std::string(prefix) + "-XXXXXX")).string();
    if (mkdtemp(name.data()) == nullptr)
      throw std::system_error(errno, std::generic_category(), "cannot create a temporary directory");
    path_ = name;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  /// The directory.
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace eredu::example
