#include "eredu/app/option_presets.hpp"

#include <cctype>

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

std::optional<std::optional<DType>> parse_cast(std::string_view name) noexcept {
  // Longer than every choice: no need to lower-case it to know it names none.
  constexpr std::size_t longest = 8;
  if (name.size() > longest) return std::nullopt;
  char lowered[longest];
  for (std::size_t i = 0; i < name.size(); ++i)
    lowered[i] = static_cast<char>(std::tolower(static_cast<unsigned char>(name[i])));
  return parse_choice(cast_choices, std::string_view(lowered, name.size()));
}

}  // namespace eredu::app
