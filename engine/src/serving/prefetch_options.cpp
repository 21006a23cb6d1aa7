#include "eredu/engine/serving/prefetch_options.hpp"

#include <fmt/format.h>

#include "eredu/core/error.hpp"

namespace eredu::engine {

void validate(const PrefetchOptions& o) {
  auto check = [](const char* name, std::size_t value, std::size_t low, std::size_t high) {
    if (value < low || value > high) {
      throw Error(errc::invalid_argument, {},
                  fmt::format("PrefetchOptions::{} is {}; it must be {}..{}", name, value, low, high));
    }
  };
  check("lookahead", o.lookahead, 1, PrefetchOptions::max_lookahead);
  check("concurrent_loads", o.concurrent_loads, 1, PrefetchOptions::max_concurrent_loads);
  check("timing_history", o.timing_history, 0, PrefetchOptions::max_timing_history);
  validate(o.verify);
}

}  // namespace eredu::engine
