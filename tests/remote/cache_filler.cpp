// A second process for the object cache's tests (test_object_cache.cpp): it asks its own
// ObjectCache for one object, as another inference process on the same machine would.
//
//   cache_filler DIR URL ETAG SIZE BYTE DELAY_MS FILL_LOG
//
// Its fill appends "fill <pid>" to FILL_LOG (so the test counts fills across processes and
// sees when one started), writes half of SIZE bytes of BYTE, sleeps DELAY_MS (the window in
// which others wait, or in which the test kills it), then writes the rest. Afterwards it checks
// the returned copy holds SIZE bytes of one value and prints "fills=F waits=W hits=H byte=B".
// Exit status: 0 when the copy is whole, 1 when it is not, 2 on an exception.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "eredu/io/remote/object_cache.hpp"

namespace {

void write_bytes(int fd, std::uint64_t n, char byte) {
  const std::vector<char> chunk(64 * 1024, byte);
  while (n > 0) {
    const std::size_t part = static_cast<std::size_t>(std::min<std::uint64_t>(n, chunk.size()));
    const ssize_t w = ::write(fd, chunk.data(), part);
    if (w <= 0) throw std::runtime_error("write failed");
    n -= static_cast<std::uint64_t>(w);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s DIR URL ETAG SIZE BYTE DELAY_MS FILL_LOG\n", argv[0]);
    return 2;
  }
  try {
    const eredu::io::CacheKey key{.url = argv[2], .etag = argv[3], .size = std::stoull(argv[4])};
    const char byte = argv[5][0];
    const auto delay = std::chrono::milliseconds(std::stoll(argv[6]));
    const std::string log = argv[7];
    eredu::io::ObjectCache cache(argv[1], 0);
    const auto path = cache.get(key, [&](int fd) {
      {
        std::ofstream out(log, std::ios::app);
        out << "fill " << ::getpid() << '\n';
      }
      write_bytes(fd, key.size / 2, byte);
      std::this_thread::sleep_for(delay);
      write_bytes(fd, key.size - key.size / 2, byte);
    });
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto s = cache.stats();
    std::printf("fills=%llu waits=%llu hits=%llu byte=%c\n", static_cast<unsigned long long>(s.fills),
                static_cast<unsigned long long>(s.waits), static_cast<unsigned long long>(s.hits),
                bytes.empty() ? '-' : bytes[0]);
    const bool whole =
        bytes.size() == key.size && bytes.find_first_not_of(bytes.empty() ? 'x' : bytes[0]) == std::string::npos;
    return whole ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cache_filler: %s\n", e.what());
    return 2;
  }
}
