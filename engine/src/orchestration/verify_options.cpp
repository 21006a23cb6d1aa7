#include "eredu/engine/orchestration/verify_options.hpp"

#include <algorithm>
#include <iterator>

#include <fmt/format.h>

#include "eredu/core/error.hpp"

namespace eredu::engine {

void validate(const VerifyOptions& o) {
  const auto mode = static_cast<int>(o.mode);
  if (o.mode != VerifyMode::off && o.mode != VerifyMode::on && o.mode != VerifyMode::require) {
    throw Error(errc::invalid_argument, {},
                fmt::format("VerifyOptions::mode is {}; it must be off, on or require", mode));
  }
  if (std::find(std::begin(io::digest_kinds), std::end(io::digest_kinds), o.preferred) == std::end(io::digest_kinds)) {
    throw Error(errc::invalid_argument, {},
                fmt::format("VerifyOptions::preferred is {}; it must be sha256, xxh3_128 or xxh3_128_blocks",
                            static_cast<int>(o.preferred)));
  }
}

}  // namespace eredu::engine
