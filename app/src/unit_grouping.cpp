#include "eredu/app/unit_grouping.hpp"

#include <map>
#include <utility>

namespace eredu::app {

std::optional<LayerName> split_layer_name(std::string_view name) {
  for (const std::string_view marker : {std::string_view("layers."), std::string_view("blk.")}) {
    for (std::size_t at = name.find(marker); at != std::string_view::npos; at = name.find(marker, at + 1)) {
      if (at != 0 && name[at - 1] != '.') continue;
      std::size_t i = at + marker.size(), digits = 0;
      std::uint64_t layer = 0;
      while (i < name.size() && name[i] >= '0' && name[i] <= '9' && digits < 9)
        layer = layer * 10 + static_cast<std::uint64_t>(name[i++] - '0'), ++digits;
      if (digits == 0 || i >= name.size() || name[i] != '.' || i + 1 == name.size()) continue;
      return LayerName{std::string(name.substr(0, at + marker.size())), layer, std::string(name.substr(i + 1))};
    }
  }
  return std::nullopt;
}

UnitGrouping group_layers(const io::Catalog& catalog) {
  std::map<std::pair<std::string, std::uint64_t>, UnitGroup> layers;
  UnitGrouping g;
  for (const io::TensorInfo& t : catalog.tensors()) {
    std::optional<LayerName> split = split_layer_name(t.name);
    if (!split) {
      g.skipped.push_back(t.name);
      g.skipped_bytes += t.nbytes;
      continue;
    }
    UnitGroup& unit = layers[{split->prefix, split->layer}];
    unit.requests.push_back({.key = t.name, .name = std::move(split->rest)});
    unit.bytes += t.nbytes;
    ++g.grouped_tensors;
  }
  for (auto& [key, unit] : layers) {
    unit.name = key.first + std::to_string(key.second);
    g.units.push_back(std::move(unit));
  }
  return g;
}

}  // namespace eredu::app
