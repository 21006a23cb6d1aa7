#include "output_streams.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>

namespace eredu::cli {
namespace {

// Why the last write to stdout failed, for the statement (errno is gone by then).
int stdout_errno = 0;

}  // namespace

void guard_standard_descriptors() noexcept {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    // The lowest free number is `fd` itself, since the ones below it are open by now.
    const int opened = ::open("/dev/null", O_RDONLY);
    if (opened >= 0 && opened != fd) {
      ::dup2(opened, fd);
      ::close(opened);
    }
  }
}

void write_unchecked(std::FILE* stream, std::string_view text) noexcept {
  // glibc keeps no errno with a stream's error flag, and a failed flush drops the buffer (a
  // later flush succeeds with nothing to write): why it failed is recorded here, or never.
  bool failed = !text.empty() && std::fwrite(text.data(), 1, text.size(), stream) != text.size();
  failed = std::fflush(stream) != 0 || failed;
  if (failed && stream == stdout && !stdout_errno) stdout_errno = errno;
}

void remember_stdout_error(int error_number) noexcept {
  if (!stdout_errno) stdout_errno = error_number;
}

bool stdout_failed() noexcept { return std::ferror(stdout) != 0 || std::cout.fail(); }

int finish_output(int status, std::string_view who) noexcept {
  // stdio first: std::cout (CLI11's --help) flushes stdout too, and the errno of the flush
  // that fails is the only record of why.
  errno = 0;
  bool out_failed = false;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    out_failed = true;
    if (errno && !stdout_errno) stdout_errno = errno;
  }
  std::cout.flush();
  out_failed = out_failed || std::cout.fail();
  // Closing reports what a flush may not (a deferred write error on some file systems); the
  // exit path then has nothing of stdout left to flush and ignore.
  errno = 0;
  if (std::fclose(stdout) != 0) {
    out_failed = true;
    if (errno && !stdout_errno) stdout_errno = errno;
  }
  if (out_failed) {
    const std::string why = stdout_errno ? std::strerror(stdout_errno) : "a write failed";
    write_unchecked(stderr, std::string(who) + ": cannot write to standard output: " + why + "; the result was lost\n");
    if (status == 0) status = 1;
  }
  if (std::ferror(stderr) && status == 0) status = 1;  // nowhere left to say it
  return status;
}

}  // namespace eredu::cli
