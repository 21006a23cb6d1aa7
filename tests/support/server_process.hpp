#pragma once
// A test server started as a child process (nginx, s3rver behind its verifying front, the fault
// proxy), through a launcher script that prints one line `READY <url>` once it serves and runs
// until it is sent SIGTERM. The tests talk to real servers over loopback, never to a mock inside
// the process. A server that cannot start (a package missing) is reported by skip_reason().

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

extern char** environ;

namespace eredu::test {

/// See the file comment. The child runs in its own process group; the destructor ends the group.
class ServerProcess {
 public:
  /// Runs `argv` (argv[0] looked up in PATH) and waits up to `timeout` for its `READY <url>` line.
  /// On failure, url() is empty and skip_reason() holds the launcher's last output.
  explicit ServerProcess(std::vector<std::string> argv, std::chrono::seconds timeout = std::chrono::seconds(60)) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      reason_ = "pipe failed";
      return;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const int rc = ::posix_spawnp(&pid_, args[0], &actions, &attr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    ::close(fds[1]);
    if (rc != 0) {
      pid_ = -1;
      ::close(fds[0]);
      reason_ = "cannot start " + argv[0];
      return;
    }
    out_ = fds[0];
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[512];
      const ssize_t n = ::read(out_, buf, sizeof buf);
      if (n <= 0) break;  // the launcher exited
      text.append(buf, static_cast<std::size_t>(n));
      for (std::size_t at; (at = text.find('\n')) != std::string::npos; text.erase(0, at + 1)) {
        const std::string line = text.substr(0, at);
        if (line.rfind("READY ", 0) == 0) {
          url_ = line.substr(6);
          return;
        }
        reason_ = line;  // the launcher says why it cannot serve (its last line wins)
      }
    }
    if (reason_.empty()) reason_ = "no READY line from " + argv[0] + " within the timeout";
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      ::kill(-pid_, SIGTERM);
      int status = 0;
      // The launcher stops its servers on SIGTERM; a wedged one is killed after 5 s.
      for (int i = 0; i < 500 && ::waitpid(pid_, &status, WNOHANG) == 0; ++i) ::usleep(10'000);
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, &status, WNOHANG);
    }
    if (out_ >= 0) ::close(out_);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  /// The URL the server answers on (`http://127.0.0.1:PORT`), empty if it did not start.
  const std::string& url() const noexcept { return url_; }
  /// Why it did not start (for SKIP), empty when it did.
  std::string skip_reason() const { return url_.empty() ? reason_ : std::string(); }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string url_;
  std::string reason_;
};

}  // namespace eredu::test
