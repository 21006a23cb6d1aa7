#include "live/xor_planes.hpp"

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>

#include <fmt/format.h>
#include <tbb/parallel_for.h>

#include "eredu/core/error.hpp"
#include "eredu/core/printable.hpp"
#include "live/element_width.hpp"

namespace eredu::mpi::detail {
namespace {

/// zstd's level 1: the fastest of its regular levels, the one measured.
constexpr int compression_level = 1;

void put_u64(std::byte* at, std::uint64_t v) { std::memcpy(at, &v, 8); }

std::uint64_t get_u64(const std::byte* at) {
  std::uint64_t v = 0;
  std::memcpy(&v, at, 8);
  return v;
}

}  // namespace

std::vector<std::byte> encode_xor_planes(std::span<const std::byte> now, std::span<const std::byte> before,
                                         std::size_t element) {
  const std::size_t chunk = xor_chunk_bytes / element * element;
  const std::size_t count = (now.size() + chunk - 1) / chunk;
  std::vector<std::vector<std::byte>> frames(count);
  tbb::parallel_for(std::size_t{0}, count, [&](std::size_t c) {
    const std::size_t at = c * chunk;
    const std::size_t size = std::min(chunk, now.size() - at);
    const std::size_t n = size / element;
    std::vector<std::byte> planes(size);
    for (std::size_t k = 0; k < n; ++k)
      for (std::size_t j = 0; j < element; ++j)
        planes[j * n + k] = now[at + k * element + j] ^ before[at + k * element + j];
    // Each frame carries zstd's checksum of its content (4 bytes), so that a corrupted frame
    // is refused where it is decompressed, naming its chunk.
    const std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> context(ZSTD_createCCtx(), &ZSTD_freeCCtx);
    if (!context || ZSTD_isError(ZSTD_CCtx_setParameter(context.get(), ZSTD_c_compressionLevel, compression_level)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(context.get(), ZSTD_c_checksumFlag, 1)))
      throw std::bad_alloc();
    std::vector<std::byte>& frame = frames[c];
    frame.resize(ZSTD_compressBound(size));
    const std::size_t written = ZSTD_compress2(context.get(), frame.data(), frame.size(), planes.data(), size);
    if (ZSTD_isError(written)) throw std::bad_alloc();  // with a bound-sized output, only memory fails
    frame.resize(written);
  });
  std::size_t total = 16 + 8 * count;
  for (const auto& f : frames) total += f.size();
  std::vector<std::byte> out(total);
  put_u64(out.data(), chunk);
  put_u64(out.data() + 8, count);
  std::size_t at = 16 + 8 * count;
  for (std::size_t c = 0; c < count; ++c) {
    put_u64(out.data() + 16 + 8 * c, frames[c].size());
    std::memcpy(out.data() + at, frames[c].data(), frames[c].size());
    at += frames[c].size();
  }
  return out;
}

XorPlanes::XorPlanes(std::span<const std::byte> encoded, std::uint64_t nbytes, std::size_t element, std::string file,
                     std::string tensor)
    : encoded_(encoded), nbytes_(nbytes), element_(element), file_(std::move(file)), tensor_(std::move(tensor)) {
  auto bad = [&](const std::string& why) {
    return Error(errc::checksum_mismatch, {.file = file_, .tensor = tensor_},
                 fmt::format("the XOR delta of {} is malformed: {}", printable(tensor_), why));
  };
  if (element_ == 0 || encoded_.size() < 16) throw bad("shorter than its header");
  chunk_bytes_ = get_u64(encoded_.data());
  const std::uint64_t count = get_u64(encoded_.data() + 8);
  if (chunk_bytes_ == 0 || chunk_bytes_ % element_ != 0 || chunk_bytes_ > (std::uint64_t{1} << 30))
    throw bad(fmt::format("a chunk of {} bytes", chunk_bytes_));
  if (count != (nbytes_ + chunk_bytes_ - 1) / chunk_bytes_ || count > (encoded_.size() - 16) / 8)
    throw bad(fmt::format("{} chunks for {} bytes", count, nbytes_));
  std::uint64_t at = 16 + 8 * count;
  for (std::uint64_t c = 0; c < count; ++c) {
    const std::uint64_t size = get_u64(encoded_.data() + 16 + 8 * c);
    if (size > encoded_.size() - at) throw bad(fmt::format("chunk {} runs past its end", c));
    frames_.emplace_back(at, size);
    at += size;
  }
  if (at != encoded_.size()) throw bad("bytes after its last chunk");
}

std::size_t XorPlanes::decompress(std::size_t c, std::span<std::byte> planes) const {
  const std::uint64_t size = std::min<std::uint64_t>(chunk_bytes_, nbytes_ - c * chunk_bytes_);
  const auto [offset, length] = frames_.at(c);
  const std::size_t got =
      ZSTD_decompress(planes.data(), std::min<std::size_t>(planes.size(), size), encoded_.data() + offset, length);
  if (ZSTD_isError(got) || got != size)
    throw Error(errc::checksum_mismatch, {.file = file_, .tensor = tensor_},
                fmt::format("chunk {} of the XOR delta of {} (its bytes from offset {}) does not decompress to its "
                            "{} bytes: {}",
                            c, printable(tensor_), c * chunk_bytes_, size,
                            ZSTD_isError(got) ? ZSTD_getErrorName(got) : "a short frame"));
  return got;
}

void XorPlanes::apply(std::size_t c, std::span<const std::byte> planes, std::uint64_t from,
                      std::span<std::byte> out) const {
  const std::uint64_t start = c * chunk_bytes_;
  const std::uint64_t n = std::min<std::uint64_t>(chunk_bytes_, nbytes_ - start) / element_;
  const std::uint64_t first = from - start;  // of the range, within the chunk
  const std::uint64_t end = first + out.size();
  // Bytes of elements the range cuts (at most one at each end) one at a time; the whole
  // elements between them element by element, reading their bytes from each plane.
  const auto one = [&](std::uint64_t local) {
    out[local - first] ^= planes[(local % element_) * n + local / element_];
  };
  const std::uint64_t k0 = (first + element_ - 1) / element_;
  const std::uint64_t k1 = std::max(k0, end / element_);
  for (std::uint64_t local = first; local < std::min(end, k0 * element_); ++local) one(local);
  std::byte* to = out.data() + (k0 * element_ - first);
  const std::byte* plane = planes.data();
  // Elements [k0, k1), each XORed from its bytes in the n-element planes.
  with_element_width(element_, [&]<std::size_t W>(std::integral_constant<std::size_t, W>) {
    const std::size_t width = W != 0 ? W : element_;
    for (std::uint64_t k = k0; k < k1; ++k, to += width)
      for (std::size_t j = 0; j < width; ++j) to[j] ^= plane[j * n + k];
  });
  for (std::uint64_t local = k1 * element_; local < end; ++local) one(local);  // k1 ≥ k0
}

}  // namespace eredu::mpi::detail
