#include "eredu/io/integrity/digest.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <variant>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/io/integrity/sha256.hpp"

namespace eredu::io {

std::string_view digest_name(DigestKind kind) noexcept { return kind == DigestKind::sha256 ? "sha256" : "xxh3-128"; }

std::optional<DigestKind> digest_kind_named(std::string_view name) noexcept {
  if (name == "sha256") return DigestKind::sha256;
  if (name == "xxh3-128") return DigestKind::xxh3_128;
  return std::nullopt;
}

std::size_t digest_hex_digits(DigestKind kind) noexcept { return kind == DigestKind::sha256 ? 64 : 32; }

bool is_digest_hex(DigestKind kind, std::string_view hex) noexcept {
  return hex.size() == digest_hex_digits(kind) &&
         std::all_of(hex.begin(), hex.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

struct Hasher::State {
  struct FreeXxh3 {
    void operator()(XXH3_state_t* s) const noexcept { XXH3_freeState(s); }
  };
  std::variant<Sha256, std::unique_ptr<XXH3_state_t, FreeXxh3>> impl;
};

Hasher::Hasher(DigestKind kind) : kind_(kind) {
  if (kind == DigestKind::sha256) {
    state_ = std::make_unique<State>(State{Sha256()});
    return;
  }
  std::unique_ptr<XXH3_state_t, State::FreeXxh3> s(XXH3_createState());
  if (!s || XXH3_128bits_reset(s.get()) != XXH_OK)
    throw Error(errc::out_of_memory, {}, "libxxhash could not allocate an XXH3 state");
  state_ = std::make_unique<State>(State{std::move(s)});
}

Hasher::~Hasher() = default;
Hasher::Hasher(Hasher&&) noexcept = default;
Hasher& Hasher::operator=(Hasher&&) noexcept = default;

void Hasher::update(std::span<const std::byte> data) noexcept {
  if (data.empty()) return;  // an empty span may carry a null pointer
  if (auto* sha = std::get_if<Sha256>(&state_->impl)) {
    sha->update(data);
  } else {
    // XXH3_128bits_update fails only for a null state, which a constructed Hasher never has.
    (void)XXH3_128bits_update(std::get<1>(state_->impl).get(), data.data(), data.size());
  }
}

std::string Hasher::hex_digest() {
  if (auto* sha = std::get_if<Sha256>(&state_->impl)) return sha->hex_digest();
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(std::get<1>(state_->impl).get()));
  std::string out;
  out.reserve(32);
  for (unsigned char b : canonical.digest) out += fmt::format("{:02x}", b);
  return out;
}

std::string digest_hex(DigestKind kind, std::span<const std::byte> data) {
  Hasher h(kind);
  h.update(data);
  return h.hex_digest();
}

}  // namespace eredu::io
