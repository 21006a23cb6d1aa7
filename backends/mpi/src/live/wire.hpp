#pragma once
// The messages of live updates (private to eredu::mpi): what a subscriber asks the publisher
// and what it answers, as length-checked binary records. Tensor bytes travel in them only
// under LiveTransport::two_sided (a read request); otherwise subscribers read those from the
// publisher's window (channel.hpp).
//
// A request is one message to the publisher on request_tag: its kind, the sender, the tag of
// the reply, the publication it concerns, and a body. A reply is two messages on the sender's
// reply tag: a fixed header (status, body size), then the body on the tag after it.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "eredu/core/dtype.hpp"
#include "eredu/core/shape.hpp"
#include "eredu/io/integrity/digest.hpp"

namespace eredu::mpi::detail {

/// The tag of requests to the publisher.
inline constexpr int request_tag = 0x4c0;
/// The first reply tag; a subscriber's requests use reply_tag_base + 2 * (sequence % reply_tags).
inline constexpr int reply_tag_base = 0x500;
/// Reply tags a subscriber cycles through.
inline constexpr int reply_tags = 4000;
/// The largest request the publisher receives (a digests request is split to fit).
inline constexpr std::size_t max_request_bytes = std::size_t{4} << 20;
/// The size of a reply's header message.
inline constexpr std::size_t reply_header_bytes = 16;
/// The digest a publisher computes and a subscriber checks: over 64 KiB blocks, so that a
/// subscriber holding the serving version's block digests checks a delta by hashing only the
/// blocks it changed (engine::InPlaceModelSlot::async_patch).
inline constexpr io::DigestKind live_digest = io::DigestKind::xxh3_128_blocks;

/// What a request asks.
enum class RequestKind : std::uint32_t {
  open = 1,     ///< the manifest of a version (empty tag: the newest)
  digests = 2,  ///< digests of selections of the publication's tensors
  confirm = 3,  ///< is the publication still offered (not withdrawn)?
  done = 4,     ///< this subscriber has finished reading (no reply)
  /// bytes of the publisher's offered memory (LiveTransport::two_sided): u64 address, u64
  /// count, then count × (u64 offset from address, u64 length); the reply is those bytes, in
  /// that order
  read = 5,
  /// bytes of a staged tensor (ManifestTensor::staged), whatever the transport: u64 tensor
  /// index, u64 count, then count × (u64 offset in the tensor, u64 length); the reply is those
  /// bytes, in that order, copied out of the publisher's memory for this one reply
  read_staged = 6,
};

/// How the publisher answered.
enum class ReplyStatus : std::uint32_t {
  ok = 0,
  not_published = 1,  ///< no such version (or none yet)
  withdrawn = 2,      ///< the publication was withdrawn
  bad_request = 3,    ///< the request was malformed (the body says why)
  failed = 4,         ///< the publisher could not copy out its own memory (the body says why)
  /// the reply would be larger than the subscriber's reply memory (RequestHead::reply_capacity;
  /// the body, when it fits, says how large): not sent, so nothing waits for a receive that
  /// never comes
  too_large = 5,
};

/// Appends fixed-size integers and length-prefixed strings.
class WireWriter {
 public:
  /// Appends `v`.
  void u32(std::uint32_t v);
  /// Appends `v`.
  void u64(std::uint64_t v);
  /// Appends `s` with its length.
  void str(const std::string& s);
  /// The bytes written.
  std::vector<std::byte>& bytes() noexcept { return out_; }

 private:
  std::vector<std::byte> out_;
};

/// Reads what WireWriter wrote; throws Error(invalid_argument) naming `what` when a record
/// runs past the end.
class WireReader {
 public:
  /// Reads `bytes`; `what` names them in errors.
  WireReader(std::span<const std::byte> bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {}
  /// The next u32.
  std::uint32_t u32();
  /// The next u64.
  std::uint64_t u64();
  /// The next string.
  std::string str();

 private:
  void need(std::size_t n) const;
  template <class T>
  T take();
  std::span<const std::byte> bytes_;
  std::string what_;
  std::size_t pos_ = 0;
};

/// A request's fixed part.
struct RequestHead {
  RequestKind kind{};
  int sender = 0;                 ///< rank in the live group
  int reply_tag = 0;              ///< where the answer goes
  std::uint64_t publication = 0;  ///< 0 for open
  /// The largest reply body the subscriber receives: its reply memory.
  std::uint64_t reply_capacity = 0;
};

/// One tensor of a manifest.
struct ManifestTensor {
  std::string name{};
  DType dtype{};
  Shape shape{};
  std::uint64_t nbytes = 0;
  std::uint64_t address = 0;  ///< its displacement in the window
  std::string digest{};       ///< XXH3-128 of its bytes, lowercase hex (empty: not computed)
  /// XXH3-128 of selections subscribers asked for in earlier versions (Selection::to_string()
  /// → hex), computed at publication so that a subscriber with the same plan needs no request.
  std::vector<std::pair<std::string, std::string>> selection_digests{};
  /// A delta against the manifest's base: only these blocks (first block, block count; sorted,
  /// disjoint) differ from the base's bytes. False: read every byte.
  bool delta = false;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> changed{};
  /// A delta sent as changed elements instead of blocks (`changed` empty): `elements` u32
  /// element indices, ascending, then their values, at `encoded_address` in the window.
  std::uint64_t elements = 0;
  std::uint64_t encoded_address = 0;
  bool sparse = false;
  /// A sparse delta's entries by delta block: block k's changed elements are entries
  /// [block_first[k], block_first[k + 1]), so a rank reads only the entries of the blocks its
  /// selection touches. One more value than blocks, the last `elements` (empty unless sparse).
  std::vector<std::uint64_t> block_first{};
  /// A delta sent as the XOR with the base's bytes, in byte planes, compressed
  /// (live/xor_planes.hpp): `encoded_bytes` at `encoded_address` in the window.
  bool xor_planes = false;
  std::uint64_t encoded_bytes = 0;
  /// Memory the publisher's host cannot address (a device tensor): read through the publisher
  /// (RequestKind::read_staged) under every transport, never a delta; `address` is unused.
  bool staged = false;
};

/// What a subscriber learns when it opens a version.
struct Manifest {
  std::uint64_t publication = 0;  ///< the publisher's id of this publication
  std::string version{};
  std::string base{};
  std::uint64_t delta_block = 0;  ///< bytes per delta block (0: no tensor is a delta)
  std::vector<ManifestTensor> tensors{};
};

/// The manifest's bytes.
std::vector<std::byte> encode_manifest(const Manifest& m);
/// A manifest from its bytes; throws Error(invalid_argument) when malformed.
Manifest decode_manifest(std::span<const std::byte> bytes);

}  // namespace eredu::mpi::detail
