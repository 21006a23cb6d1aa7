#include <cstdio>

#include <fmt/format.h>

#include "cli.hpp"
#include "commands.hpp"
#include "eredu/synth/synthetic_checkpoint.hpp"

namespace eredu::cli {

int run_gen(int argc, char** argv) {
  Args args = parse_args(argc, argv, 2, {"size", "dtype", "shards", "seed", "layers"}, {"tie-embeddings", "quiet"});
  if (args.positional.size() != 1) {
    throw std::invalid_argument(
        "usage: eredu gen OUT [--size 512M] [--dtype bf16|f16|f32] [--shards N] [--seed S] [--layers N] "
        "[--tie-embeddings]");
  }
  synth::SyntheticOptions o;
  o.target_bytes = parse_bytes(args.get("size", "512M"));
  std::string dtype = args.get("dtype", "bf16");
  if (dtype == "bf16") o.dtype = DType::BF16;
  else if (dtype == "f16") o.dtype = DType::F16;
  else if (dtype == "f32") o.dtype = DType::F32;
  else throw std::invalid_argument("--dtype must be bf16, f16 or f32");
  o.shards = static_cast<std::uint32_t>(std::stoul(args.get("shards", "1")));
  o.seed = std::stoull(args.get("seed", "1"));
  o.layers = static_cast<std::uint32_t>(std::stoul(args.get("layers", "0")));
  o.tie_embeddings = args.has("tie-embeddings");
  auto model = synth::plan_model(o);
  const std::string out = args.positional[0];
  if (!args.has("quiet")) {
    fmt::print(stderr, "generating {}: {} layers, hidden {}, intermediate {}, vocab {}, {} tensors, {}, {} shard{}\n",
               out, model.layers, model.hidden, model.intermediate, model.vocab, model.tensors.size(),
               format_bytes(model.total_bytes), o.shards, o.shards == 1 ? "" : "s");
  }
  Progress progress("gen ", model.total_bytes);
  double t0 = now_seconds();
  synth::write_synthetic(out, o, [&](std::uint64_t done, std::uint64_t) { progress.update(done); });
  progress.finish();
  if (!args.has("quiet")) {
    double s = now_seconds() - t0;
    fmt::print(stderr, "wrote {} in {:.2f} s ({:.2f} GB/s)\n", format_bytes(model.total_bytes), s,
               static_cast<double>(model.total_bytes) / s / 1e9);
  }
  return 0;
}

}  // namespace eredu::cli
