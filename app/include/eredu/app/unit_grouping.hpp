#pragma once
/// \file
/// Unit grouping presets: how a checkpoint's tensors become the units a prefetch pipeline
/// streams. The "layers" preset makes one unit per transformer layer — Hugging Face names
/// (`model.layers.12.mlp.up_proj.weight`) and llama.cpp's GGUF names (`blk.12.ffn_up.weight`)
/// alike. The "experts" preset also splits a mixture-of-experts layer, so that a consumer holds
/// one expert at a time: each Hugging Face expert (`model.layers.3.block_sparse_moe.experts.7.*`,
/// `model.layers.3.mlp.experts.7.*`) is a unit, and a GGUF layer's stacked expert tensors
/// (`blk.3.ffn_gate_exps.weight`, `ffn_up_exps`, `ffn_down_exps`) one unit beside the layer's.
/// `eredu pipeline --units` and Python's `eredu.prefetch(units=)` name them through
/// parse_unit_preset, so that both stream the same units.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eredu/app/option_presets.hpp"
#include "eredu/app/tensor_set_module.hpp"
#include "eredu/io/formats/catalog.hpp"

namespace eredu::app {

/// A tensor name split at its layer marker: "model.layers.12.mlp.up_proj.weight" is
/// {"model.layers.", 12, "mlp.up_proj.weight"}, "blk.12.ffn_up.weight" {"blk.", 12, "ffn_up.weight"}.
struct LayerName {
  std::string prefix;       ///< everything up to and including the marker
  std::uint64_t layer = 0;  ///< the layer number (at most 9 digits)
  std::string rest;         ///< what follows the number and its dot (never empty)
};

/// `name` split at the first `layers.<N>.` or `blk.<N>.` that starts the name or follows a dot;
/// nullopt when it has none.
std::optional<LayerName> split_layer_name(std::string_view name);

/// One unit: its name and its tensors, each read whole in its stored dtype.
struct UnitGroup {
  std::string name;                     ///< "model.layers.3", "blk.3"
  std::vector<TensorRequest> requests;  ///< key: the checkpoint name; name: the slot within the unit
  std::uint64_t bytes = 0;              ///< the tensors' stored bytes
};

/// A checkpoint grouped into units, and what no unit holds.
struct UnitGrouping {
  std::vector<UnitGroup> units;      ///< in preset order
  std::vector<std::string> skipped;  ///< tensors in no unit, in catalog order
  std::size_t grouped_tensors = 0;   ///< tensors in some unit
  std::uint64_t skipped_bytes = 0;   ///< the skipped tensors' stored bytes
};

/// The "layers" preset: one unit per (prefix, layer number), ordered by prefix and then
/// number, each slot named by the rest of its tensor's name (split_layer_name); tensors
/// outside any layer (embeddings, final norm, head) are skipped.
UnitGrouping group_layers(const io::Catalog& catalog);

/// The "experts" preset: group_layers, with a layer's experts taken out into units of their own,
/// each after its layer's unit (which keeps the dense tensors: attention, norms, the router,
/// shared experts). A Hugging Face expert is what follows `experts.<E>.` in the rest of a
/// layer's name (at its start or after a dot): unit "model.layers.3.mlp.experts.7", slots
/// "gate_proj.weight", ..., ordered by expert number. GGUF's per-layer stacks (a rest whose first
/// component ends in `_exps`) make one unit "blk.3.experts", slots "ffn_gate_exps.weight", ....
/// A checkpoint without experts groups as group_layers does.
UnitGrouping group_experts(const io::Catalog& catalog);

/// What a unit is: the grouping presets by which the front ends choose.
enum class UnitPreset {
  layers,   ///< one unit per layer (group_layers)
  experts,  ///< a layer's dense tensors, then each of its experts (group_experts)
};

/// --units / units=: the unit presets by name.
inline constexpr std::array unit_preset_choices{Choice<UnitPreset>{"layers", UnitPreset::layers},
                                                Choice<UnitPreset>{"experts", UnitPreset::experts}};

/// The preset `name` names; throws Error(invalid_argument) listing the presets otherwise.
UnitPreset parse_unit_preset(std::string_view name);

/// `catalog` grouped by `preset` (group_layers or group_experts).
UnitGrouping group_units(const io::Catalog& catalog, UnitPreset preset);

}  // namespace eredu::app
