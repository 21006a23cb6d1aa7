#include "eredu/io/formats/header_reader.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "eredu/core/error.hpp"

namespace eredu::io {

void FileHeaderReader::read(std::uint64_t offset, std::span<std::byte> dest, const char* what) {
  std::size_t done = 0;
  while (done < dest.size()) {
    const ssize_t r = ::pread(fd_, dest.data() + done, dest.size() - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      throw Error(errc::io_error,
                  {.file = path_, .offset = offset + done, .os_error = std::error_code(err, std::system_category())},
                  fmt::format("reading the {} ({} bytes at offset {}) failed", what, dest.size(), offset));
    }
    if (r == 0) {
      throw Error(errc::unexpected_eof, {.file = path_, .offset = offset + done},
                  fmt::format("the file ended at offset {} while reading its {}; it was {} bytes when opened",
                              offset + done, what, size_));
    }
    done += static_cast<std::size_t>(r);
  }
}

}  // namespace eredu::io
