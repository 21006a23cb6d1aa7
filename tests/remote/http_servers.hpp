#pragma once
// Test servers of the HTTP tests: nginx serving a temporary directory of random files, and the
// fault proxy in front of it (tests/remote/servers/). Both are real processes over loopback.

#include <catch2/catch.hpp>

#include <cstddef>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "support/server_process.hpp"
#include "support/temp_dir.hpp"

namespace eredu::test {

/// Returns from the test case with a warning when `server` did not start (nginx or python3 missing).
#define EREDU_REQUIRE_SERVER(server)                                              \
  do {                                                                            \
    if ((server).url().empty()) {                                                 \
      WARN("skipped: the test server did not start: " << (server).skip_reason()); \
      return;                                                                     \
    }                                                                             \
  } while (0)

/// Random bytes, the same for the same seed.
inline std::vector<std::byte> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(gen() & 0xff);
  return out;
}

/// A directory of files served by nginx (`tls`: HTTPS with a throwaway CA, HTTP/2 offered).
class NginxDir {
 public:
  explicit NginxDir(bool tls = false) : tls_(tls) {}

  /// Writes `name` with `n` random bytes (before start()) and returns them.
  std::vector<std::byte> add(const std::string& name, std::size_t n, unsigned seed) {
    auto bytes = random_bytes(n, seed);
    std::ofstream(dir_ / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return bytes;
  }
  /// Starts nginx; url() is empty when it could not (see server()).
  void start() {
    std::vector<std::string> argv{"/usr/bin/python3", std::string(EREDU_REMOTE_SERVERS_DIR) + "/nginx.py", "--root",
                                  dir_.path().string()};
    if (tls_) argv.push_back("--tls");
    server_ = std::make_unique<ServerProcess>(argv);
    const std::string& line = server_->url();  // `URL` or `URL CAFILE=PATH`
    const auto space = line.find(' ');
    url_ = line.substr(0, space);
    if (space != std::string::npos) {
      const auto at = line.find("CAFILE=", space);
      if (at != std::string::npos) ca_file_ = line.substr(at + 7);
    }
  }
  /// The server process (for EREDU_REQUIRE_SERVER).
  const ServerProcess& server() const { return *server_; }
  /// `http(s)://127.0.0.1:PORT`, no trailing slash.
  const std::string& url() const noexcept { return url_; }
  /// The CA that signed the server's certificate (TLS only).
  const std::string& ca_file() const noexcept { return ca_file_; }
  /// The served directory.
  const TempDir& dir() const noexcept { return dir_; }

 private:
  bool tls_;
  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::string url_;
  std::string ca_file_;
};

/// The fault proxy in front of `upstream` (see fault_proxy.py for the modes).
inline std::unique_ptr<ServerProcess> fault_proxy(const std::string& upstream, const std::string& mode, int count = 1,
                                                  std::size_t after = 1000, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv{"/usr/bin/python3", std::string(EREDU_REMOTE_SERVERS_DIR) + "/fault_proxy.py",
                                "--upstream",       upstream,
                                "--mode",           mode,
                                "--count",          std::to_string(count),
                                "--after",          std::to_string(after)};
  for (auto& e : extra) argv.push_back(std::move(e));
  return std::make_unique<ServerProcess>(argv);
}

}  // namespace eredu::test
