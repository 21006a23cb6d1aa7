// The unit grouping presets (app/unit_grouping.hpp) on checkpoints written to disk: a dense
// Llama-shaped one, mixture-of-experts ones with Mixtral's and Qwen-MoE's Hugging Face names, and
// a GGUF one with llama.cpp's stacked `_exps` tensors; and the presets' names.
#include <catch2/catch.hpp>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "eredu/app/unit_grouping.hpp"
#include "eredu/core/error.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "eredu/synth/gguf_writer.hpp"
#include "eredu/synth/safetensors_writer.hpp"
#include "support/temp_dir.hpp"

using namespace eredu;

namespace {

/// A checkpoint holding `names` (F32 [4, 2] each, zeros) written as `file` in `dir`; its catalog.
io::Catalog write_checkpoint(const test::TempDir& dir, const std::string& file, const std::vector<std::string>& names) {
  std::vector<synth::TensorSpec> specs;
  for (const std::string& n : names) specs.push_back({n, DType::F32, {4, 2}});
  const std::vector<std::byte> zeros(4 * 2 * 4);
  const std::vector<std::span<const std::byte>> data(specs.size(), zeros);
  const std::filesystem::path path = dir / file;
  if (file.ends_with(".gguf"))
    synth::write_gguf(path, specs, data);
  else
    synth::write_safetensors(path, specs, data);
  return io::open_catalog(path);
}

/// Each unit's name and its (tensor, slot) pairs, in order.
using Units = std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>>;
Units units_of(const app::UnitGrouping& g) {
  Units out;
  for (const app::UnitGroup& u : g.units) {
    std::vector<std::pair<std::string, std::string>> members;
    for (const app::TensorRequest& r : u.requests) members.emplace_back(r.key, r.name);
    out.emplace_back(u.name, std::move(members));
  }
  return out;
}

}  // namespace

TEST_CASE("unit presets – experts: one unit per Hugging Face expert, after its layer's dense tensors", "[app][units]") {
  test::TempDir dir;
  // Mixtral's names, written out of order: the preset orders by layer, then expert number.
  const io::Catalog catalog = write_checkpoint(dir, "mixtral.safetensors",
                                               {
                                                   "model.embed_tokens.weight",
                                                   "model.layers.1.block_sparse_moe.experts.10.w1.weight",
                                                   "model.layers.1.block_sparse_moe.experts.2.w1.weight",
                                                   "model.layers.1.block_sparse_moe.experts.2.w2.weight",
                                                   "model.layers.1.block_sparse_moe.gate.weight",
                                                   "model.layers.1.self_attn.q_proj.weight",
                                                   "model.layers.0.block_sparse_moe.experts.0.w3.weight",
                                                   "model.layers.0.input_layernorm.weight",
                                                   "model.norm.weight",
                                               });
  const app::UnitGrouping g = app::group_experts(catalog);
  const std::string e = "model.layers.1.block_sparse_moe.experts.";
  CHECK(units_of(g) == Units{{"model.layers.0", {{"model.layers.0.input_layernorm.weight", "input_layernorm.weight"}}},
                             {"model.layers.0.block_sparse_moe.experts.0",
                              {{"model.layers.0.block_sparse_moe.experts.0.w3.weight", "w3.weight"}}},
                             {"model.layers.1",
                              {{"model.layers.1.block_sparse_moe.gate.weight", "block_sparse_moe.gate.weight"},
                               {"model.layers.1.self_attn.q_proj.weight", "self_attn.q_proj.weight"}}},
                             {e + "2", {{e + "2.w1.weight", "w1.weight"}, {e + "2.w2.weight", "w2.weight"}}},
                             {e + "10", {{e + "10.w1.weight", "w1.weight"}}}});
  CHECK(g.skipped == std::vector<std::string>{"model.embed_tokens.weight", "model.norm.weight"});
  CHECK((g.grouped_tensors == 7 && g.skipped_bytes == 2 * 32));
  CHECK(g.units[3].bytes == 2 * 32);
  // The layers preset keeps each layer whole, experts included.
  const app::UnitGrouping layers = app::group_layers(catalog);
  REQUIRE(layers.units.size() == 2);
  CHECK((layers.units[1].name == "model.layers.1" && layers.units[1].requests.size() == 5));
  CHECK(layers.units[1].requests[0].name == "block_sparse_moe.experts.10.w1.weight");
}

TEST_CASE("unit presets – experts: Qwen-MoE's experts split, its shared expert and router stay in the layer",
          "[app][units]") {
  test::TempDir dir;
  const io::Catalog catalog = write_checkpoint(dir, "qwen.safetensors",
                                               {
                                                   "model.layers.0.mlp.gate.weight",
                                                   "model.layers.0.mlp.experts.0.gate_proj.weight",
                                                   "model.layers.0.mlp.experts.0.down_proj.weight",
                                                   "model.layers.0.mlp.experts.1.up_proj.weight",
                                                   "model.layers.0.mlp.shared_expert.up_proj.weight",
                                                   "model.layers.0.mlp.shared_experts.up_proj.weight",
                                                   "model.layers.0.mlp.shared_expert_gate.weight",
                                                   // Not an expert: no number, or nothing after it.
                                                   "model.layers.0.mlp.experts.x.weight",
                                               });
  const app::UnitGrouping g = app::group_experts(catalog);
  REQUIRE(g.units.size() == 3);
  CHECK(g.units[0].name == "model.layers.0");
  std::vector<std::string> dense;
  for (const app::TensorRequest& r : g.units[0].requests) dense.push_back(r.name);
  CHECK(dense == std::vector<std::string>{"mlp.gate.weight", "mlp.shared_expert.up_proj.weight",
                                          "mlp.shared_experts.up_proj.weight", "mlp.shared_expert_gate.weight",
                                          "mlp.experts.x.weight"});
  CHECK(units_of(g)[1] == Units::value_type{"model.layers.0.mlp.experts.0",
                                            {{"model.layers.0.mlp.experts.0.gate_proj.weight", "gate_proj.weight"},
                                             {"model.layers.0.mlp.experts.0.down_proj.weight", "down_proj.weight"}}});
  CHECK(g.units[2].name == "model.layers.0.mlp.experts.1");
  CHECK(g.skipped.empty());
}

TEST_CASE("unit presets – experts: a GGUF layer's stacked _exps tensors are one unit beside the layer's",
          "[app][units]") {
  test::TempDir dir;
  const io::Catalog catalog = write_checkpoint(dir, "moe.gguf",
                                               {
                                                   "token_embd.weight",
                                                   "blk.0.attn_q.weight",
                                                   "blk.0.ffn_gate_inp.weight",
                                                   "blk.0.ffn_gate_exps.weight",
                                                   "blk.0.ffn_up_exps.weight",
                                                   "blk.0.ffn_down_exps.weight",
                                                   "blk.0.ffn_up_shexp.weight",
                                                   "blk.1.ffn_down_exps.weight",
                                                   "output.weight",
                                               });
  CHECK(units_of(app::group_experts(catalog)) ==
        Units{{"blk.0",
               {{"blk.0.attn_q.weight", "attn_q.weight"},
                {"blk.0.ffn_gate_inp.weight", "ffn_gate_inp.weight"},
                {"blk.0.ffn_up_shexp.weight", "ffn_up_shexp.weight"}}},
              {"blk.0.experts",
               {{"blk.0.ffn_gate_exps.weight", "ffn_gate_exps.weight"},
                {"blk.0.ffn_up_exps.weight", "ffn_up_exps.weight"},
                {"blk.0.ffn_down_exps.weight", "ffn_down_exps.weight"}}},
              {"blk.1.experts", {{"blk.1.ffn_down_exps.weight", "ffn_down_exps.weight"}}}});
  CHECK(app::group_experts(catalog).skipped == std::vector<std::string>{"token_embd.weight", "output.weight"});
  // The layers preset: one unit per blk.N, experts inside.
  const app::UnitGrouping layers = app::group_layers(catalog);
  REQUIRE(layers.units.size() == 2);
  CHECK((layers.units[0].requests.size() == 6 && layers.units[1].name == "blk.1"));
}

TEST_CASE("unit presets – a dense checkpoint groups alike under both presets", "[app][units]") {
  test::TempDir dir;
  const io::Catalog catalog =
      write_checkpoint(dir, "dense.safetensors",
                       {"model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.up_proj.weight",
                        "model.layers.0.self_attn.q_proj.weight", "lm_head.weight"});
  const app::UnitGrouping layers = app::group_layers(catalog), experts = app::group_experts(catalog);
  CHECK(units_of(layers) == units_of(experts));
  CHECK((layers.skipped == experts.skipped && layers.units.size() == 2));
  CHECK(units_of(app::group_units(catalog, app::UnitPreset::layers)) == units_of(layers));
}

TEST_CASE("unit presets – by name: one parser, a typed error listing the presets", "[app][units]") {
  CHECK(app::parse_unit_preset("layers") == app::UnitPreset::layers);
  CHECK(app::parse_unit_preset("experts") == app::UnitPreset::experts);
  for (const char* bad : {"", "Layers", "expert", "blk"}) {
    CAPTURE(bad);
    try {
      app::parse_unit_preset(bad);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.kind() == errc::invalid_argument);
      CHECK(e.detail() == fmt::format("units must be layers or experts, not '{}'", bad));
    }
  }
}
