#include "eredu/synth/synthetic_gguf.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>

#include "eredu/core/error.hpp"
#include "eredu/io/formats/split_gguf.hpp"

namespace eredu::synth {
namespace {

// llama.cpp's LLAMA_FTYPE for a model mostly in `t`, where it has one.
std::optional<std::uint32_t> file_type_of(DType t) {
  switch (t) {
    case DType::F32:
      return 0;
    case DType::F16:
      return 1;
    case DType::Q4_0:
      return 2;
    case DType::Q4_1:
      return 3;
    case DType::Q8_0:
      return 7;
    case DType::Q5_0:
      return 8;
    case DType::Q5_1:
      return 9;
    case DType::Q2_K:
      return 10;
    case DType::Q3_K:
      return 12;
    case DType::Q4_K:
      return 15;
    case DType::Q5_K:
      return 17;
    case DType::Q6_K:
      return 18;
    case DType::IQ2_XXS:
      return 19;
    case DType::IQ2_XS:
      return 20;
    case DType::IQ3_XXS:
      return 23;
    case DType::IQ1_S:
      return 24;
    case DType::IQ4_NL:
      return 25;
    case DType::IQ3_S:
      return 26;
    case DType::IQ2_S:
      return 28;
    case DType::IQ4_XS:
      return 30;
    case DType::IQ1_M:
      return 31;
    case DType::BF16:
      return 32;
    case DType::TQ1_0:
      return 36;
    case DType::TQ2_0:
      return 37;
    case DType::MXFP4:
      return 38;
    default:
      return std::nullopt;
  }
}

// llama.cpp's name for a safetensors-style synthetic tensor name.
std::string gguf_name(const std::string& name) {
  static const std::pair<std::string_view, std::string_view> leaves[] = {
      {"input_layernorm.weight", "attn_norm.weight"},    {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"}, {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},       {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  if (name == "model.embed_tokens.weight") return "token_embd.weight";
  if (name == "model.norm.weight") return "output_norm.weight";
  if (name == "lm_head.weight") return "output.weight";
  constexpr std::string_view layers = "model.layers.";
  const auto dot = name.find('.', layers.size());
  const std::string index = name.substr(layers.size(), dot - layers.size());
  const std::string_view leaf = std::string_view(name).substr(dot + 1);
  for (const auto& [from, to] : leaves) {
    if (leaf == from) return fmt::format("blk.{}.{}", index, to);
  }
  return name;
}

}  // namespace

SyntheticModel plan_gguf_model(const SyntheticOptions& options) {
  const DType t = options.dtype;
  if (!io::gguf::ggml_type_of(t)) {
    throw Error(errc::invalid_argument, {}, fmt::format("GGUF cannot hold {} tensors", dtype_name(t)));
  }
  if (!dtype_is_quantized(t) && t != DType::F16 && t != DType::BF16 && t != DType::F32) {
    throw Error(errc::invalid_argument, {},
                fmt::format("synthetic GGUF weights are F16, BF16, F32 or quantized, not {}", dtype_name(t)));
  }
  // Plan in F16, scaled so that the chosen dtype's bytes hit the target.
  const DTypeBlock block = dtype_block(t);
  SyntheticOptions f16 = options;
  f16.dtype = DType::F16;
  f16.target_bytes = std::max<std::uint64_t>(
      1, static_cast<std::uint64_t>(static_cast<double>(options.target_bytes) * 2.0 * block.elements / block.bytes));
  SyntheticModel m = plan_model(f16);
  for (auto& spec : m.tensors) {
    spec.name = gguf_name(spec.name);
    const bool norm = spec.shape.size() == 1;
    spec.dtype = norm ? DType::F32 : (block_shape_error(spec.shape, t).empty() ? t : DType::F16);
  }
  m.total_bytes = total_nbytes(m.tensors);
  return m;
}

std::vector<GgufKeyValue> synthetic_gguf_metadata(const SyntheticModel& m, const SyntheticOptions& options) {
  std::vector<GgufKeyValue> kv;
  kv.push_back({"general.architecture", gguf_string("llama")});
  kv.push_back({"general.name", gguf_string(fmt::format("eredu synthetic llama (seed {})", options.seed))});
  if (auto ft = file_type_of(options.dtype)) kv.push_back({"general.file_type", gguf_u32(*ft)});
  kv.push_back({"general.alignment", gguf_u32(io::gguf::default_alignment)});
  kv.push_back({"llama.block_count", gguf_u32(m.layers)});
  kv.push_back({"llama.context_length", gguf_u32(4096)});
  kv.push_back({"llama.embedding_length", gguf_u32(m.hidden)});
  kv.push_back({"llama.feed_forward_length", gguf_u32(m.intermediate)});
  kv.push_back({"llama.attention.head_count", gguf_u32(m.heads)});
  kv.push_back({"llama.attention.head_count_kv", gguf_u32(m.kv_heads)});
  kv.push_back({"llama.attention.layer_norm_rms_epsilon", gguf_f32(1e-5f)});
  kv.push_back({"llama.vocab_size", gguf_u32(m.vocab)});
  return kv;
}

void fill_gguf_tensor_bytes(std::uint64_t seed, const TensorSpec& tensor, std::uint64_t byte_offset,
                            std::span<std::byte> out) {
  if (dtype_is_quantized(tensor.dtype)) {
    fill_quantized_bytes(seed, tensor, byte_offset, out);
  } else {
    fill_tensor_bytes(seed, tensor, byte_offset, out);
  }
}

void write_synthetic_gguf(const std::filesystem::path& out, const SyntheticOptions& options, ProgressFn progress) {
  if (options.shards == 0) throw Error(errc::invalid_argument, {.file = out.string()}, "shards must be at least 1");
  const SyntheticModel model = plan_gguf_model(options);
  const std::span<const TensorSpec> tensors = model.tensors;
  const std::vector<GgufKeyValue> meta = synthetic_gguf_metadata(model, options);
  std::vector<std::size_t> starts{0};
  std::filesystem::path dir = out;
  std::error_code ec;
  if (options.shards > 1) {
    starts = split_evenly(tensors, options.shards);
    std::filesystem::create_directories(out, ec);
    if (ec) throw Error(errc::io_error, {.file = out.string(), .os_error = ec}, "cannot create the directory");
  }
  std::vector<std::byte> buffer(std::size_t{4} << 20);
  std::uint64_t done = 0;
  for (std::size_t s = 0; s < starts.size(); ++s) {
    const std::size_t first = starts[s], last = s + 1 < starts.size() ? starts[s + 1] : tensors.size();
    std::filesystem::path path;
    std::vector<GgufKeyValue> kv;
    if (options.shards > 1) {
      path = dir / io::gguf::split_file_name("model", static_cast<std::uint32_t>(s + 1), options.shards);
      if (s == 0) kv = meta;
      kv.push_back({std::string(io::gguf::split_no_key), gguf_u16(static_cast<std::uint16_t>(s))});
      kv.push_back({std::string(io::gguf::split_count_key), gguf_u16(static_cast<std::uint16_t>(options.shards))});
      kv.push_back(
          {std::string(io::gguf::split_tensors_count_key), gguf_i32(static_cast<std::int32_t>(tensors.size()))});
    } else {
      path = std::filesystem::is_directory(out, ec) ? out / "model.gguf" : out;
      kv = meta;
    }
    GgufFileWriter writer(path, tensors.subspan(first, last - first), kv);
    for (std::size_t i = first; i < last; ++i) {
      const std::uint64_t n = tensor_nbytes(tensors[i]);
      for (std::uint64_t at = 0; at < n; at += buffer.size()) {
        const auto len = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), n - at));
        const std::span<std::byte> chunk(buffer.data(), len);
        fill_gguf_tensor_bytes(options.seed, tensors[i], at, chunk);
        writer.write(chunk);
        done += len;
        if (progress) progress(done, model.total_bytes);
      }
    }
    writer.finish();
  }
}

}  // namespace eredu::synth
