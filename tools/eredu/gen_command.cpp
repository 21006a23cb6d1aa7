// `eredu gen OUT`: a deterministic synthetic Llama-shaped checkpoint, safetensors or GGUF.
//
// Where it goes, one rule: OUT ending in ".safetensors" (".gguf" with --format gguf) is a
// single file; any other OUT is a directory (created if missing) that gets
// "model.safetensors" (one shard) or N shards "model-0000i-of-0000N.safetensors" and
// "model.safetensors.index.json"; with --format gguf "model.gguf" or a split set
// "model-0000i-of-0000N.gguf". An existing checkpoint at OUT (the file, or any
// *.safetensors, *.gguf, index or checksum sidecar in the directory) is refused unless
// --force, which removes it first, so OUT never ends up holding two checkpoints. A single
// file is written under a temporary name and renamed, so an interrupted run leaves no
// partial file under OUT.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "commands.hpp"
#include "eredu/app/checksum_sidecar.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/printable.hpp"
#include "eredu/io/formats/gguf.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "eredu/io/integrity/checksums.hpp"
#include "eredu/io/integrity/digest.hpp"
#include "eredu/synth/synthetic_checkpoint.hpp"
#include "eredu/synth/synthetic_gguf.hpp"
#include "interrupt.hpp"
#include "progress.hpp"

namespace eredu::cli {
namespace {

namespace fs = std::filesystem;

/// The options of `eredu gen`, with their defaults.
struct GenOptions {
  std::string out;
  std::uint64_t size = std::uint64_t{512} << 20;
  std::string dtype = "bf16";
  std::string format = "safetensors";
  std::uint32_t shards = 1;
  std::uint64_t seed = 1;
  std::uint32_t layers = 0;
  bool tie_embeddings = false;
  bool checksums = false;
  std::string digest = "sha256";  // --digest: what --checksums records
  bool force = false;
};

/// The digests of `kinds` of every tensor of the checkpoint at `out`, one read of each
/// tensor (hash_checkpoint), written as its checksum sidecar (what loads and hot-swaps
/// verify). A fresh checkpoint: no digest is recorded yet to check.
fs::path write_checksums(const fs::path& out, const std::vector<io::DigestKind>& kinds, Progress& progress) {
  const io::Catalog catalog = io::open_catalog(out);
  const io::Checksums sums = app::hash_checkpoint(catalog, kinds, {}, io::Checksums{}, hash_progress(progress));
  const fs::path sidecar = io::Checksums::sidecar_path(out);
  app::write_sidecar(sidecar, sums);
  return sidecar;
}

/// The files of a checkpoint already at `out` (see the file comment), which --force removes.
std::vector<fs::path> existing_checkpoint(const fs::path& out, bool directory) {
  std::vector<fs::path> found;
  std::error_code ec;
  if (!directory) {
    for (const fs::path& p : {out, io::Checksums::sidecar_path(out)})
      if (fs::exists(fs::symlink_status(p, ec))) found.push_back(p);
    return found;
  }
  if (!fs::is_directory(out, ec)) return found;
  for (const fs::directory_entry& e : fs::directory_iterator(out)) {
    const std::string name = e.path().filename().string();
    const bool ours = e.path().extension() == ".safetensors" || e.path().extension() == ".gguf" ||
                      name == "model.safetensors.index.json" || name.ends_with(".sha256.json");
    if (ours && !e.is_directory(ec)) found.push_back(e.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

int run_gen(const GenOptions& o, const CommonFlags& flags) {
  const bool gguf = o.format == "gguf";
  const std::string extension = gguf ? ".gguf" : ".safetensors";
  synth::SyntheticOptions s;
  s.target_bytes = o.size;
  const std::optional<DType> dtype = dtype_from_any_name(o.dtype);
  if (!dtype || (!gguf && dtype_is_quantized(*dtype)))
    throw UsageError(
        fmt::format("--dtype: '{}' is a GGUF quantized type: give --format gguf, or bf16, f16 or f32", o.dtype));
  s.dtype = *dtype;
  s.shards = o.shards;
  s.seed = o.seed;
  s.layers = o.layers;
  s.tie_embeddings = o.tie_embeddings;
  const synth::SyntheticModel model = gguf ? synth::plan_gguf_model(s) : synth::plan_model(s);
  if (o.shards > model.tensors.size())
    throw UsageError(fmt::format("--shards: '{}' is more than the {} tensors of this model (1 to {})", o.shards,
                                 model.tensors.size(), model.tensors.size()));

  const fs::path out(o.out);
  if (!gguf && out.extension() == ".gguf")
    throw UsageError(fmt::format("OUT '{}' names a .gguf file: give --format gguf", o.out));
  const bool single_file = out.extension() == extension;
  if (single_file && o.shards > 1)
    throw UsageError(
        fmt::format("OUT '{}' names a single {} file, but --shards {} writes a directory: "
                    "give a directory name (no {} extension)",
                    o.out, extension, o.shards, extension));
  std::error_code ec;
  if (single_file && fs::is_directory(out, ec))
    throw Error(errc::invalid_argument, {.file = o.out}, "is a directory: a single-file checkpoint cannot go there");
  if (!single_file && fs::exists(out, ec) && !fs::is_directory(out, ec))
    throw Error(errc::invalid_argument, {.file = o.out},
                fmt::format("exists and is not a directory (a single-file checkpoint's name ends in {})", extension));
  const std::vector<fs::path> existing = existing_checkpoint(out, !single_file);
  if (!existing.empty() && !o.force)
    throw Error(errc::invalid_argument, {.file = o.out},
                fmt::format("already holds a checkpoint ({}{}); --force replaces it", existing.front().string(),
                            existing.size() > 1 ? fmt::format(" and {} more files", existing.size() - 1) : ""));
  for (const fs::path& p : existing) fs::remove(p);

  // Where the data goes: the file itself, model.safetensors in the directory, or the shards.
  const fs::path target = single_file ? out : (o.shards == 1 ? out / ("model" + extension) : out);
  const bool made_directory = !single_file && !fs::exists(out, ec);
  // The temporary's name is short and fixed, not OUT's name plus a suffix: OUT's name may
  // already be as long as a name can be (NAME_MAX), and the rename must stay in OUT's directory.
  const fs::path partial = single_file ? out.parent_path() / fmt::format(".eredu-gen-{}.partial", ::getpid()) : target;
  // A run that does not finish (a failure, a signal) takes back everything it made: OUT
  // held no checkpoint before (one is refused, or --force removed it), so every file of one
  // there now is this run's, half-written or whole (two complete shards without an index
  // are no checkpoint either).
  auto take_back = [&] {
    std::error_code ignored;
    if (partial != target) fs::remove(partial, ignored);
    for (const fs::path& p : existing_checkpoint(out, !single_file)) fs::remove(p, ignored);
    if (made_directory) fs::remove(out, ignored);  // only if empty: nothing else is touched
  };

  if (!flags.quiet && !flags.json)
    fmt::print(stderr, "generating {}: {} layers, hidden {}, intermediate {}, vocab {}, {} tensors, {}, {} shard{}\n",
               printable(o.out), model.layers, model.hidden, model.intermediate, model.vocab, model.tensors.size(),
               format_bytes(model.total_bytes), o.shards, o.shards == 1 ? "" : "s");
  Progress progress(!flags.quiet);
  progress.phase("write", model.total_bytes);
  const double t0 = now_seconds();
  double write_s = 0;
  fs::path sidecar;
  double hash_s = 0;
  try {
    if (!single_file) fs::create_directories(out);
    const std::string doing = fmt::format("writing {}; nothing of it was left", o.out);
    // Called after every block written (4 MiB): a signal stops the run there.
    const auto on_progress = [&](std::uint64_t done, std::uint64_t) {
      throw_if_interrupted(doing);
      progress.update(done);
    };
    if (gguf)
      synth::write_synthetic_gguf(partial, s, on_progress);
    else
      synth::write_synthetic(partial, s, on_progress);
    throw_if_interrupted(doing);
    if (partial != target) fs::rename(partial, target);
    write_s = now_seconds() - t0;
    if (o.checksums) {
      const double th = now_seconds();
      sidecar = write_checksums(out, app::digest_kinds(o.digest), progress);
      hash_s = now_seconds() - th;
    }
    throw_if_interrupted(doing);
  } catch (...) {
    take_back();
    throw;
  }
  progress.finish();

  if (flags.json) {
    JsonWriter json;
    begin_document(json, "gen");
    json.field("path", o.out).field("format", o.format).field("dtype", o.dtype).field("seed", o.seed);
    json.count("layer", model.layers).field("hidden", model.hidden).field("intermediate", model.intermediate);
    json.field("vocab", model.vocab).count("tensor", model.tensors.size()).count("shard", o.shards);
    json.bytes("", model.total_bytes).seconds("", write_s).rate("", gb_per_s(model.total_bytes, write_s));
    if (o.checksums)
      json.field("checksums", sidecar.string()).field("digest", o.digest);
    else
      json.null_field("checksums");
    json.seconds("hash", hash_s);
    print_document(json);
  } else if (!flags.quiet) {
    fmt::print(stderr, "wrote {} in {:.2f} s ({:.2f} GB/s)\n", format_bytes(model.total_bytes), write_s,
               gb_per_s(model.total_bytes, write_s));
    if (o.checksums)
      fmt::print(stderr, "wrote the {} of every tensor to {}\n",
                 o.digest == "both"     ? "SHA-256 and XXH3-128"
                 : o.digest == "sha256" ? "SHA-256"
                                        : "XXH3-128",
                 printable(sidecar.string()));
  }
  return 0;
}

// What --dtype accepts: the safetensors float types, then every GGUF quantized type ggml
// stores in files (ggml's own activation types Q8_1 and Q8_K are not), lower case.
std::vector<std::string> gen_dtypes() {
  std::vector<std::string> names{"bf16", "f16", "f32"};
  for (std::size_t i = safetensors_dtype_count; i < dtype_count; ++i) {
    const auto t = static_cast<DType>(i);
    if (t == DType::Q8_1 || t == DType::Q8_K || !io::gguf::ggml_type_of(t)) continue;
    std::string name(dtype_name(t));
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    names.push_back(std::move(name));
  }
  return names;
}

}  // namespace

Command add_gen_command(CLI::App& app, CommonFlags& flags) {
  auto o = std::make_shared<GenOptions>();
  CLI::App* cmd = add_command(
      app, "gen", "write a deterministic synthetic Llama-shaped checkpoint",
      "Writes a synthetic checkpoint whose values depend only on the seed. OUT ending in .safetensors is one "
      "file; any other OUT is a directory that gets model.safetensors, or with --shards N, N shards "
      "model-0000i-of-0000N.safetensors and model.safetensors.index.json. With --format gguf: OUT ending in "
      ".gguf is one file, any other OUT a directory with model.gguf or a split set model-0000i-of-0000N.gguf "
      "(llama.cpp's tensor names and metadata; quantized --dtype values are random blocks, valid GGUF, not a "
      "quantization of real weights). An existing checkpoint at OUT is refused unless --force, which replaces "
      "it whole.");
  add_path(*cmd, "OUT", o->out, "the file (*.safetensors, or *.gguf with --format gguf) or directory to write");
  add_bytes(*cmd, "--size", o->size, std::uint64_t{64} << 10, std::uint64_t{4} << 40,
            "approximate bytes of tensor data");
  add_choice(*cmd, "--format", o->format, {"safetensors", "gguf"}, "checkpoint format");
  add_choice(*cmd, "--dtype", o->dtype, gen_dtypes(),
             "element type of every tensor (GGUF: of every matrix, norms are f32; the quantized types are GGUF's)");
  add_integer(*cmd, "--shards", o->shards, 1u, 99999u, "files to split the tensors into, at most one per tensor");
  add_integer(*cmd, "--seed", o->seed, std::uint64_t{0}, std::numeric_limits<std::uint64_t>::max(),
              "determines every value");
  add_integer(*cmd, "--layers", o->layers, 0u, 4096u, "decoder layers; 0 chooses them from --size");
  cmd->add_flag("--tie-embeddings", o->tie_embeddings, "write no lm_head.weight (it aliases the embedding)");
  CLI::Option* checksums =
      cmd->add_flag("--checksums", o->checksums,
                    "also write the SHA-256 of every tensor to the checksum sidecar a swap verifies "
                    "(<file>.sha256.json, or checksums.sha256.json inside a directory)");
  add_choice(*cmd, "--digest", o->digest, {"sha256", "xxh3-128", "both"},
             "what --checksums records: SHA-256 (interoperable), XXH3-128 (a fast non-cryptographic check: "
             "verification costs a fifth of SHA-256's) or both (loads verify SHA-256)")
      ->needs(checksums);
  cmd->add_flag("--force", o->force, "replace an existing checkpoint at OUT");
  add_common_flags(*cmd, flags, true);
  return {cmd, [o](const CommonFlags& f) { return run_gen(*o, f); }};
}

}  // namespace eredu::cli
