#pragma once
/// \file
/// The options of `eredu load`, shared by the single-process load (load_command.cpp) and the
/// tensor-parallel one (tensor_parallel_load.cpp, built only with MPI).

#include <algorithm>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "eredu/io/reading/checkpoint_source.hpp"
#include "options.hpp"
#include "remote_flags.hpp"

namespace eredu::cli {

/// `--tensor-parallel` and the options that shape its sharding rules (docs/cli.md).
struct TensorParallelOptions {
  bool enabled = false;             ///< --tensor-parallel: one shard per MPI rank
  std::uint64_t heads = 0;          ///< --heads: query heads (0: inferred)
  std::uint64_t kv_heads = 0;       ///< --kv-heads: key/value heads (0: inferred)
  std::uint64_t head_dim = 0;       ///< --head-dim: indices per head (0: inferred)
  std::string family = "llama";     ///< --family: the model family's rules (app::sharding_family_choices)
  std::vector<std::string> shard;   ///< --shard PATTERN=SPEC rules, in order, before the family's rules
  std::string replicated = "read";  ///< --replicated read|gather (engine::ReplicatedReads)
};

/// The options of `eredu load`, with their defaults.
struct LoadOptions {
  std::string path;
  std::string dtype = "keep";
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  bool threads_given = false;  // --threads on the command line (the tensor-parallel default differs)
  std::uint64_t budget = std::uint64_t{256} << 20;
  unsigned repeat = 1;
  std::string reader = "auto";
  std::string uring_files = "local";
  unsigned depth = app::LoadPreset::depth;  // the shared preset (eredu/app/option_presets.hpp)
  std::uint64_t request = app::LoadPreset::request;
  std::string kernels = "best";
  // Converted tensors are read in chunk leases of this size, each converted while the next is read.
  std::uint64_t chunk = app::LoadPreset::chunk;
  std::string copies = "arena";
  std::string cold_reads = "window";  // --cold-reads window|buffered (MaterializationContext::read_cold_windows)
  std::string pages = "4k";
  std::string weights = "copy";  // --weights copy|map|map-lock (cpu::WeightStorage)
  std::string verify = "off";
  std::string checksums;  // --checksums FILE
  TensorParallelOptions tensor_parallel;
  RemoteFlags remote;  // --cache, --ca-file, --s3-*, --part-size, --connections
};

/// `eredu load --tensor-parallel`: every MPI rank loads its shard and rank 0 prints the
/// report (tensor_parallel_load.cpp; only in builds with MPI). Returns the exit status.
int run_tensor_parallel_load(const LoadOptions& o, const CommonFlags& flags);

/// The source options `eredu load`'s flags ask for (budget, reader, chunk size).
io::SourceOptions source_options(const LoadOptions& o);
/// Applies --kernels (the conversion ISA) for the whole process.
void select_kernels(const LoadOptions& o);

}  // namespace eredu::cli
