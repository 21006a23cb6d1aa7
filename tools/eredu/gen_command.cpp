#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "commands.hpp"
#include "eredu/core/error.hpp"
#include "eredu/io/checksums.hpp"
#include "eredu/io/open_catalog.hpp"
#include "eredu/io/sha256.hpp"
#include "eredu/synth/synthetic_checkpoint.hpp"

namespace eredu::cli {
namespace {

/// SHA-256 of every tensor of the checkpoint at `out`, written as its checksum sidecar
/// (what a hot-swap verifies before it publishes).
std::filesystem::path write_checksums(const std::filesystem::path& out) {
  const io::Catalog catalog = io::open_catalog(out);
  io::Checksums sums;
  std::vector<std::byte> buffer(std::size_t{4} << 20);
  for (const io::TensorInfo& t : catalog.tensors()) {
    const std::string& path = catalog.file_of(t).path;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      throw Error(errc::io_error, {.file = path, .os_error = std::error_code(errno, std::system_category())},
                  "cannot open the shard to hash it");
    io::Sha256 hash;
    std::uint64_t done = 0;
    while (done < t.nbytes) {
      const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), t.nbytes - done));
      const ssize_t r = ::pread(fd, buffer.data(), want, static_cast<off_t>(t.offset + done));
      if (r <= 0) {
        const int err = r < 0 ? errno : 0;
        ::close(fd);
        throw Error(r < 0 ? errc::io_error : errc::unexpected_eof,
                    {.file = path,
                     .tensor = t.name,
                     .offset = t.offset + done,
                     .os_error = std::error_code(err, std::system_category())},
                    "reading the tensor to hash it failed");
      }
      hash.update(std::span(buffer.data(), static_cast<std::size_t>(r)));
      done += static_cast<std::uint64_t>(r);
    }
    ::close(fd);
    sums.add(t.name, hash.hex_digest());
  }
  const std::filesystem::path sidecar = io::Checksums::sidecar_path(out);
  std::ofstream file(sidecar, std::ios::binary | std::ios::trunc);
  file << sums.to_json();
  file.close();
  if (!file) throw Error(errc::io_error, {.file = sidecar.string()}, "cannot write the checksum sidecar");
  return sidecar;
}

}  // namespace

int run_gen(int argc, char** argv) {
  Args args = parse_args(argc, argv, 2, {"size", "dtype", "shards", "seed", "layers"},
                         {"tie-embeddings", "checksums", "quiet"});
  if (args.positional.size() != 1) {
    throw std::invalid_argument(
        "usage: eredu gen OUT [--size 512M] [--dtype bf16|f16|f32] [--shards N] [--seed S] [--layers N] "
        "[--tie-embeddings] [--checksums]");
  }
  synth::SyntheticOptions o;
  o.target_bytes = parse_bytes(args.get("size", "512M"));
  std::string dtype = args.get("dtype", "bf16");
  if (dtype == "bf16")
    o.dtype = DType::BF16;
  else if (dtype == "f16")
    o.dtype = DType::F16;
  else if (dtype == "f32")
    o.dtype = DType::F32;
  else
    throw std::invalid_argument("--dtype must be bf16, f16 or f32");
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
  if (args.has("checksums")) {
    const std::filesystem::path sidecar = write_checksums(out);
    if (!args.has("quiet")) fmt::print(stderr, "wrote the SHA-256 of every tensor to {}\n", sidecar.string());
  }
  return 0;
}

}  // namespace eredu::cli
