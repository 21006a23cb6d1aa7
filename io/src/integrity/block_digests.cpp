#include "eredu/io/integrity/block_digests.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/io/integrity/digest.hpp"

namespace eredu::io {

BlockDigests BlockDigests::of(std::span<const std::byte> data) {
  BlockDigests out;
  out.digests_.reserve((data.size() + block_bytes - 1) / block_bytes);
  for (std::size_t at = 0; at < data.size(); at += block_bytes) {
    const std::span<const std::byte> block = data.subspan(at, std::min(block_bytes, data.size() - at));
    out.append(digest_of(block), block.size());
  }
  return out;
}

BlockDigests::Digest BlockDigests::digest_of(std::span<const std::byte> block) noexcept {
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits(block.data(), block.size()));
  Digest out;
  std::memcpy(out.data(), canonical.digest, out.size());
  return out;
}

std::size_t BlockDigests::block_length(std::size_t i) const noexcept {
  const std::uint64_t first = block_first(i);
  return first >= bytes_ ? 0 : static_cast<std::size_t>(std::min<std::uint64_t>(block_bytes, bytes_ - first));
}

void BlockDigests::append(const Digest& digest, std::size_t length) {
  if (length == 0 || length > block_bytes || bytes_ % block_bytes != 0)
    throw Error(
        errc::invalid_argument, {},
        fmt::format("a block of {} bytes cannot follow {} bytes of {}-byte blocks", length, bytes_, block_bytes));
  digests_.push_back(digest);
  bytes_ += length;
}

void BlockDigests::set(std::size_t i, std::span<const std::byte> block) {
  if (i >= digests_.size() || block.size() != block_length(i))
    throw Error(errc::invalid_argument, {},
                fmt::format("{} bytes are not block {} of a {}-byte string", block.size(), i, bytes_));
  digests_[i] = digest_of(block);
}

std::string BlockDigests::hex_digest() const {
  return digest_hex(DigestKind::xxh3_128, std::as_bytes(std::span(digests_)));
}

}  // namespace eredu::io
