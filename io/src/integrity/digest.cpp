#include "eredu/io/integrity/digest.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <utility>
#include <variant>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/io/integrity/sha256.hpp"

namespace eredu::io {

std::string_view digest_name(DigestKind kind) noexcept {
  switch (kind) {
    case DigestKind::sha256:
      return "sha256";
    case DigestKind::xxh3_128:
      return "xxh3-128";
    case DigestKind::xxh3_128_blocks:
      return "xxh3-128-blocks";
  }
  return "unknown";
}

std::optional<DigestKind> digest_kind_named(std::string_view name) noexcept {
  for (DigestKind kind : digest_kinds)
    if (name == digest_name(kind)) return kind;
  return std::nullopt;
}

std::size_t digest_hex_digits(DigestKind kind) noexcept { return kind == DigestKind::sha256 ? 64 : 32; }

bool is_digest_hex(DigestKind kind, std::string_view hex) noexcept {
  return hex.size() == digest_hex_digits(kind) &&
         std::all_of(hex.begin(), hex.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

namespace {

struct FreeXxh3 {
  void operator()(XXH3_state_t* s) const noexcept { XXH3_freeState(s); }
};
using Xxh3State = std::unique_ptr<XXH3_state_t, FreeXxh3>;

Xxh3State fresh_xxh3() {
  Xxh3State s(XXH3_createState());
  if (!s || XXH3_128bits_reset(s.get()) != XXH_OK)
    throw Error(errc::out_of_memory, {}, "libxxhash could not allocate an XXH3 state");
  return s;
}

/// An xxh3_128_blocks hash: the block being filled, the hash of the digests of those before
/// it, and their list for take_blocks (dropped if it cannot grow: the digest never needs it).
struct Blocks {
  Xxh3State block;
  Xxh3State digests;
  std::size_t filled = 0;  ///< bytes of `block` so far
  BlockDigests done{};
  bool dropped = false;  ///< `done` could not grow
  /// Ends the block being filled (when it has bytes).
  void close() noexcept {
    if (filled == 0) return;
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(block.get()));
    (void)XXH3_128bits_update(digests.get(), canonical.digest, sizeof canonical.digest);
    (void)XXH3_128bits_reset(block.get());
    const std::size_t length = std::exchange(filled, 0);
    if (dropped) return;
    try {
      BlockDigests::Digest digest;
      std::memcpy(digest.data(), canonical.digest, digest.size());
      done.append(digest, length);
    } catch (...) {
      dropped = true;
      done = BlockDigests{};
    }
  }
};

}  // namespace

struct Hasher::State {
  std::variant<Sha256, Xxh3State, Blocks> impl;
};

Hasher::Hasher(DigestKind kind) : kind_(kind) {
  if (kind == DigestKind::sha256)
    state_ = std::make_unique<State>(State{Sha256()});
  else if (kind == DigestKind::xxh3_128_blocks)
    state_ = std::make_unique<State>(State{Blocks{fresh_xxh3(), fresh_xxh3()}});
  else
    state_ = std::make_unique<State>(State{fresh_xxh3()});
}

Hasher::~Hasher() = default;
Hasher::Hasher(Hasher&&) noexcept = default;
Hasher& Hasher::operator=(Hasher&&) noexcept = default;

void Hasher::update(std::span<const std::byte> data) noexcept {
  if (data.empty()) return;  // an empty span may carry a null pointer
  if (auto* sha = std::get_if<Sha256>(&state_->impl)) {
    sha->update(data);
  } else if (auto* blocks = std::get_if<Blocks>(&state_->impl)) {
    while (!data.empty()) {
      const std::size_t n = std::min(BlockDigests::block_bytes - blocks->filled, data.size());
      (void)XXH3_128bits_update(blocks->block.get(), data.data(), n);
      blocks->filled += n;
      data = data.subspan(n);
      if (blocks->filled == BlockDigests::block_bytes) blocks->close();
    }
  } else {
    // XXH3_128bits_update fails only for a null state, which a constructed Hasher never has.
    (void)XXH3_128bits_update(std::get<Xxh3State>(state_->impl).get(), data.data(), data.size());
  }
}

std::string Hasher::hex_digest() {
  if (auto* sha = std::get_if<Sha256>(&state_->impl)) return sha->hex_digest();
  XXH3_state_t* state = nullptr;
  if (auto* blocks = std::get_if<Blocks>(&state_->impl)) {
    blocks->close();
    state = blocks->digests.get();
  } else {
    state = std::get<Xxh3State>(state_->impl).get();
  }
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(state));
  std::string out;
  out.reserve(32);
  for (unsigned char b : canonical.digest) out += fmt::format("{:02x}", b);
  return out;
}

BlockDigests Hasher::take_blocks() {
  auto* blocks = std::get_if<Blocks>(&state_->impl);
  return blocks && !blocks->dropped ? std::exchange(blocks->done, BlockDigests{}) : BlockDigests{};
}

std::string digest_hex(DigestKind kind, std::span<const std::byte> data) {
  Hasher h(kind);
  h.update(data);
  return h.hex_digest();
}

}  // namespace eredu::io
