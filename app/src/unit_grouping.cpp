#include "eredu/app/unit_grouping.hpp"

#include <compare>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "eredu/core/error.hpp"

namespace eredu::app {
namespace {

/// `name` split at the first `<marker><N>.` that starts it or follows a dot, with a non-empty rest.
std::optional<LayerName> split_numbered(std::string_view name, std::string_view marker) {
  for (std::size_t at = name.find(marker); at != std::string_view::npos; at = name.find(marker, at + 1)) {
    if (at != 0 && name[at - 1] != '.') continue;
    std::size_t i = at + marker.size(), digits = 0;
    std::uint64_t number = 0;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9' && digits < 9)
      number = number * 10 + static_cast<std::uint64_t>(name[i++] - '0'), ++digits;
    if (digits == 0 || i >= name.size() || name[i] != '.' || i + 1 == name.size()) continue;
    return LayerName{std::string(name.substr(0, at + marker.size())), number, std::string(name.substr(i + 1))};
  }
  return std::nullopt;
}

/// Where a layer's tensor goes within its layer: the layer's own unit (empty `part`), or a part
/// of it — an expert — ordered after it by (part, number).
struct Placement {
  std::string part{};         ///< "" for the layer's unit; else what names the part ("mlp.experts.")
  std::uint64_t number = 0;   ///< the expert's number within `part`
  std::string unit_suffix{};  ///< appended to "<prefix><layer>" to name the unit
  std::string slot{};         ///< the tensor's slot within the unit
};

/// A unit's place in the order: by prefix, layer, then the layer's unit before its parts.
struct UnitKey {
  std::string prefix;
  std::uint64_t layer = 0;
  std::string part;
  std::uint64_t number = 0;
  auto operator<=>(const UnitKey&) const = default;
};

/// The layer-based presets: every tensor with a layer marker goes where `place` says within its
/// layer; the others are skipped.
template <class Place>
UnitGrouping group_by_layer(const io::Catalog& catalog, Place place) {
  std::map<UnitKey, UnitGroup> units;
  UnitGrouping g;
  for (const io::TensorInfo& t : catalog.tensors()) {
    std::optional<LayerName> split = split_layer_name(t.name);
    if (!split) {
      g.skipped.push_back(t.name);
      g.skipped_bytes += t.nbytes;
      continue;
    }
    Placement p = place(std::move(split->rest));
    auto [at, added] = units.try_emplace(UnitKey{split->prefix, split->layer, std::move(p.part), p.number});
    UnitGroup& unit = at->second;
    if (added) unit.name = split->prefix + std::to_string(split->layer) + p.unit_suffix;
    unit.requests.push_back({.key = t.name, .name = std::move(p.slot)});
    unit.bytes += t.nbytes;
    ++g.grouped_tensors;
  }
  for (auto& [key, unit] : units) g.units.push_back(std::move(unit));
  return g;
}

}  // namespace

std::optional<LayerName> split_layer_name(std::string_view name) {
  for (const std::string_view marker : {std::string_view("layers."), std::string_view("blk.")})
    if (std::optional<LayerName> split = split_numbered(name, marker)) return split;
  return std::nullopt;
}

UnitGrouping group_layers(const io::Catalog& catalog) {
  return group_by_layer(catalog, [](std::string rest) { return Placement{.slot = std::move(rest)}; });
}

UnitGrouping group_experts(const io::Catalog& catalog) {
  return group_by_layer(catalog, [](std::string rest) {
    if (std::optional<LayerName> expert = split_numbered(rest, "experts.")) {
      std::string suffix = fmt::format(".{}{}", expert->prefix, expert->layer);
      return Placement{.part = std::move(expert->prefix),
                       .number = expert->layer,
                       .unit_suffix = std::move(suffix),
                       .slot = std::move(expert->rest)};
    }
    // GGUF stacks a layer's experts per projection: ffn_gate_exps, ffn_up_exps, ffn_down_exps.
    const std::string_view head = std::string_view(rest).substr(0, rest.find('.'));
    if (head.ends_with("_exps")) return Placement{.part = "_exps", .unit_suffix = ".experts", .slot = std::move(rest)};
    return Placement{.slot = std::move(rest)};
  });
}

UnitPreset parse_unit_preset(std::string_view name) {
  if (std::optional<UnitPreset> preset = parse_choice(unit_preset_choices, name)) return *preset;
  throw Error(errc::invalid_argument, {},
              fmt::format("units must be {}, not '{}'", choice_list(unit_preset_choices), name));
}

UnitGrouping group_units(const io::Catalog& catalog, UnitPreset preset) {
  return preset == UnitPreset::experts ? group_experts(catalog) : group_layers(catalog);
}

}  // namespace eredu::app
