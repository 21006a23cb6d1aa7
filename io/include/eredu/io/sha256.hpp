#pragma once
/// \file
/// eredu::io::Sha256: SHA-256 (FIPS 180-4) of tensor bytes, for checksums recorded in a
/// checkpoint's metadata, a sidecar file or a manifest. Portable and single-threaded: about
/// 200-400 MB/s per core, so verification costs a pass over the bytes (`eredu swap`
/// verifies by default, and `--verify off` skips it).

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace eredu::io {

/// Incremental SHA-256.
class Sha256 {
 public:
  /// Feeds more bytes.
  void update(std::span<const std::byte> data) noexcept;
  /// Finishes and returns the digest as 64 lowercase hex digits. Call once.
  std::string hex_digest();

 private:
  void compress(const std::uint8_t* block) noexcept;

  std::array<std::uint32_t, 8> state_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                         0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<std::uint8_t, 64> block_{};
  std::size_t fill_ = 0;
  std::uint64_t length_ = 0;
};

/// SHA-256 of `data` as lowercase hex.
std::string sha256_hex(std::span<const std::byte> data);

}  // namespace eredu::io
