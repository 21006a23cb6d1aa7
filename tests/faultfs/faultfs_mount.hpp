#pragma once
// A faultfs mount for one test process: a source directory, a mount point, and the daemon
// that serves one through the other. Tests write checkpoints and `.faultfs` rules into
// source() and read them through mounted(). Where FUSE cannot be used (no /dev/fuse, not
// permitted to mount) the mount is not available and why() says so.

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "support/temp_dir.hpp"

namespace eredu::test {

/// See the file comment.
class FaultFsMount {
 public:
  /// Mounts faultfs over a fresh source directory; `direct_io` is the mount's default mode.
  explicit FaultFsMount(bool direct_io = false) {
    const int fd = ::open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      why_ = "cannot open /dev/fuse (" + std::string(std::strerror(errno)) + "): no FUSE here";
      return;
    }
    ::close(fd);
    std::filesystem::create_directories(dir_.path() / "src");
    std::filesystem::create_directories(dir_.path() / "mnt");
    std::vector<std::string> args{EREDU_FAULTFS_BINARY, source().string(), mounted().string(), "-f", "-o",
                                  "max_threads=8"};
    if (direct_io) args.insert(args.end(), {"-o", "direct_io"});
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    // Mounted once the mount point reports FUSE's magic.
    for (int i = 0; i < 500; ++i) {
      struct statfs st {};
      if (::statfs(mounted().c_str(), &st) == 0 && static_cast<std::uint32_t>(st.f_type) == 0x65735546u) {
        mounted_ = true;
        return;
      }
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        why_ = "faultfs exited before mounting (not permitted to mount FUSE here?)";
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    why_ = "faultfs did not mount within 5 s";
  }
  ~FaultFsMount() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);  // libfuse unmounts on SIGTERM
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
    if (mounted_) ::umount2(mounted().c_str(), MNT_DETACH);  // in case the daemon could not
  }
  FaultFsMount(const FaultFsMount&) = delete;
  FaultFsMount& operator=(const FaultFsMount&) = delete;

  /// True when the file system is mounted.
  explicit operator bool() const noexcept { return mounted_; }
  /// Why it is not.
  const std::string& why() const noexcept { return why_; }
  /// Where the test writes files and rules.
  std::filesystem::path source() const { return dir_.path() / "src"; }
  /// Where eredu reads them.
  std::filesystem::path mounted() const { return dir_.path() / "mnt"; }

  /// Replaces the rules of directory `rel` (relative to the source) with `lines`.
  void set_rules(const std::filesystem::path& rel, const std::vector<std::string>& lines) const {
    const auto file = source() / rel / ".faultfs";
    const auto tmp = source() / rel / ".faultfs.new";
    {
      std::ofstream out(tmp);
      for (const auto& l : lines) out << l << '\n';
    }
    std::filesystem::rename(tmp, file);  // one step, so the daemon never reads half a file
  }

 private:
  TempDir dir_;
  pid_t pid_ = -1;
  bool mounted_ = false;
  std::string why_;
};

}  // namespace eredu::test
