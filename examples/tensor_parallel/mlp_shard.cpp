#include "mlp_shard.hpp"

#include <cmath>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "eredu/io/integrity/checksums.hpp"
#include "eredu/io/integrity/sha256.hpp"
#include "eredu/synth/synthetic_checkpoint.hpp"

namespace eredu::example {
namespace {

// The arithmetic both the ranks and the reference run. Not inlined: one compiled body per
// function, so the compiler cannot contract or reorder it differently at different call
// sites, and equal inputs give equal bits wherever it is called.

/// Σ a[i]·b[i], left to right.
[[gnu::noinline]] float dot(const float* a, const float* b, std::size_t n) {
  float s = 0;
  for (std::size_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

/// rmsnorm(x) ⊙ w, ε = 1e-5.
[[gnu::noinline]] std::vector<float> rms_norm(std::span<const float> x, std::span<const float> w) {
  const float scale = 1.0f / std::sqrt(dot(x.data(), x.data(), x.size()) / static_cast<float>(x.size()) + 1e-5f);
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = x[i] * scale * w[i];
  return out;
}

/// silu(g)·u for rows [0, rows) of `gate` and `up` (each [rows, n]) applied to `xn`.
[[gnu::noinline]] std::vector<float> activation(const float* gate, const float* up, std::size_t rows,
                                                std::span<const float> xn) {
  std::vector<float> a(rows);
  for (std::size_t j = 0; j < rows; ++j) {
    const float g = dot(gate + j * xn.size(), xn.data(), xn.size());
    const float u = dot(up + j * xn.size(), xn.data(), xn.size());
    a[j] = g / (1.0f + std::exp(-g)) * u;
  }
  return a;
}

/// Tensor `name`'s F32 values, read with an ifstream from its shard file.
std::vector<float> read_f32(const io::Catalog& catalog, const std::string& name) {
  const io::TensorInfo& t = catalog.at(name);
  if (t.dtype != DType::F32) throw std::runtime_error(fmt::format("'{}' is not F32", name));
  std::vector<float> out(t.nbytes / sizeof(float));
  std::ifstream file(catalog.file_of(t).path, std::ios::binary);
  file.seekg(static_cast<std::streamoff>(t.offset));
  file.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(t.nbytes));
  if (!file) throw std::runtime_error(fmt::format("cannot read '{}' from {}", name, catalog.file_of(t).path));
  return out;
}

/// Slot `name` of `m` as floats; throws when the version lacks it.
std::span<const float> slot(const Module& m, const std::string& name) {
  const cpu::Parameter* p = m.find(name);
  if (p == nullptr) throw Error(errc::tensor_not_found, {.tensor = name}, "the loaded shard has no such slot");
  return p->value.as<float>();
}

}  // namespace

std::string layer_key(std::uint64_t layer, std::string_view leaf) {
  return fmt::format("model.layers.{}.{}", layer, leaf);
}

std::vector<synth::TensorSpec> stack_tensors(const StackDims& d) {
  std::vector<synth::TensorSpec> t;
  for (std::uint64_t l = 0; l < d.layers; ++l) {
    t.push_back({layer_key(l, "post_attention_layernorm.weight"), DType::F32, {d.hidden}});
    t.push_back({layer_key(l, "mlp.gate_proj.weight"), DType::F32, {d.inter, d.hidden}});
    t.push_back({layer_key(l, "mlp.up_proj.weight"), DType::F32, {d.inter, d.hidden}});
    t.push_back({layer_key(l, "mlp.down_proj.weight"), DType::F32, {d.hidden, d.inter}});
  }
  t.push_back({"model.norm.weight", DType::F32, {d.hidden}});
  return t;
}

void write_checkpoint(const std::filesystem::path& dir, const StackDims& dims, std::uint64_t seed,
                      std::uint32_t shards) {
  const std::vector<synth::TensorSpec> tensors = stack_tensors(dims);
  std::vector<std::vector<std::byte>> data;
  io::Checksums sums;
  for (const synth::TensorSpec& t : tensors) {
    std::vector<std::byte>& bytes = data.emplace_back(synth::tensor_nbytes(t));
    synth::fill_tensor_bytes(seed, t, 0, bytes);
    sums.add(t.name, io::sha256_hex(bytes));
  }
  // The transformers layout: model-0000i-of-0000n.safetensors and the index naming each
  // tensor's shard, which CheckpointSource::open(dir) follows.
  std::filesystem::create_directories(dir);
  const std::vector<std::size_t> starts = synth::split_evenly(tensors, shards);
  for (std::size_t s = 0; s < starts.size(); ++s) {
    const std::size_t end = s + 1 < starts.size() ? starts[s + 1] : tensors.size();
    std::vector<std::span<const std::byte>> spans(data.begin() + static_cast<std::ptrdiff_t>(starts[s]),
                                                  data.begin() + static_cast<std::ptrdiff_t>(end));
    synth::write_safetensors(dir / synth::shard_file_name(s, starts.size()),
                             std::span(tensors).subspan(starts[s], end - starts[s]), spans, {{"format", "pt"}});
  }
  synth::write_text_file(dir / "model.safetensors.index.json", synth::sharded_index_json(tensors, starts));
  synth::write_text_file(io::Checksums::sidecar_path(dir), sums.to_json());
}

void corrupt_tensor(const std::filesystem::path& dir, const std::string& name) {
  const io::Catalog catalog = io::open_catalog(dir);
  const io::TensorInfo& t = catalog.at(name);
  const std::string path = catalog.file_of(t).path;
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(static_cast<std::streamoff>(t.offset + t.nbytes / 2));
  file.write("\x5a\x5a\x5a\x5a", 4);
  if (!file) throw Error(errc::io_error, {.file = path}, "cannot write the corrupt copy");
}

engine::ShardingRules stack_rules() {
  engine::ShardingRules rules;
  rules
      .add("*.mlp.gate_proj.weight", engine::Shard::column_parallel())  // [inter, hidden]: rows
      .add("*.mlp.up_proj.weight", engine::Shard::column_parallel())
      .add("*.mlp.down_proj.weight", engine::Shard::row_parallel())  // [hidden, inter]: columns
      .add("*norm.weight", engine::Shard::replicated())
      .otherwise(std::nullopt);  // a tensor no rule names is an error, not silently replicated
  return rules;
}

std::vector<float> step_input(std::size_t hidden) {
  std::vector<float> x(hidden);
  for (std::size_t i = 0; i < hidden; ++i) x[i] = std::sin(0.37f * static_cast<float>(i) + 0.1f);
  return x;
}

std::vector<float> forward_shard(const Module& m, const StackDims& dims, std::span<const float> input,
                                 const ReducePartial& reduce) {
  std::vector<float> x(input.begin(), input.end());
  for (std::uint64_t l = 0; l < dims.layers; ++l) {
    const std::span<const float> gate = slot(m, layer_key(l, "mlp.gate_proj.weight"));  // [inter/N, hidden]
    const std::span<const float> up = slot(m, layer_key(l, "mlp.up_proj.weight"));
    const std::span<const float> down = slot(m, layer_key(l, "mlp.down_proj.weight"));  // [hidden, inter/N]
    const std::vector<float> xn = rms_norm(x, slot(m, layer_key(l, "post_attention_layernorm.weight")));
    const std::size_t local = gate.size() / dims.hidden;  // this rank's inner rows
    const std::vector<float> a = activation(gate.data(), up.data(), local, xn);
    std::vector<float> partial(dims.hidden);
    for (std::size_t i = 0; i < dims.hidden; ++i) partial[i] = dot(down.data() + i * local, a.data(), local);
    reduce(partial);  // the row-parallel output: the sum of every rank's partial
    for (std::size_t i = 0; i < dims.hidden; ++i) x[i] += partial[i];
  }
  return rms_norm(x, slot(m, "model.norm.weight"));
}

ReferenceStack::ReferenceStack(const io::Catalog& catalog, const StackDims& dims) : dims_(dims) {
  for (std::uint64_t l = 0; l < dims.layers; ++l)
    layers_.push_back({read_f32(catalog, layer_key(l, "post_attention_layernorm.weight")),
                       read_f32(catalog, layer_key(l, "mlp.gate_proj.weight")),
                       read_f32(catalog, layer_key(l, "mlp.up_proj.weight")),
                       read_f32(catalog, layer_key(l, "mlp.down_proj.weight"))});
  norm_ = read_f32(catalog, "model.norm.weight");
}

std::vector<float> ReferenceStack::forward(std::span<const float> input, int ranks) const {
  const std::size_t h = dims_.hidden, inter = dims_.inter;
  std::vector<float> x(input.begin(), input.end());
  for (const Block& b : layers_) {
    const std::vector<float> xn = rms_norm(x, b.norm);
    // All of the inner activations at once: each is one row's dot product, the same
    // arithmetic whichever rank holds the row.
    const std::vector<float> a = activation(b.gate.data(), b.up.data(), inter, xn);
    for (std::size_t i = 0; i < h; ++i) {
      // Row i of down, cut where the ranks cut it; the pieces summed in rank order.
      float sum = 0;
      for (int r = 0; r < ranks; ++r) {
        const Range cut = engine::shard_range(inter, 1, r, ranks, "mlp.down_proj.weight");
        const float piece = dot(b.down.data() + i * inter + cut.start, a.data() + cut.start, cut.stop - cut.start);
        sum = r == 0 ? piece : sum + piece;
      }
      x[i] += sum;
    }
  }
  return rms_norm(x, norm_);
}

}  // namespace eredu::example
