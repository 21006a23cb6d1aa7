#pragma once
/// \file
/// Unit grouping presets: how a checkpoint's tensors become the units a prefetch pipeline
/// streams. The "layers" preset makes one unit per transformer layer — Hugging Face names
/// (`model.layers.12.mlp.up_proj.weight`) and llama.cpp's GGUF names (`blk.12.ffn_up.weight`)
/// alike — so that `eredu pipeline` and Python's `eredu.prefetch` stream the same units.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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

}  // namespace eredu::app
