// eredu: inspect, read, load and generate checkpoints from the command line.
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "commands.hpp"
#include "eredu/core/error.hpp"
#include "eredu/io/json_text.hpp"

namespace {

constexpr const char* usage = R"(eredu — asynchronous checkpoint loading

usage:
  eredu inspect PATH [--json]
      the tensors of a checkpoint (file, sharded directory, or *.index.json): name, dtype,
      shape, bytes, file, and totals
  eredu read PATH [--reader auto|uring|pread] [--budget 256M] [--depth 4] [--request 4M]
                  [--direct auto|on|off] [--concurrency 2] [--chunk 4M] [--verify on|off] [--json]
      reads every tensor through the bounded lease pool (in --chunk sized leases; 0 for
      one lease per tensor), verifies each against an
      independent pread pass, and prints bytes, seconds, GB/s, staging high-water, peak RSS
  eredu load PATH [--dtype keep|bf16|f16|f32] [--threads N] [--budget 256M] [--repeat N]
                  [--reader auto|uring|pread] [--depth 8] [--request 8M] [--json]
      loads every tensor into CPU tensors through the engine (one slot per tensor; --dtype
      casts float tensors), with a progress bar, and prints bytes, seconds, GB/s, staging
      high-water and peak RSS; --repeat N loads N times, reusing the previous load's storage
  eredu pipeline PATH [--budget BYTES] [--lookahead 2] [--passes 1] [--threads N]
                      [--compute none|matvec] [--staging 64M] [--json]
      streams the checkpoint's layers (<prefix>layers.<N>.*, one unit per layer; other
      tensors skipped) through a prefetch pipeline within --budget bytes of resident units
      (default (K+1) x the largest unit), a matvec per weight meanwhile; prints progress,
      GB/s, I/O, compute and stall time, resident high-water vs budget, peak RSS
  eredu swap A B [--swaps 2] [--requests 2000] [--concurrency 8] [--serve-threads 0]
                 [--swap-threads 1] [--budget 32M] [--work 256K] [--verify on|off] [--corrupt] [--json]
      serves synthetic requests from A while hot-swapping (engine::ModelSlot) to B and back
      --swaps times, then with --corrupt attempts a swap to a corrupted copy of B (rejected by
      its checksum); prints request latency per phase, publish pauses, and checks that every
      response came from exactly one version (exit 1 if not)
  eredu gen OUT [--size 512M] [--dtype bf16|f16|f32] [--shards N] [--seed S] [--layers N]
                [--tie-embeddings] [--checksums]
      writes a deterministic synthetic Llama-shaped checkpoint (OUT is a directory when
      --shards > 1); --checksums also writes the SHA-256 of every tensor to a sidecar that a
      hot-swap verifies
)";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    std::fputs(usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const bool json = [&] {
    for (int i = 2; i < argc; ++i)
      if (!std::strcmp(argv[i], "--json")) return true;
    return false;
  }();
  try {
    if (command == "inspect") return eredu::cli::run_inspect(argc, argv);
    if (command == "read") return eredu::cli::run_read(argc, argv);
    if (command == "gen") return eredu::cli::run_gen(argc, argv);
    if (command == "load") return eredu::cli::run_load(argc, argv);
    if (command == "pipeline") return eredu::cli::run_pipeline(argc, argv);
    if (command == "swap") return eredu::cli::run_swap(argc, argv);
    fmt::print(stderr, "eredu: unknown command '{}'\n\n{}", command, usage);
    return 2;
  } catch (const eredu::Error& e) {
    if (json) {
      fmt::print("{{\"error\":\"{}\",\"message\":{}}}\n", eredu::errc_name(e.kind()),
                 eredu::io::json::quoted(e.what()));
    }
    fmt::print(stderr, "eredu {}: {}\n", command, e.what());
    return 1;
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr, "eredu {}: {}\n", command, e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "eredu {}: {}\n", command, e.what());
    return 1;
  }
}
