// Baseline for bench/read.sh: plain pread of every tensor's bytes of a checkpoint into one
// reused buffer the size of a request — what `cat` does, and the ceiling for a loader that
// copies out of the page cache. Prints one JSON object.
// usage: pread_baseline PATH [request_bytes]
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "eredu/io/formats/open_catalog.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: pread_baseline PATH [request_bytes]\n");
    return 2;
  }
  const std::size_t request = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (std::size_t{4} << 20);
  auto catalog = eredu::io::open_catalog(argv[1]);
  std::vector<int> fds;
  for (const auto& f : catalog.files()) fds.push_back(::open(f.path.c_str(), O_RDONLY | O_CLOEXEC));
  void* mem = nullptr;
  if (posix_memalign(&mem, 4096, request) != 0) return 1;
  auto* buf = static_cast<char*>(mem);
  for (std::size_t i = 0; i < request; i += 4096) buf[i] = 0;  // pre-populated, like the pool
  std::uint64_t bytes = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (const auto& t : catalog.tensors()) {
    for (std::uint64_t done = 0; done < t.nbytes;) {
      std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(request, t.nbytes - done));
      ssize_t n = ::pread(fds[t.file], buf, want, static_cast<off_t>(t.offset + done));
      if (n <= 0) return 1;
      done += static_cast<std::uint64_t>(n);
      bytes += static_cast<std::uint64_t>(n);
    }
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("{\"bytes\":%llu,\"seconds\":%.6f,\"gb_per_s\":%.4f}\n", static_cast<unsigned long long>(bytes), s,
              static_cast<double>(bytes) / s / 1e9);
  for (int fd : fds) ::close(fd);
  std::free(mem);
  return 0;
}
