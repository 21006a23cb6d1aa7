#pragma once
/// \file
/// eredu::io::Sha256: SHA-256 (FIPS 180-4) of tensor bytes, for checksums recorded in a
/// checkpoint's metadata, a sidecar file or a manifest. Computed by OpenSSL's libcrypto (its
/// EVP interface), which uses the CPU's SHA extensions where it has them: about 2 GB/s per
/// core on the project's machines, against 0.3 GB/s for the portable code it replaced
/// (docs/performance.md), so verification can keep up with a load.

#include <cstddef>
#include <memory>
#include <span>
#include <string>

namespace eredu::io {

/// Incremental SHA-256. Move-only (it owns a libcrypto context).
class Sha256 {
 public:
  /// A fresh hash. Throws eredu::Error(out_of_memory) when libcrypto cannot make a context.
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  /// Feeds more bytes.
  void update(std::span<const std::byte> data) noexcept;
  /// Finishes and returns the digest as 64 lowercase hex digits. Call once. Throws
  /// eredu::Error(io_error) if libcrypto failed on the way (it does not for SHA-256
  /// on memory it was given, but its calls can return an error).
  std::string hex_digest();

 private:
  struct Context;
  std::unique_ptr<Context> context_;
};

/// SHA-256 of `data` as lowercase hex.
std::string sha256_hex(std::span<const std::byte> data);

}  // namespace eredu::io
