#include "eredu/app/option_presets.hpp"

namespace eredu::app {

std::span<const NamedRange> option_ranges() noexcept {
  static constexpr std::array table{
      NamedRange{"budget", option_range::budget},
      NamedRange{"staging", option_range::staging},
      NamedRange{"request", option_range::request},
      NamedRange{"chunk", option_range::chunk},
      NamedRange{"threads", option_range::threads},
      NamedRange{"depth", option_range::depth},
      NamedRange{"lookahead", option_range::lookahead},
      NamedRange{"passes", option_range::passes},
      NamedRange{"tensor_parallel", option_range::tensor_parallel},
      NamedRange{"heads", option_range::heads},
      NamedRange{"kv_heads", option_range::heads},
      NamedRange{"head_dim", option_range::heads},
  };
  return table;
}

}  // namespace eredu::app
