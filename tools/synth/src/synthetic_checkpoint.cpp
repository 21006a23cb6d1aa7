#include "eredu/synth/synthetic_checkpoint.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "eredu/core/error.hpp"

namespace eredu::synth {
namespace {

static_assert(std::endian::native == std::endian::little,
              "generated words are stored as host bytes and must read back little-endian");

// ---------------------------------------------------------------------------------------
// Planning
// ---------------------------------------------------------------------------------------

constexpr std::uint64_t default_vocab = 32000;
constexpr std::uint64_t min_vocab = 64;
// Far beyond any real model; keeps the tensor list (9 per layer) a sane size.
constexpr std::uint32_t max_layers = 4096;

struct Dims {
  std::uint64_t hidden = 0;
  std::uint64_t intermediate = 0;
  std::uint64_t heads = 0;
  std::uint64_t kv_heads = 0;
  std::uint64_t head_dim = 0;
  std::uint64_t vocab = 0;
  std::uint64_t layers = 0;
};

std::uint64_t element_bytes(DType dtype) {
  switch (dtype) {
    case DType::BF16:
    case DType::F16:
      return 2;
    case DType::F32:
      return 4;
    default:
      throw Error(errc::invalid_argument, {},
                  fmt::format("synthetic checkpoints are BF16, F16 or F32, not {}", dtype_name(dtype)));
  }
}

// Attention and MLP shapes for a hidden size, as Llama-family models choose them: small
// models use 64-wide heads, large ones 128; many heads share key/value heads (GQA).
Dims dims_for_hidden(std::uint64_t hidden) {
  Dims d;
  d.hidden = hidden;
  d.head_dim = hidden <= 2048 ? 64 : 128;
  d.heads = std::max<std::uint64_t>(1, hidden / d.head_dim);
  if (d.heads >= 32 && d.heads % 8 == 0) {
    d.kv_heads = d.heads / 8;
  } else if (d.heads >= 16 && d.heads % 4 == 0) {
    d.kv_heads = d.heads / 4;
  } else {
    d.kv_heads = d.heads;
  }
  // SwiGLU keeps the MLP's parameter count near a 4x MLP: 8/3 of hidden, rounded to 256.
  std::uint64_t inter = (hidden * 8 / 3 + 128) / 256 * 256;
  d.intermediate = std::max<std::uint64_t>(256, inter);
  return d;
}

std::uint64_t layer_elements(const Dims& d) {
  const std::uint64_t h = d.hidden;
  return 2 * h                              // the two norms
         + 2 * h * h                        // q_proj, o_proj
         + 2 * d.kv_heads * d.head_dim * h  // k_proj, v_proj
         + 3 * h * d.intermediate;          // gate, up, down
}

// In floating point: candidates far from the target must not wrap around to look close.
double model_elements(const Dims& d, std::uint64_t embeddings) {
  return static_cast<double>(embeddings * d.vocab * d.hidden) +
         static_cast<double>(d.layers) * static_cast<double>(layer_elements(d)) + static_cast<double>(d.hidden);
}

std::uint64_t round_to(double x, std::uint64_t multiple) {
  if (x <= 0) return 0;
  return static_cast<std::uint64_t>(std::llround(x / static_cast<double>(multiple))) * multiple;
}

struct Candidate {
  Dims dims;
  double error = 0;  // |total - target| / target
  double shape = 0;  // how far layers is from what models of this width use
};

Candidate plan_for_hidden(std::uint64_t hidden, std::uint64_t target_elements, const SyntheticOptions& options) {
  Dims d = dims_for_hidden(hidden);
  const std::uint64_t embeddings = options.tie_embeddings ? 1 : 2;
  const double target = static_cast<double>(target_elements);
  // Small models cannot afford a 32000-token vocabulary: cap the embeddings at a third of
  // the budget and let the vocabulary absorb what whole layers leave over. A pinned layer
  // count leaves only the vocabulary to fine-tune the size with, whatever the model size.
  bool small_vocab = static_cast<double>(embeddings * default_vocab * hidden) > target / 3;
  d.vocab = small_vocab ? std::max(min_vocab, round_to(target / 3 / static_cast<double>(embeddings * hidden), 64))
                        : default_vocab;
  if (options.layers != 0) {
    d.layers = options.layers;
  } else {
    double rest = target - static_cast<double>(embeddings * d.vocab * hidden + hidden);
    d.layers = std::clamp<std::uint64_t>(round_to(rest / static_cast<double>(layer_elements(d)), 1), 1, max_layers);
  }
  const std::uint64_t natural_vocab = d.vocab;
  if (small_vocab || options.layers != 0) {
    double rest =
        target - static_cast<double>(d.layers) * static_cast<double>(layer_elements(d)) - static_cast<double>(hidden);
    d.vocab = std::clamp(round_to(rest / static_cast<double>(embeddings * hidden), 64), min_vocab, default_vocab);
  }
  Candidate c;
  c.dims = d;
  c.error = std::abs(model_elements(d, embeddings) - target) / target;
  // Llama-family depth grows with width: 16 layers at 2048, 32 at 4096; and the vocabulary
  // should stay what the size affords rather than shrink to fill a gap.
  double ideal_layers = std::max(4.0, static_cast<double>(hidden) / 128);
  c.shape = std::abs(std::log(static_cast<double>(d.layers) / ideal_layers)) +
            std::abs(std::log(static_cast<double>(d.vocab) / static_cast<double>(natural_vocab)));
  return c;
}

std::string layer_name(std::uint64_t layer, std::string_view leaf) {
  return fmt::format("model.layers.{}.{}", layer, leaf);
}

// ---------------------------------------------------------------------------------------
// Generation
// ---------------------------------------------------------------------------------------

constexpr std::uint64_t golden = 0x9E3779B97F4A7C15ull;

// splitmix64's finalizer: a counter fed through it is a good, very cheap random stream.
constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::uint64_t fnv1a64(std::string_view s) noexcept {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001B3ull;
  }
  return h;
}

std::uint16_t float_to_bf16(float f) noexcept {
  auto bits = std::bit_cast<std::uint32_t>(f);
  bits += 0x7FFF + ((bits >> 16) & 1);  // round to nearest even; inputs are finite
  return static_cast<std::uint16_t>(bits >> 16);
}

// IEEE binary16, round to nearest even; inputs are finite and far below 65504.
std::uint16_t float_to_f16(float f) noexcept {
  auto bits = std::bit_cast<std::uint32_t>(f);
  auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000);
  int exp = static_cast<int>((bits >> 23) & 0xFF) - 127 + 15;
  std::uint32_t mant = bits & 0x7FFFFF;
  if (exp >= 31) return static_cast<std::uint16_t>(sign | 0x7BFF);  // clamp: never Inf
  if (exp <= 0) {
    if (exp < -10) return sign;
    mant |= 0x800000;
    int shift = 14 - exp;
    std::uint32_t half = mant >> shift;
    std::uint32_t rest = mant & ((1u << shift) - 1);
    std::uint32_t mid = 1u << (shift - 1);
    if (rest > mid || (rest == mid && (half & 1))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = (static_cast<std::uint32_t>(exp) << 10) | (mant >> 13);
  std::uint32_t rest = mant & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;  // may carry into the exponent
  if (half >= 0x7C00) half = 0x7BFF;
  return static_cast<std::uint16_t>(sign | half);
}

// Each element takes its dtype's width of random bits, split into two halves whose sum is a
// triangular variable: bell-shaped enough to look like weights, and free of NaN by design.
// 16-bit elements: two bytes, sum 0..510, standard deviation ~104.5.
constexpr double tri8_sd = 104.5;
// 32-bit elements: two 16-bit halves, sum 0..131070, standard deviation ~26754.
constexpr double tri16_sd = 26754.0;

struct Distribution {
  float center;
  float sd;
};
constexpr Distribution weight_dist{0.0f, 0.02f};
constexpr Distribution norm_dist{1.0f, 0.05f};

using Table16 = std::array<std::uint16_t, 511>;

Table16 make_table16(Distribution dist, bool bf16) {
  Table16 t{};
  for (int i = 0; i < 511; ++i) {
    auto v = static_cast<float>(dist.center + (i - 255) * (dist.sd / tri8_sd));
    t[static_cast<std::size_t>(i)] = bf16 ? float_to_bf16(v) : float_to_f16(v);
  }
  return t;
}

const Table16& table16(DType dtype, bool norm) {
  static const Table16 tables[4] = {make_table16(weight_dist, true), make_table16(norm_dist, true),
                                    make_table16(weight_dist, false), make_table16(norm_dist, false)};
  return tables[(dtype == DType::BF16 ? 0 : 2) + (norm ? 1 : 0)];
}

// One 8-byte lane of 16-bit elements.
struct Lane16 {
  std::uint64_t key;
  const std::uint16_t* table;
  std::uint64_t operator()(std::uint64_t lane) const noexcept {
    std::uint64_t h = mix64(key + lane * golden);
    std::uint64_t word = 0;
    for (unsigned i = 0; i < 4; ++i) {
      auto s = static_cast<unsigned>(h >> (16 * i));
      unsigned idx = (s & 0xFF) + ((s >> 8) & 0xFF);
      word |= std::uint64_t{table[idx]} << (16 * i);
    }
    return word;
  }
};

// One 8-byte lane of F32 elements.
struct Lane32 {
  std::uint64_t key;
  float center;
  float scale;
  std::uint64_t operator()(std::uint64_t lane) const noexcept {
    std::uint64_t h = mix64(key + lane * golden);
    std::uint64_t word = 0;
    for (unsigned i = 0; i < 2; ++i) {
      auto s = static_cast<std::uint32_t>(h >> (32 * i));
      int t = static_cast<int>((s & 0xFFFF) + (s >> 16)) - 65535;
      float v = center + static_cast<float>(t) * scale;
      word |= std::uint64_t{std::bit_cast<std::uint32_t>(v)} << (32 * i);
    }
    return word;
  }
};

// Produces bytes [offset, offset + out.size()) of the lane stream: whole lanes straight into
// the output, partial ones through a temporary at either end.
template <class LaneFn>
void fill_lanes(const LaneFn& lane_fn, std::uint64_t offset, std::span<std::byte> out) {
  std::byte* dst = out.data();
  std::size_t left = out.size();
  std::uint64_t lane = offset / 8;
  if (auto skip = static_cast<std::size_t>(offset % 8); skip != 0 && left != 0) {
    std::uint64_t word = lane_fn(lane++);
    std::size_t n = std::min(left, 8 - skip);
    std::memcpy(dst, reinterpret_cast<const std::byte*>(&word) + skip, n);
    dst += n;
    left -= n;
  }
  for (; left >= 8; left -= 8, dst += 8) {
    std::uint64_t word = lane_fn(lane++);
    std::memcpy(dst, &word, 8);
  }
  if (left != 0) {
    std::uint64_t word = lane_fn(lane);
    std::memcpy(dst, &word, left);
  }
}

bool is_norm(std::string_view name) noexcept { return name.find("norm") != std::string_view::npos; }

std::uint64_t tensor_key(std::uint64_t seed, std::string_view name) noexcept {
  return mix64(fnv1a64(name) ^ mix64(seed + golden));
}

void fill_unchecked(std::uint64_t seed, const TensorSpec& tensor, std::uint64_t byte_offset, std::span<std::byte> out) {
  const std::uint64_t key = tensor_key(seed, tensor.name);
  const bool norm = is_norm(tensor.name);
  if (tensor.dtype == DType::F32) {
    Distribution dist = norm ? norm_dist : weight_dist;
    fill_lanes(Lane32{key, dist.center, static_cast<float>(dist.sd / tri16_sd)}, byte_offset, out);
  } else {
    fill_lanes(Lane16{key, table16(tensor.dtype, norm).data()}, byte_offset, out);
  }
}

// Generates the data of consecutive tensors into one reused block and hands it to the file
// in large writes, whatever the tensors' sizes.
class BlockStreamer {
 public:
  BlockStreamer(std::uint64_t seed, std::uint64_t total, ProgressFn& progress)
      : seed_(seed),
        total_(total),
        progress_(progress),
        block_(std::make_unique_for_overwrite<std::byte[]>(block_size)) {}

  void write_file(const std::filesystem::path& path, std::span<const TensorSpec> tensors,
                  const io::Metadata& metadata) {
    SafetensorsFileWriter writer(path, tensors, metadata);
    for (const auto& t : tensors) {
      const std::uint64_t nbytes = tensor_nbytes(t);
      for (std::uint64_t off = 0; off < nbytes;) {
        auto n = static_cast<std::size_t>(std::min<std::uint64_t>(nbytes - off, block_size - used_));
        fill_unchecked(seed_, t, off, {block_.get() + used_, n});
        used_ += n;
        off += n;
        if (used_ == block_size) flush(writer);
      }
    }
    flush(writer);
    writer.finish();
  }

 private:
  // Big enough that syscall overhead vanishes, small enough to stay in L2/L3-ish territory.
  static constexpr std::size_t block_size = 4u << 20;

  void flush(SafetensorsFileWriter& writer) {
    if (used_ == 0) return;
    writer.write({block_.get(), used_});
    done_ += used_;
    used_ = 0;
    if (progress_) progress_(done_, total_);
  }

  std::uint64_t seed_;
  std::uint64_t total_;
  ProgressFn& progress_;
  std::unique_ptr<std::byte[]> block_;
  std::size_t used_ = 0;
  std::uint64_t done_ = 0;
};

}  // namespace

SyntheticModel plan_model(const SyntheticOptions& options) {
  const std::uint64_t elem = element_bytes(options.dtype);
  if (options.target_bytes == 0) {
    throw Error(errc::invalid_argument, {}, "target size must be positive");
  }
  if (options.layers > max_layers) {
    throw Error(errc::invalid_argument, {},
                fmt::format("{} layers requested; at most {} are supported", options.layers, max_layers));
  }
  const std::uint64_t target_elements = std::max<std::uint64_t>(1, options.target_bytes / elem);

  // Every hidden size a Llama-like model could have (coarser steps for wider models, as real
  // ones use), smallest first; the planner keeps the one that hits the target best and,
  // among near-equal hits, has the most natural depth.
  std::vector<std::uint64_t> hiddens{64};
  for (std::uint64_t h = 128; h <= 65536; h += h < 1024 ? 128 : h < 4096 ? 256 : 512) {
    hiddens.push_back(h);
  }
  std::optional<Candidate> best;
  constexpr double good_enough = 0.02;
  for (std::uint64_t h : hiddens) {
    Candidate c = plan_for_hidden(h, target_elements, options);
    if (!best) {
      best = c;
      continue;
    }
    const bool c_good = c.error <= good_enough, best_good = best->error <= good_enough;
    bool better = false;
    if (c_good != best_good) {
      better = c_good;
    } else if (!c_good) {
      better = c.error < best->error;
    } else {
      better = c.shape < best->shape || (c.shape == best->shape && c.error < best->error);
    }
    if (better) best = c;
  }
  const Dims& d = best->dims;

  SyntheticModel m;
  m.hidden = static_cast<std::uint32_t>(d.hidden);
  m.intermediate = static_cast<std::uint32_t>(d.intermediate);
  m.heads = static_cast<std::uint32_t>(d.heads);
  m.kv_heads = static_cast<std::uint32_t>(d.kv_heads);
  m.layers = static_cast<std::uint32_t>(d.layers);
  m.vocab = static_cast<std::uint32_t>(d.vocab);

  const DType t = options.dtype;
  const std::uint64_t h = d.hidden, kv = d.kv_heads * d.head_dim, inter = d.intermediate;
  m.tensors.reserve(3 + 9 * d.layers);
  m.tensors.push_back({"model.embed_tokens.weight", t, {d.vocab, h}});
  for (std::uint64_t i = 0; i < d.layers; ++i) {
    m.tensors.push_back({layer_name(i, "input_layernorm.weight"), t, {h}});
    m.tensors.push_back({layer_name(i, "self_attn.q_proj.weight"), t, {h, h}});
    m.tensors.push_back({layer_name(i, "self_attn.k_proj.weight"), t, {kv, h}});
    m.tensors.push_back({layer_name(i, "self_attn.v_proj.weight"), t, {kv, h}});
    m.tensors.push_back({layer_name(i, "self_attn.o_proj.weight"), t, {h, h}});
    m.tensors.push_back({layer_name(i, "post_attention_layernorm.weight"), t, {h}});
    m.tensors.push_back({layer_name(i, "mlp.gate_proj.weight"), t, {inter, h}});
    m.tensors.push_back({layer_name(i, "mlp.up_proj.weight"), t, {inter, h}});
    m.tensors.push_back({layer_name(i, "mlp.down_proj.weight"), t, {h, inter}});
  }
  m.tensors.push_back({"model.norm.weight", t, {h}});
  if (!options.tie_embeddings) m.tensors.push_back({"lm_head.weight", t, {d.vocab, h}});
  m.total_bytes = total_nbytes(m.tensors);
  return m;
}

void fill_tensor_bytes(std::uint64_t seed, const TensorSpec& tensor, std::uint64_t byte_offset,
                       std::span<std::byte> out) {
  element_bytes(tensor.dtype);  // rejects dtypes the generator has no distribution for
  const std::uint64_t nbytes = tensor_nbytes(tensor);
  if (byte_offset > nbytes || out.size() > nbytes - byte_offset) {
    throw Error(errc::invalid_argument, {.tensor = tensor.name},
                fmt::format("bytes [{}, +{}) pass the end of a {}-byte tensor", byte_offset, out.size(), nbytes));
  }
  fill_unchecked(seed, tensor, byte_offset, out);
}

void write_synthetic(const std::filesystem::path& out, const SyntheticOptions& options, ProgressFn progress) {
  if (options.shards == 0) {
    throw Error(errc::invalid_argument, {.file = out.string()}, "shards must be at least 1");
  }
  const SyntheticModel model = plan_model(options);
  const std::span<const TensorSpec> tensors = model.tensors;
  BlockStreamer streamer(options.seed, model.total_bytes, progress);

  std::error_code ec;
  if (options.shards == 1) {
    std::filesystem::path file = std::filesystem::is_directory(out, ec) ? out / "model.safetensors" : out;
    streamer.write_file(file, tensors,
                        {{"format", "pt"}, {"generator", "eredu-synth"}, {"seed", std::to_string(options.seed)}});
    return;
  }

  const std::vector<std::size_t> starts = split_evenly(tensors, options.shards);
  std::filesystem::create_directories(out, ec);
  if (ec) {
    throw Error(errc::io_error, {.file = out.string(), .os_error = ec}, "cannot create the directory");
  }
  for (std::size_t s = 0; s < starts.size(); ++s) {
    const std::size_t begin = starts[s];
    const std::size_t end = s + 1 < starts.size() ? starts[s + 1] : tensors.size();
    streamer.write_file(out / shard_file_name(s, starts.size()), tensors.subspan(begin, end - begin),
                        {{"format", "pt"}});
  }
  write_text_file(out / "model.safetensors.index.json", sharded_index_json(tensors, starts));
}

}  // namespace eredu::synth
