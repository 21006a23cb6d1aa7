// The live-update manifest's encoding (backends/mpi/src/live/wire.hpp, private to eredu::mpi):
// what the publisher encodes, a subscriber decodes to the same tensors, sparse block counts
// included; a damaged or truncated manifest is Error(invalid_argument), never a crash or a
// manifest that sends a read past its tensor. It runs on every rank of the MPI launches, each
// alone.
#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "eredu/core/error.hpp"
#include "live/wire.hpp"
#include "support/error_kind.hpp"

using namespace eredu;
using eredu::mpi::detail::decode_manifest;
using eredu::mpi::detail::encode_manifest;
using eredu::mpi::detail::Manifest;
using eredu::mpi::detail::ManifestTensor;

namespace {

/// A delta with one tensor of each kind: changed blocks, whole, changed values (sparse). The
/// sparse one comes last, so that its last block count is the encoding's last 4 bytes.
Manifest delta_manifest() {
  Manifest m;
  m.publication = 7;
  m.version = "step-2";
  m.base = "step-1";
  m.delta_block = 256;
  ManifestTensor blocks{.name = "blocks", .dtype = DType::BF16, .shape = {4, 256}, .nbytes = 2048};
  blocks.delta = true;
  blocks.changed = {{1, 2}, {6, 1}};
  ManifestTensor sparse{.name = "sparse", .dtype = DType::F32, .shape = {4, 128}, .nbytes = 2048, .address = 2048};
  sparse.delta = true;
  sparse.sparse = true;
  sparse.elements = 5;
  sparse.encoded_address = 8192;
  sparse.block_first = {0, 2, 2, 2, 3, 3, 3, 4, 5};  // 8 blocks of 256 bytes
  ManifestTensor whole{.name = "whole", .dtype = DType::F32, .shape = {8}, .nbytes = 32, .address = 4096};
  whole.staged = true;  // a device tensor, read through the publisher
  m.tensors = {blocks, whole, sparse};
  return m;
}

}  // namespace

TEST_CASE("live wire – a manifest decodes to what was encoded, a sparse delta's block counts included", "[wire]") {
  const Manifest m = delta_manifest();
  const Manifest back = decode_manifest(encode_manifest(m));
  REQUIRE(back.tensors.size() == 3);
  CHECK(back.delta_block == 256);
  CHECK(back.tensors[0].changed == m.tensors[0].changed);
  CHECK(back.tensors[0].block_first.empty());
  CHECK(back.tensors[1].block_first.empty());
  CHECK_FALSE(back.tensors[1].delta);
  CHECK(back.tensors[1].staged);
  CHECK_FALSE(back.tensors[0].staged);
  CHECK_FALSE(back.tensors[2].staged);
  CHECK(back.tensors[2].sparse);
  CHECK(back.tensors[2].elements == 5);
  CHECK(back.tensors[2].block_first == m.tensors[2].block_first);
}

TEST_CASE("live wire – block counts that do not add up to the sparse delta's values are refused", "[wire]") {
  const Manifest m = delta_manifest();
  std::vector<std::byte> encoded = encode_manifest(m);
  const std::size_t at = encoded.size() - 4;  // the sparse tensor's last block count
  std::uint32_t last = 0;
  std::memcpy(&last, encoded.data() + at, 4);
  REQUIRE(last == 1);
  for (const std::uint32_t wrong : {0u, 2u, 0xFFFFFFFFu}) {
    std::memcpy(encoded.data() + at, &wrong, 4);
    CHECK(test::error_of([&] { decode_manifest(encoded); }).kind() == errc::invalid_argument);
  }

  // As many counts as blocks: a sparse tensor without them, or a whole one with them.
  Manifest fewer = m;
  fewer.tensors[2].block_first.pop_back();
  fewer.tensors[2].block_first.back() = 5;
  CHECK(test::error_of([&] { decode_manifest(encode_manifest(fewer)); }).kind() == errc::invalid_argument);
  Manifest extra = m;
  extra.tensors[1].block_first = {0, 0};
  CHECK(test::error_of([&] { decode_manifest(encode_manifest(extra)); }).kind() == errc::invalid_argument);
}

TEST_CASE("live wire – every truncation of a manifest is a typed error", "[wire]") {
  const std::vector<std::byte> encoded = encode_manifest(delta_manifest());
  for (std::size_t n = 0; n < encoded.size(); ++n) {
    INFO("the first " << n << " of " << encoded.size() << " bytes");
    CHECK(test::error_of([&] { decode_manifest(std::span<const std::byte>(encoded.data(), n)); }).kind() ==
          errc::invalid_argument);
  }
}

TEST_CASE("live wire – a staged tensor sent as a delta is refused: staged memory is only read whole", "[wire]") {
  Manifest m = delta_manifest();
  m.tensors[0].staged = true;  // changed blocks
  CHECK(test::error_of([&] { decode_manifest(encode_manifest(m)); }).kind() == errc::invalid_argument);
  m = delta_manifest();
  m.tensors[2].staged = true;  // changed values
  CHECK(test::error_of([&] { decode_manifest(encode_manifest(m)); }).kind() == errc::invalid_argument);
}
