#pragma once
/// \file
/// Synthetic Llama-shaped GGUF checkpoints, named as llama.cpp names them (token_embd.weight,
/// blk.N.attn_q.weight ... blk.N.ffn_down.weight, output_norm.weight, output.weight), with
/// llama KV metadata, in any GGUF dtype, one file or a split set as gguf-split writes it.
///
/// Matrices take the requested dtype (one whose blocks divide their rows; others fall back
/// to F16, as llama.cpp's quantizer falls back); norms are F32. Quantized data are
/// deterministic random blocks with small positive scales (fill_quantized_bytes): valid GGUF
/// that dequantizes to finite values, not a quantization of real weights. Float data are
/// those of the safetensors generator (fill_tensor_bytes), so any byte range of any tensor
/// can be recomputed with fill_gguf_tensor_bytes.

#include <filesystem>
#include <span>
#include <vector>

#include "eredu/synth/gguf_writer.hpp"
#include "eredu/synth/synthetic_checkpoint.hpp"

namespace eredu::synth {

/// Plans a GGUF model whose tensor bytes come close to options.target_bytes, with matrices in
/// options.dtype (any dtype GGUF holds). Throws eredu::Error(invalid_argument).
SyntheticModel plan_gguf_model(const SyntheticOptions& options);

/// The KV pairs written with `model`: general.architecture "llama", general.name,
/// general.file_type (where llama.cpp has one for the dtype), general.alignment 32 and the
/// llama.* hyperparameters.
std::vector<GgufKeyValue> synthetic_gguf_metadata(const SyntheticModel& model, const SyntheticOptions& options);

/// Bytes [byte_offset, +out.size()) of `tensor`'s synthetic data from `seed` (quantized:
/// fill_quantized_bytes; F16/BF16/F32: fill_tensor_bytes).
void fill_gguf_tensor_bytes(std::uint64_t seed, const TensorSpec& tensor, std::uint64_t byte_offset,
                            std::span<std::byte> out);

/// Writes the planned GGUF model. With options.shards == 1, `out` is the file (or an existing
/// directory, which gets `model.gguf`); with more, `out` is a directory (created if missing)
/// that gets `model-0000i-of-0000N.gguf` with split.no / split.count / split.tensors.count in
/// every file and the model's metadata in the first. Constant memory. Throws eredu::Error.
void write_synthetic_gguf(const std::filesystem::path& out, const SyntheticOptions& options, ProgressFn progress = {});

}  // namespace eredu::synth
