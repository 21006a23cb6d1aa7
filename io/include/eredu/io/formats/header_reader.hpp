#pragma once
/// \file
/// eredu::io::HeaderReader: how a format parser reads the header bytes of one checkpoint file,
/// wherever the file is: a local descriptor (pread) or a remote object (ranged GETs).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace eredu::io {

/// Reads byte ranges of one checkpoint file for its format's parser.
class HeaderReader {
 public:
  virtual ~HeaderReader() = default;
  /// Fills all of `dest` with the file's bytes at `offset`; throws eredu::Error naming the file
  /// and the offset (io_error with the errno, unexpected_eof where the file ends first, a remote
  /// kind for an object behind a URL). `what` names what is being read ("safetensors header").
  virtual void read(std::uint64_t offset, std::span<std::byte> dest, const char* what) = 0;
};

/// A HeaderReader over an open descriptor, with pread (EINTR retried).
class FileHeaderReader final : public HeaderReader {
 public:
  /// Reads `fd` (not owned), a file of `file_size` bytes when opened, named `path` in messages.
  FileHeaderReader(int fd, std::uint64_t file_size, std::string path)
      : fd_(fd), size_(file_size), path_(std::move(path)) {}
  void read(std::uint64_t offset, std::span<std::byte> dest, const char* what) override;

 private:
  int fd_;
  std::uint64_t size_;
  std::string path_;
};

}  // namespace eredu::io
