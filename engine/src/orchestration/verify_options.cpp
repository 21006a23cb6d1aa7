#include "eredu/engine/orchestration/verify_options.hpp"

#include <fmt/format.h>

#include "eredu/core/error.hpp"

namespace eredu::engine {

void validate(const VerifyOptions& o) {
  const auto mode = static_cast<int>(o.mode);
  if (o.mode != VerifyMode::off && o.mode != VerifyMode::on && o.mode != VerifyMode::require) {
    throw Error(errc::invalid_argument, {},
                fmt::format("VerifyOptions::mode is {}; it must be off, on or require", mode));
  }
  if (o.preferred != io::DigestKind::sha256 && o.preferred != io::DigestKind::xxh3_128) {
    throw Error(
        errc::invalid_argument, {},
        fmt::format("VerifyOptions::preferred is {}; it must be sha256 or xxh3_128", static_cast<int>(o.preferred)));
  }
}

}  // namespace eredu::engine
