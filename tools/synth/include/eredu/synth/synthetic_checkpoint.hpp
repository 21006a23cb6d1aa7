#pragma once
/// \file
/// Synthetic, Llama-shaped checkpoints of any size, deterministic from a seed, for the
/// `eredu gen` command, tests and benchmarks.
///
/// Tensor values depend only on (seed, dtype, tensor name, element index), so any byte
/// range of any tensor can be recomputed independently with fill_tensor_bytes() to check
/// what a loader delivered. Values look like trained weights (weights spread around 0 with
/// a standard deviation near 0.02, norm weights around 1.0) and are never NaN or Inf.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <vector>

#include "eredu/core/dtype.hpp"
#include "eredu/synth/safetensors_writer.hpp"

namespace eredu::synth {

/// What to generate.
struct SyntheticOptions {
  std::uint64_t target_bytes = 512ull << 20;  ///< approximate total tensor bytes
  DType dtype = DType::BF16;                  ///< BF16, F16 or F32
  std::uint32_t shards = 1;                   ///< 1: one file; more: a sharded directory
  std::uint64_t seed = 1;                     ///< determines every value
  std::uint32_t layers = 0;                   ///< decoder layers; 0 chooses from target_bytes
  bool tie_embeddings = false;                ///< true: no lm_head.weight (it aliases the embedding)
};

/// The planned model: its dimensions and its tensors in file order.
struct SyntheticModel {
  std::uint32_t hidden = 0;           ///< hidden size
  std::uint32_t intermediate = 0;     ///< MLP inner size
  std::uint32_t heads = 0;            ///< attention heads
  std::uint32_t kv_heads = 0;         ///< key/value heads (grouped-query attention when < heads)
  std::uint32_t layers = 0;           ///< decoder layers
  std::uint32_t vocab = 0;            ///< vocabulary size
  std::vector<TensorSpec> tensors{};  ///< every tensor, in file order
  std::uint64_t total_bytes = 0;      ///< sum of the tensors' bytes
};

/// Called after each large write with the data bytes written so far and the total.
using ProgressFn = std::function<void(std::uint64_t done, std::uint64_t total)>;

/// Chooses Llama-like dimensions whose total bytes come close to options.target_bytes
/// (within a few percent when options.layers is 0) and lists the tensors. Throws
/// eredu::Error(invalid_argument) for an unsupported dtype or a zero target.
SyntheticModel plan_model(const SyntheticOptions& options);

/// Fills `out` with bytes [byte_offset, byte_offset + out.size()) of `tensor`'s data as
/// generated from `seed`. Throws eredu::Error(invalid_argument) if the range passes the
/// tensor's end or the dtype is not BF16, F16 or F32.
void fill_tensor_bytes(std::uint64_t seed, const TensorSpec& tensor, std::uint64_t byte_offset,
                       std::span<std::byte> out);

/// Writes the planned model with generated data. With options.shards == 1, `out` is the file
/// to write (or an existing directory, which then gets `model.safetensors`), with
/// `__metadata__` {"format":"pt","generator":"eredu-synth","seed":"<seed>"}. With more shards,
/// `out` is a directory (created if missing) that gets that many shards of nearly equal bytes
/// and `model.safetensors.index.json`. Memory use is a few MiB whatever the size. Throws
/// eredu::Error (io_error, invalid_argument).
void write_synthetic(const std::filesystem::path& out, const SyntheticOptions& options, ProgressFn progress = {});

}  // namespace eredu::synth
