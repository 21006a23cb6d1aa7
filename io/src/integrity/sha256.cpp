#include "eredu/io/integrity/sha256.hpp"

#include <openssl/evp.h>

#include <array>

#include "eredu/core/error.hpp"

namespace eredu::io {

struct Sha256::Context {
  struct Free {
    void operator()(EVP_MD_CTX* c) const noexcept { EVP_MD_CTX_free(c); }
  };
  std::unique_ptr<EVP_MD_CTX, Free> ctx{EVP_MD_CTX_new()};
  bool ok = false;  // every libcrypto call so far succeeded
};

Sha256::Sha256() : context_(std::make_unique<Context>()) {
  if (!context_->ctx) throw Error(errc::out_of_memory, {}, "libcrypto could not allocate a SHA-256 context");
  // EVP_sha256() is the implicitly fetched implementation: the SHA-NI / AVX2 code where the
  // CPU has it, chosen by libcrypto at run time.
  context_->ok = EVP_DigestInit_ex(context_->ctx.get(), EVP_sha256(), nullptr) == 1;
}

Sha256::~Sha256() = default;
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::update(std::span<const std::byte> data) noexcept {
  if (data.empty() || !context_ || !context_->ok) return;  // an empty span may carry a null pointer
  context_->ok = EVP_DigestUpdate(context_->ctx.get(), data.data(), data.size()) == 1;
}

std::string Sha256::hex_digest() {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int length = 0;
  if (!context_ || !context_->ok || EVP_DigestFinal_ex(context_->ctx.get(), digest.data(), &length) != 1 ||
      length != 32) {
    throw Error(errc::io_error, {}, "libcrypto failed to compute a SHA-256 digest");
  }
  context_->ok = false;  // finished: a second call is an error, as documented
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (unsigned i = 0; i < length; ++i) {
    out.push_back(digits[digest[i] >> 4]);
    out.push_back(digits[digest[i] & 0xF]);
  }
  return out;
}

std::string sha256_hex(std::span<const std::byte> data) {
  Sha256 h;
  h.update(data);
  return h.hex_digest();
}

}  // namespace eredu::io
