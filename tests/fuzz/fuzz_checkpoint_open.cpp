// libFuzzer target: whole checkpoints, opened and read the way a load does. One input is a
// small archive of files (layout below) written to an in-memory directory (tmpfs); the harness
// opens it with CheckpointSource (safetensors file, sharded index + shards, GGUF file, split
// GGUF set), then reads every tensor whole and by rows with the io_uring or the pread reader.
// A bug is: any exception other than eredu::Error, any sanitizer report, a catalog range
// outside its file, a read of a cataloged range that fails with anything but a budget or
// selection error, or a delivered byte that is not the file's byte.
//
//   build/fuzz/tests/fuzz/fuzz_checkpoint_open -max_total_time=60 \
//       -dict=build/fuzz/checkpoint.dict build/fuzz/checkpoint_corpus
//
// (build/fuzz/checkpoint.dict: tests/fuzz/{safetensors,gguf,index}.dict joined, as .ci/run does)
//
// Input layout (tests/fuzz/make_checkpoint_corpus.py writes the seeds):
//   u8 layout (mod 4): 0 one safetensors file, 1 sharded safetensors (the first file is
//      model.safetensors.index.json, the others model-0000i-of-0000N.safetensors), 2 one GGUF
//      file, 3 a split GGUF set (model-0000i-of-0000N.gguf)
//   u8 flags: bit 0 io_uring (else pread), bit 1 chunked budget (4 KiB, else 1 MiB)
//   u8 file count (1 + value mod 4; layout 1 adds the index)
//   u32 little-endian length of every file but the last, then the files' bytes in order; the
//   last file takes what is left.

#include <unistd.h>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"

namespace {

namespace fs = std::filesystem;
using eredu::errc;

// One directory per process, on tmpfs where there is one: the files live in memory.
const fs::path& work_dir() {
  static const fs::path dir = [] {
    const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    fs::path d = base / ("eredu-fuzz-checkpoint-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

struct Archive {
  int layout = 0;
  bool uring = false;
  bool small_budget = false;
  std::map<std::string, std::span<const std::byte>> files;  // name -> contents
  fs::path open_path;
};

std::uint32_t read_u32(std::span<const std::byte>& in) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t(std::to_integer<std::uint8_t>(in[std::size_t(i)])) << (8 * i);
  in = in.subspan(4);
  return v;
}

std::optional<Archive> unpack(std::span<const std::byte> in) {
  if (in.size() < 3) return std::nullopt;
  Archive a;
  a.layout = std::to_integer<int>(in[0]) % 4;
  a.uring = (std::to_integer<int>(in[1]) & 1) != 0;
  a.small_budget = (std::to_integer<int>(in[1]) & 2) != 0;
  const int shards = 1 + std::to_integer<int>(in[2]) % 4;
  in = in.subspan(3);
  std::vector<std::string> names;
  switch (a.layout) {
    case 0:
      names = {"model.safetensors"};
      break;
    case 1:
      names = {"model.safetensors.index.json"};
      [[fallthrough]];
    case 3:
      for (int i = 1; i <= shards; ++i)
        names.push_back(fmt::format("model-{:05}-of-{:05}.{}", i, shards, a.layout == 1 ? "safetensors" : "gguf"));
      break;
    default:
      names = {"model.gguf"};
      break;
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    std::size_t n = in.size();
    if (i + 1 < names.size()) {
      if (in.size() < 4) return std::nullopt;
      n = read_u32(in);
      if (n > in.size()) return std::nullopt;
    }
    a.files.emplace(names[i], in.first(n));
    in = in.subspan(n);
  }
  a.open_path = a.layout == 1 ? work_dir() : work_dir() / names.front();
  return a;
}

void write_files(const Archive& a) {
  for (const auto& entry : fs::directory_iterator(work_dir())) fs::remove(entry.path());
  for (const auto& [name, bytes] : a.files) {
    std::ofstream out(work_dir() / name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    if (!out) std::abort();  // the harness's own failure, not eredu's
  }
}

// Runs one read to its completion on `ctx`; the lease, if any, outlives nothing but the check.
struct Outcome {
  std::exception_ptr error;
  std::optional<eredu::io::Lease> lease;
};

Outcome read(asio::io_context& ctx, eredu::io::CheckpointSource& source, const eredu::io::TensorReadRequest& request) {
  Outcome out;
  bool done = false;
  source.async_read(request, [&](std::exception_ptr e, eredu::io::Lease lease) {
    out.error = e;
    if (!e) out.lease.emplace(std::move(lease));
    done = true;
  });
  while (!done) ctx.run_one();
  return out;
}

// A read of a cataloged range may fail only for reasons of budget or selection.
bool acceptable(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const eredu::Error& error) {
    return error.kind() == errc::exceeds_budget || error.kind() == errc::invalid_selection;
  } catch (...) {
    return false;
  }
}

// The lease's bytes are the file's bytes at [offset, offset + size).
void expect_file_bytes(const Archive& a, const std::string& path, std::uint64_t offset, const eredu::io::Lease& lease) {
  const auto it = a.files.find(fs::path(path).filename().string());
  if (it == a.files.end()) __builtin_trap();
  const auto bytes = lease.bytes();
  if (offset > it->second.size() || bytes.size() > it->second.size() - offset) __builtin_trap();
  if (!bytes.empty() && std::memcmp(bytes.data(), it->second.data() + offset, bytes.size()) != 0) __builtin_trap();
}

void exercise(const Archive& a) {
  asio::io_context ctx;
  auto guard = asio::make_work_guard(ctx);
  eredu::io::SourceOptions options;
  options.pool.budget = a.small_budget ? 4096 : std::size_t{1} << 20;
  options.pool.huge_pages = false;
  options.pool.release_after = std::chrono::milliseconds(0);
  options.reader.kind = a.uring ? eredu::io::ReaderKind::uring : eredu::io::ReaderKind::pread;
  options.reader.depth = 2;
  options.reader.direct = eredu::io::DirectMode::off;
  options.reader.register_buffers = false;
  options.map_resident = false;
  const auto source = eredu::io::CheckpointSource::open(ctx.get_executor(), a.open_path, options);
  const auto& catalog = source->catalog();
  std::size_t checked = 0;
  for (const auto& t : catalog.tensors()) {
    if (++checked > 64) break;
    const auto& file = catalog.file_of(t);
    const auto it = a.files.find(fs::path(file.path).filename().string());
    if (it == a.files.end() || t.offset > it->second.size() || t.nbytes > it->second.size() - t.offset)
      __builtin_trap();

    {  // scoped: a lease held across the next read would wait on a full pool forever
      eredu::io::TensorReadRequest whole{t.name};
      const auto all = read(ctx, *source, whole);
      if (all.error && !acceptable(all.error)) std::rethrow_exception(all.error);
      if (all.lease) {
        if (all.lease->bytes().size() != t.nbytes) __builtin_trap();
        expect_file_bytes(a, file.path, t.offset, *all.lease);
      }
    }

    // Every row but the first: a byte range inside the tensor (or a typed selection error
    // where the rows cut a quantized block).
    if (t.shape.empty() || t.shape[0] < 2 || t.nbytes % t.shape[0] != 0) continue;
    eredu::io::TensorReadRequest rows{t.name, eredu::Selection::rows(t.shape, 1, t.shape[0])};
    const auto tail = read(ctx, *source, rows);
    if (tail.error && !acceptable(tail.error)) std::rethrow_exception(tail.error);
    if (tail.lease) {
      const std::uint64_t row_bytes = t.nbytes / t.shape[0];
      if (tail.lease->bytes().size() != t.nbytes - row_bytes) __builtin_trap();
      expect_file_bytes(a, file.path, t.offset + row_bytes, *tail.lease);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  eredu::log::set_level(eredu::log::Level::error);  // one line per opened file otherwise
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto archive = unpack({reinterpret_cast<const std::byte*>(data), size});
  if (!archive) return 0;
  write_files(*archive);
  try {
    exercise(*archive);
  } catch (const eredu::Error&) {
    // Rejections (of the header, the index, a shard) are the expected outcome for most inputs.
  }
  return 0;
}
