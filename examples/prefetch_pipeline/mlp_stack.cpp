#include "mlp_stack.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <span>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/engine/description/weight_binding.hpp"
#include "eredu/engine/description/weight_binding_plan.hpp"
#include "eredu/synth/safetensors_writer.hpp"
#include "eredu/synth/synthetic_checkpoint.hpp"

namespace eredu::example {
namespace {

constexpr float rms_eps = 1e-6f;

/// The block's tensors in file order, as synth::TensorSpec.
std::vector<synth::TensorSpec> layer_specs(const StackConfig& c, std::uint64_t layer) {
  return {{layer_key(layer, "post_attention_layernorm.weight"), c.dtype, {c.hidden}},
          {layer_key(layer, "mlp.gate_proj.weight"), c.dtype, {c.intermediate, c.hidden}},
          {layer_key(layer, "mlp.up_proj.weight"), c.dtype, {c.intermediate, c.hidden}},
          {layer_key(layer, "mlp.down_proj.weight"), c.dtype, {c.hidden, c.intermediate}}};
}

float widen(std::uint16_t bf16) noexcept { return std::bit_cast<float>(std::uint32_t{bf16} << 16); }
float widen(float f) noexcept { return f; }

/// Σ w[i]·x[i] with eight partial sums combined in a fixed order: vectorizable, and the same
/// bits whichever thread runs it.
template <class W>
float dot(const W* w, const float* x, std::size_t n) noexcept {
  float acc[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (std::size_t j = 0; j < 8; ++j) acc[j] += widen(w[i + j]) * x[i + j];
  for (; i < n; ++i) acc[i % 8] += widen(w[i]) * x[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

float silu(float v) noexcept { return v / (1.0f + std::exp(-v)); }

template <class W>
void apply(const MlpLayer& layer, Activations& a) {
  const std::size_t h = a.hidden, inter = layer.gate.shape.at(0), tokens = a.tokens;
  const W* norm = reinterpret_cast<const W*>(layer.norm.value.bytes().data());
  const W* gate = reinterpret_cast<const W*>(layer.gate.value.bytes().data());
  const W* up = reinterpret_cast<const W*>(layer.up.value.bytes().data());
  const W* down = reinterpret_cast<const W*>(layer.down.value.bytes().data());

  std::vector<float> xn(tokens * h), act(tokens * inter);
  for (std::size_t t = 0; t < tokens; ++t) {
    const float* x = a.x.data() + t * h;
    const float inv = 1.0f / std::sqrt(dot(x, x, h) / static_cast<float>(h) + rms_eps);
    for (std::size_t i = 0; i < h; ++i) xn[t * h + i] = x[i] * inv * widen(norm[i]);
  }
  // Row-outer, token-inner: a weight row is fetched from memory once and reused from cache
  // for every token, so the batch size is the compute-per-byte knob.
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, inter), [&](const tbb::blocked_range<std::size_t>& r) {
    for (std::size_t row = r.begin(); row != r.end(); ++row)
      for (std::size_t t = 0; t < tokens; ++t) {
        const float g = dot(gate + row * h, xn.data() + t * h, h);
        const float u = dot(up + row * h, xn.data() + t * h, h);
        act[t * inter + row] = silu(g) * u;
      }
  });
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, h), [&](const tbb::blocked_range<std::size_t>& r) {
    for (std::size_t row = r.begin(); row != r.end(); ++row)
      for (std::size_t t = 0; t < tokens; ++t)
        a.x[t * h + row] += dot(down + row * inter, act.data() + t * inter, inter);
  });
}

}  // namespace

StackConfig StackConfig::from_catalog(const io::Catalog& catalog) {
  StackConfig c;
  const io::TensorInfo& gate = catalog.at(layer_key(0, "mlp.gate_proj.weight"));
  if (gate.shape.size() != 2)
    throw Error(errc::invalid_argument, {.tensor = gate.name},
                fmt::format("the gate projection has rank {}, expected 2", gate.shape.size()));
  if (gate.dtype != DType::BF16 && gate.dtype != DType::F32)
    throw Error(errc::invalid_argument, {.tensor = gate.name},
                fmt::format("the example computes with BF16 or F32 weights, not {}", dtype_name(gate.dtype)));
  c.intermediate = gate.shape[0];
  c.hidden = gate.shape[1];
  c.dtype = gate.dtype;
  while (catalog.find(layer_key(c.layers, "mlp.gate_proj.weight"))) ++c.layers;
  return c;
}

std::uint64_t StackConfig::layer_bytes() const {
  return (hidden + 3 * hidden * intermediate) * (dtype == DType::F32 ? 4 : 2);
}

std::string layer_key(std::uint64_t layer, std::string_view leaf) {
  return fmt::format("model.layers.{}.{}", layer, leaf);
}

void write_stack_checkpoint(const std::filesystem::path& path, const StackConfig& config, std::uint64_t seed) {
  std::vector<synth::TensorSpec> specs;
  for (std::uint64_t i = 0; i < config.layers; ++i)
    for (synth::TensorSpec& s : layer_specs(config, i)) specs.push_back(std::move(s));
  synth::SafetensorsFileWriter writer(path, specs, {{"generator", "eredu prefetch_pipeline example"}});
  std::vector<std::byte> buffer(std::size_t{4} << 20);
  for (const synth::TensorSpec& spec : specs) {
    const std::uint64_t bytes = synth::tensor_nbytes(spec);
    for (std::uint64_t done = 0; done < bytes;) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), bytes - done));
      const std::span<std::byte> piece(buffer.data(), n);
      synth::fill_tensor_bytes(seed, spec, done, piece);
      writer.write(piece);
      done += n;
    }
  }
  writer.finish();
}

MlpLayer::MlpLayer(const StackConfig& c)
    : norm(c.dtype, {c.hidden}),
      gate(c.dtype, {c.intermediate, c.hidden}),
      up(c.dtype, {c.intermediate, c.hidden}),
      down(c.dtype, {c.hidden, c.intermediate}) {}

engine::PipelineUnit layer_unit(const io::Catalog& catalog, std::uint64_t layer) {
  auto bind = [&](const char* slot, std::string_view leaf) {
    std::string key = layer_key(layer, leaf);
    const std::uint64_t bytes = catalog.at(key).nbytes;
    return engine::WeightBinding::tensor(slot, std::move(key), Selection::all(), bytes);
  };
  std::vector<engine::WeightBinding> bindings{
      bind("norm.weight", "post_attention_layernorm.weight"), bind("gate.weight", "mlp.gate_proj.weight"),
      bind("up.weight", "mlp.up_proj.weight"), bind("down.weight", "mlp.down_proj.weight")};
  return {fmt::format("layers.{}", layer), engine::WeightBindingPlan(std::move(bindings))};
}

Activations Activations::initial(std::size_t tokens, std::size_t hidden) {
  Activations a{tokens, hidden, std::vector<float>(tokens * hidden)};
  for (std::size_t t = 0; t < tokens; ++t)
    for (std::size_t i = 0; i < hidden; ++i)
      a.x[t * hidden + i] = std::sin(0.37f * static_cast<float>(i) + 0.91f * static_cast<float>(t) + 0.1f);
  return a;
}

void apply_layer(const MlpLayer& layer, Activations& a) {
  if (layer.gate.dtype == DType::F32)
    apply<float>(layer, a);
  else
    apply<std::uint16_t>(layer, a);
}

}  // namespace eredu::example
