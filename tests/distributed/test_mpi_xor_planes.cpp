// The XOR delta's codec (backends/mpi/src/live/xor_planes.hpp, private to eredu::mpi): what it
// encodes decodes to the new bytes over any range, across chunks; a damaged encoding is a typed
// error naming the source, the tensor and the chunk's offset, never other bytes. It runs on
// every rank of the MPI launches, each alone.
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "eredu/core/error.hpp"
#include "io/read_fixture.hpp"
#include "live/xor_planes.hpp"

using namespace eredu;
using eredu::mpi::detail::encode_xor_planes;
using eredu::mpi::detail::xor_chunk_bytes;
using eredu::mpi::detail::XorPlanes;

namespace {

/// Pseudo-random bytes, the same for the same seed.
std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  return test::random_tensor_bytes({{"w", DType::U8, {n}}}, static_cast<unsigned>(seed))[0];
}

/// `before` with the lowest bit of 3 in 4 elements' first byte flipped: the drift of an RL step.
std::vector<std::byte> drifted(const std::vector<std::byte>& before, std::size_t element, std::uint64_t seed) {
  std::vector<std::byte> now = before;
  const std::vector<std::byte> coin = random_bytes(before.size() / element, seed);
  for (std::size_t k = 0; k < coin.size(); ++k)
    if ((static_cast<unsigned>(coin[k]) & 3u) != 0) now[k * element] ^= std::byte{1};
  return now;
}

/// `base` with the delta of `encoded` applied to [from, from + n).
std::vector<std::byte> applied(const XorPlanes& delta, const std::vector<std::byte>& base, std::uint64_t from,
                               std::uint64_t n) {
  std::vector<std::byte> out(base.begin() + static_cast<std::ptrdiff_t>(from),
                             base.begin() + static_cast<std::ptrdiff_t>(from + n));
  std::vector<std::byte> planes(delta.chunk_bytes());
  for (std::uint64_t at = from; at < from + n;) {
    const std::size_t c = static_cast<std::size_t>(at / delta.chunk_bytes());
    const std::uint64_t end = std::min(from + n, (c + 1) * delta.chunk_bytes());
    delta.decompress(c, planes);
    delta.apply(c, planes, at, std::span(out).subspan(at - from, end - at));
    at = end;
  }
  return out;
}

}  // namespace

TEST_CASE("XOR delta – any range decodes to the new bytes, across chunks, for 1-, 2- and 4-byte elements",
          "[mpi][xor]") {
  for (const std::size_t element : {std::size_t{1}, std::size_t{2}, std::size_t{4}}) {
    CAPTURE(element);
    const std::size_t n = 3 * xor_chunk_bytes + 1000 * element;  // three full chunks and a short one
    const std::vector<std::byte> before = random_bytes(n, element);
    const std::vector<std::byte> now = drifted(before, element, 7);
    const std::vector<std::byte> encoded = encode_xor_planes(now, before, element);
    CHECK(encoded.size() * 3 < n);  // the drift compresses
    const XorPlanes delta(encoded, n, element, "mpi://test", "w");
    CHECK(delta.chunks() == 4);
    CHECK(applied(delta, before, 0, n) == now);
    // A range across a chunk boundary, starting mid-element.
    const std::uint64_t from = xor_chunk_bytes - 3, length = 2 * xor_chunk_bytes + 5;
    CHECK(applied(delta, before, from, length) ==
          std::vector<std::byte>(now.begin() + static_cast<std::ptrdiff_t>(from),
                                 now.begin() + static_cast<std::ptrdiff_t>(from + length)));
  }
}

TEST_CASE("XOR delta – a damaged encoding is checksum_mismatch naming the source, tensor and offset", "[mpi][xor]") {
  const std::size_t n = 2 * xor_chunk_bytes;
  const std::vector<std::byte> before = random_bytes(n, 3);
  const std::vector<std::byte> now = drifted(before, 2, 4);
  const std::vector<std::byte> encoded = encode_xor_planes(now, before, 2);
  const auto expect_mismatch = [](auto&& f, const char* needle) {
    try {
      f();
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.kind() == errc::checksum_mismatch);
      CHECK(e.context().file == "mpi://test");
      CHECK(e.context().tensor == "w");
      CHECK_THAT(e.what(), Catch::Contains(needle));
    }
  };
  // Cut short: the table no longer adds up.
  std::vector<std::byte> cut(encoded.begin(), encoded.end() - 1);
  expect_mismatch([&] { XorPlanes(cut, n, 2, "mpi://test", "w"); }, "runs past its end");
  // For a tensor of another size.
  expect_mismatch([&] { XorPlanes(encoded, n + xor_chunk_bytes, 2, "mpi://test", "w"); }, "chunks for");
  // A bit flipped in the second chunk's frame: zstd's checksum refuses it.
  std::vector<std::byte> flipped = encoded;
  flipped[flipped.size() - 40] ^= std::byte{0x10};
  const XorPlanes delta(flipped, n, 2, "mpi://test", "w");
  std::vector<std::byte> planes(delta.chunk_bytes());
  CHECK_NOTHROW(delta.decompress(0, planes));
  expect_mismatch([&] { delta.decompress(1, planes); }, fmt::format("from offset {}", xor_chunk_bytes).c_str());
}
