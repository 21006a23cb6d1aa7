// GGUF benchmarks (bench/gguf.sh runs them): a kept-dtype load of a synthetic GGUF file against
// a safetensors load of the same bytes, rounds interleaved; and dequantization throughput per
// type against the write-bandwidth limit of the output, measured in the same rounds.
//
//   gguf_bench gen DIR SIZE DTYPE        writes DIR/model.gguf and DIR/model.safetensors (the same
//                                        tensor bytes; quantized tensors as U8 rows of blocks)
//   gguf_bench load DIR ROUNDS [FIRST]   both files, alternating order (FIRST 1: safetensors first
//                                        in round 0), through the CPU backend: into fresh storage,
//                                        then into storage recycled from earlier loads
//   gguf_bench dequant MIB ROUNDS TYPES  each type to bf16 and f32 vs parallel streaming fill
// Each prints one line per measurement: "<what> round <r> <seconds> <GiB/s>", then medians.
#include <sys/resource.h>
#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <asio/io_context.hpp>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/cpu/convert.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "eredu/synth/gguf_writer.hpp"
#include "eredu/synth/synthetic_gguf.hpp"

using namespace eredu;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
double gib(std::uint64_t b) { return static_cast<double>(b) / double(1ull << 30); }

std::map<std::string, std::vector<double>> results;  // GiB/s per measurement

void record(const std::string& what, int round, double secs, std::uint64_t bytes) {
  const double rate = gib(bytes) / secs;
  results[what].push_back(rate);
  fmt::print("{} round {} {:.4f} s {:.2f} GiB/s\n", what, round, secs, rate);
}

void summary() {
  fmt::print("\nmedian GiB/s (min-max) over rounds:\n");
  for (auto& [what, v] : results) {
    std::sort(v.begin(), v.end());
    fmt::print("  {:<28} {:>7.2f}  ({:.2f}-{:.2f}, n={})\n", what, v[v.size() / 2], v.front(), v.back(), v.size());
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  fmt::print("peak RSS {:.0f} MiB\n", static_cast<double>(ru.ru_maxrss) / 1024.0);
}

int gen(const fs::path& dir, std::uint64_t size, DType dtype) {
  fs::create_directories(dir);
  synth::SyntheticOptions o;
  o.target_bytes = size;
  o.dtype = dtype;
  synth::write_synthetic_gguf(dir / "model.gguf", o);
  // The same bytes as safetensors: quantized tensors become U8 [rows, row bytes].
  const synth::SyntheticModel m = synth::plan_gguf_model(o);
  std::vector<synth::TensorSpec> st;
  for (const auto& t : m.tensors) {
    if (!dtype_is_quantized(t.dtype)) {
      st.push_back(t);
      continue;
    }
    const std::uint64_t row_bytes = t.shape.back() / dtype_block(t.dtype).elements * dtype_block(t.dtype).bytes;
    st.push_back({t.name, DType::U8, {synth::tensor_nbytes(t) / row_bytes, row_bytes}});
  }
  synth::SafetensorsFileWriter w(dir / "model.safetensors", st);
  std::vector<std::byte> buf(std::size_t{4} << 20);
  for (const auto& t : m.tensors) {
    const std::uint64_t n = synth::tensor_nbytes(t);
    for (std::uint64_t at = 0; at < n; at += buf.size()) {
      const auto len = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), n - at));
      synth::fill_gguf_tensor_bytes(o.seed, t, at, std::span(buf.data(), len));
      w.write(std::span(buf.data(), len));
    }
  }
  w.finish();
  fmt::print("wrote {} tensors, {:.2f} GiB, {} and model.safetensors\n", m.tensors.size(), gib(m.total_bytes),
             (dir / "model.gguf").string());
  return 0;
}

// Loads every tensor of `path`, dtype kept, into CPU tensors; returns the bytes loaded.
std::uint64_t load_all(const fs::path& path, cpu::StoragePool& storage, cpu::Executor& executor) {
  asio::io_context ctx;
  io::SourceOptions options;
  options.pool.budget = std::size_t{256} << 20;
  auto source = io::CheckpointSource::open(ctx.get_executor(), path, options);
  cpu::MaterializationContext mc{executor, storage};
  std::vector<cpu::Materialization> pending;
  std::uint64_t bytes = 0;
  for (const auto& t : source->catalog().tensors()) {
    pending.push_back(cpu::Backend::materialize(*source, {t.name}, mc, {}));
    bytes += t.nbytes;
  }
  std::vector<cpu::Tensor> tensors;
  for (auto& m : pending) {
    while (!m.done.ready()) {
      ctx.restart();
      ctx.run_one_for(std::chrono::milliseconds(2));
    }
    tensors.push_back(cpu::Backend::finish_materialization(std::move(m)));
  }
  return bytes;
}

int load(const fs::path& dir, int rounds, int first) {
  // The executor's two threads are TBB workers: allow them (TBB's default is one per CPU, the
  // calling thread included), as the eredu command does.
  tbb::global_control workers(tbb::global_control::max_allowed_parallelism, 3);
  cpu::Executor executor{2};
  const fs::path files[2] = {dir / "model.gguf", dir / "model.safetensors"};
  const char* fresh_names[2] = {"load gguf (dtype kept)", "load safetensors (same bytes)"};
  const char* recycled_names[2] = {"load gguf, recycled storage", "load safetensors, recycled storage"};
  // Recycled: one pool, warmed by an untimed load of each file, so these loads measure the
  // formats' paths without the fresh-memory noise of these VMs (3x between rounds).
  cpu::StoragePool warm;
  for (const fs::path& f : files) load_all(f, warm, executor);
  for (int r = 0; r < rounds; ++r) {
    for (int k = 0; k < 4; ++k) {
      const int i = (first + r + k) % 2;  // rotate the order every round
      const bool recycled = k >= 2;
      // Fresh: a storage pool per load, so both are first loads into fresh memory (a shared
      // pool would hand the second one the first one's pages).
      cpu::StoragePool fresh;
      const auto t0 = Clock::now();
      const std::uint64_t bytes = load_all(files[i], recycled ? warm : fresh, executor);
      record(recycled ? recycled_names[i] : fresh_names[i], r, seconds_since(t0), bytes);
    }
  }
  summary();
  return 0;
}

// Parallel streaming fill of `out`: the write-bandwidth limit for an output of this size.
void fill(std::span<std::byte> out) {
  const std::size_t chunk = std::size_t{1} << 20;
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, (out.size() + chunk - 1) / chunk),
                    [&](const tbb::blocked_range<std::size_t>& r) {
                      for (std::size_t c = r.begin(); c != r.end(); ++c) {
                        const std::size_t at = c * chunk, n = std::min(chunk, out.size() - at);
                        std::memset(out.data() + at, 0x3C, n);
                      }
                    });
}

int dequant(std::size_t out_mib, int rounds, const std::vector<DType>& types) {
  const std::size_t out_bytes = out_mib << 20;
  // Aligned as the CPU backend's storage is (streaming stores need 32 bytes; a vector's
  // large allocation is 16 bytes past a page).
  std::vector<std::byte> storage(out_bytes + 64);
  void* start = storage.data();
  std::size_t room = storage.size();
  const std::span<std::byte> out(static_cast<std::byte*>(std::align(64, out_bytes, start, room)), out_bytes);
  fill(out);  // resident before any round
  // The best kernels, and the AVX2 ones where the best are another set (AVX512-BF16), in the
  // same rounds: the bf16 rows then show what each set gives.
  std::vector<cpu::ConvertIsa> isas{cpu::ConvertIsa::best};
  std::vector<std::string> isa_names{cpu::convert_isa_name()};
  cpu::use_convert_isa(cpu::ConvertIsa::avx2);
  if (isa_names[0] != cpu::convert_isa_name()) {
    isas.push_back(cpu::ConvertIsa::avx2);
    isa_names.emplace_back(cpu::convert_isa_name());
  }
  cpu::use_convert_isa(cpu::ConvertIsa::best);
  for (DType t : types) {
    const DTypeBlock block = dtype_block(t);
    for (DType to : {DType::BF16, DType::F32}) {
      const std::size_t out_elem = dtype_bits(to) / 8;
      const std::size_t blocks = out_bytes / (block.elements * out_elem);
      std::vector<std::byte> in(blocks * block.bytes);
      synth::fill_quantized_bytes(1, {"bench", t, {blocks * block.elements}}, 0, in);
      const std::span<std::byte> dst(out.data(), blocks * block.elements * out_elem);
      const std::size_t contenders = isas.size() + 1;  // the kernel sets, then the fill
      for (int r = 0; r < rounds; ++r) {
        for (std::size_t k = 0; k < contenders; ++k) {
          const std::size_t c = (static_cast<std::size_t>(r) + k) % contenders;  // rotate the order
          const auto t0 = Clock::now();
          if (c < isas.size()) {
            cpu::use_convert_isa(isas[c]);
            cpu::convert(t, to, in, dst);
            const double secs = seconds_since(t0);
            cpu::use_convert_isa(cpu::ConvertIsa::best);
            // The first set keeps the plain name (bench/gguf.sh's targets read it).
            const std::string what = fmt::format("{} -> {}{}", dtype_name(t), dtype_name(to),
                                                 c == 0 ? std::string() : " [" + isa_names[c] + "]");
            record(what, r, secs, dst.size());
          } else {
            fill(dst);
            record(fmt::format("write limit ({} MiB)", dst.size() >> 20), r, seconds_since(t0), dst.size());
          }
        }
      }
    }
  }
  fmt::print("kernels: {}{}\n", isa_names[0], isas.size() > 1 ? ", and " + isa_names[1] + " in [ ]" : "");
  summary();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tbb::global_control workers(tbb::global_control::max_allowed_parallelism,
                              std::max(2u, std::thread::hardware_concurrency()));
  try {
    const std::vector<std::string> a(argv + 1, argv + argc);
    if (a.size() >= 4 && a[0] == "gen") {
      return gen(a[1], std::stoull(a[2]) << 20, *dtype_from_any_name(a[3]));
    }
    if (a.size() >= 3 && a[0] == "load") return load(a[1], std::stoi(a[2]), a.size() > 3 ? std::stoi(a[3]) % 2 : 0);
    if (a.size() >= 3 && a[0] == "dequant") {
      std::vector<DType> types;
      for (std::size_t i = 3; i < a.size(); ++i) {
        const auto t = dtype_from_any_name(a[i]);
        if (!t) throw std::runtime_error("unknown dtype " + a[i]);
        types.push_back(*t);
      }
      return dequant(std::stoull(a[1]), std::stoi(a[2]), types);
    }
    fmt::print(stderr,
               "usage: gguf_bench gen DIR MIB DTYPE | load DIR ROUNDS [FIRST] | dequant OUT_MIB ROUNDS TYPE...\n");
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "gguf_bench: {}\n", e.what());
    return 1;
  }
}
