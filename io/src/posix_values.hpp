#pragma once
// POSIX values as the io layer uses them: an errno as a std::error_code, a timestamp in
// nanoseconds (what file identity checks compare), and the page size.

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <system_error>

namespace eredu::io::detail {

/// `e` (an errno value) as a std::error_code of the system category.
inline std::error_code sys_error(int e) { return {e, std::system_category()}; }

/// A stat timestamp in nanoseconds.
inline std::int64_t nanoseconds(const struct timespec& t) {
  return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

/// The system's page size.
inline std::uint64_t page_size() {
  static const auto size = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

}  // namespace eredu::io::detail
