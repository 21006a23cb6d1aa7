#include "forward.hpp"

#include <cstring>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>

#include "eredu/cpu/float_formats.hpp"
#include "eredu/io/integrity/sha256.hpp"

namespace eredu::example {
namespace {

/// y = W·x, one dot() per row of the row-major `w`.
std::vector<float> matvec(std::span<const float> w, std::span<const float> x) {
  std::vector<float> y(w.size() / x.size());
  for (std::size_t r = 0; r < y.size(); ++r) y[r] = dot(w.data() + r * x.size(), x.data(), x.size());
  return y;
}

std::span<const float> floats(const cpu::Parameter& p) { return p.value.as<float>(); }

/// Tensor `name` widened from BF16 to F32 with the scalar conversion.
std::vector<float> read_f32(const io::Catalog& catalog, const std::string& name) {
  if (catalog.at(name).dtype != DType::BF16) throw std::runtime_error(fmt::format("'{}' is not BF16", name));
  const std::vector<std::byte> raw = read_bytes(catalog, name);
  std::vector<float> out(raw.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::uint16_t h;
    std::memcpy(&h, raw.data() + 2 * i, 2);
    out[i] = cpu::bf16_to_f32(h);
  }
  return out;
}

/// The rows of `parts`, one after the other (a concat along dim 0).
std::vector<float> rows_of(std::initializer_list<std::vector<float>> parts) {
  std::vector<float> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

}  // namespace

Weights Weights::of(const Model& model) {
  Weights w;
  w.hidden = model.norm.shape.at(0);
  w.embed = model.embed.value.as<std::uint16_t>();
  for (const Block& b : model.layers)
    w.layers.push_back(
        {floats(b.attn_norm), floats(b.qkv), floats(b.o), floats(b.mlp_norm), floats(b.gate_up), floats(b.down)});
  w.norm = floats(model.norm);
  return w;
}

std::vector<float> forward(const Weights& w, std::uint32_t token) {
  const std::size_t h = w.hidden;
  std::vector<float> x(h);
  for (std::size_t i = 0; i < h; ++i) x[i] = cpu::bf16_to_f32(w.embed[token * h + i]);
  for (const BlockWeights& b : w.layers) {
    const std::vector<float> qkv = matvec(b.qkv, rms_norm(x, b.attn_norm));
    const std::vector<float> attn = matvec(b.o, std::span<const float>(qkv).first(h));
    for (std::size_t i = 0; i < h; ++i) x[i] += attn[i];
    const std::vector<float> gu = matvec(b.gate_up, rms_norm(x, b.mlp_norm));
    const std::size_t inter = gu.size() / 2;
    std::vector<float> act(inter);
    for (std::size_t i = 0; i < inter; ++i) act[i] = silu(gu[i]) * gu[inter + i];
    const std::vector<float> mlp = matvec(b.down, act);
    for (std::size_t i = 0; i < h; ++i) x[i] += mlp[i];
  }
  return rms_norm(x, w.norm);
}

std::string weight_tag(const Weights& w) {
  io::Sha256 sha;
  auto add = [&sha](auto span) { sha.update(std::as_bytes(span)); };
  add(w.embed);
  for (const BlockWeights& b : w.layers)
    for (auto s : {b.attn_norm, b.qkv, b.o, b.mlp_norm, b.gate_up, b.down}) add(s);
  add(w.norm);
  return sha.hex_digest();
}

std::uint64_t hash_floats(std::span<const float> v) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::byte b : std::as_bytes(v)) h = (h ^ static_cast<std::uint64_t>(b)) * 1099511628211ull;
  return h;
}

std::vector<std::byte> read_bytes(const io::Catalog& catalog, const std::string& name) {
  const io::TensorInfo& t = catalog.at(name);
  std::vector<std::byte> out(t.nbytes);
  std::ifstream file(catalog.file_of(t).path, std::ios::binary);
  file.seekg(static_cast<std::streamoff>(t.offset));
  file.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size()));
  if (!file) throw std::runtime_error(fmt::format("cannot read '{}' from {}", name, catalog.file_of(t).path));
  return out;
}

ReferenceWeights::ReferenceWeights(const io::Catalog& catalog, const ModelConfig& config) : hidden_(config.hidden) {
  const std::vector<std::byte> embed = read_bytes(catalog, "model.embed_tokens.weight");
  embed_.resize(embed.size() / 2);
  std::memcpy(embed_.data(), embed.data(), embed.size());
  for (std::uint64_t l = 0; l < config.layers; ++l) {
    auto t = [&](const char* leaf) { return read_f32(catalog, fmt::format("model.layers.{}.{}", l, leaf)); };
    layers_.push_back(
        {t("input_layernorm.weight"),
         rows_of({t("self_attn.q_proj.weight"), t("self_attn.k_proj.weight"), t("self_attn.v_proj.weight")}),
         t("self_attn.o_proj.weight"), t("post_attention_layernorm.weight"),
         rows_of({t("mlp.gate_proj.weight"), t("mlp.up_proj.weight")}), t("mlp.down_proj.weight")});
  }
  norm_ = read_f32(catalog, "model.norm.weight");
}

Weights ReferenceWeights::view() const {
  Weights w;
  w.hidden = hidden_;
  w.embed = embed_;
  for (const Block& b : layers_) w.layers.push_back({b.attn_norm, b.qkv, b.o, b.mlp_norm, b.gate_up, b.down});
  w.norm = norm_;
  return w;
}

}  // namespace eredu::example
