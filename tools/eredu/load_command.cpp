// `eredu load`: every tensor of a checkpoint into CPU tensors through the engine.
#include <tbb/global_control.h>

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "commands.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/cpu/catalog_module.hpp"
#include "eredu/cpu/convert.hpp"
#include "eredu/engine/load.hpp"
#include "eredu/io/json_text.hpp"

namespace eredu::cli {
namespace {

constexpr const char* load_usage =
    "usage: eredu load PATH [--dtype keep|bf16|f16|f32] [--threads N] [--budget 256M] [--repeat N] "
    "[--reader auto|uring|pread] [--depth 8] [--request 8M] [--kernels best|generic] [--chunk 64M] "
    "[--copies arena|reader] [--json]";

/// One timed load.
struct LoadRun {
  double seconds = 0;
  bool recycled = false;
};

/// Redraws the progress bar from the engine's counters every 100 ms until `done`.
void watch_progress(asio::steady_timer& timer, const engine::MaterializeProgress& counters, Progress& bar,
                    const bool& done) {
  timer.expires_after(std::chrono::milliseconds(100));
  timer.async_wait([&timer, &counters, &bar, &done](std::error_code ec) {
    if (ec || done) return;
    bar.update(counters.bytes_done.load(std::memory_order_relaxed));
    watch_progress(timer, counters, bar, done);
  });
}

std::optional<DType> parse_dtype(const std::string& text) {
  if (text == "keep") return std::nullopt;
  if (text == "bf16") return DType::BF16;
  if (text == "f16") return DType::F16;
  if (text == "f32") return DType::F32;
  throw std::invalid_argument("--dtype must be keep, bf16, f16 or f32");
}

}  // namespace

int run_load(int argc, char** argv) {
  Args args = parse_args(
      argc, argv, 2,
      {"dtype", "threads", "budget", "repeat", "reader", "depth", "request", "kernels", "chunk", "copies"}, {"json"});
  if (args.positional.size() != 1) throw std::invalid_argument(load_usage);
  const std::string dtype_text = args.get("dtype", "keep");
  const std::optional<DType> cast_to = parse_dtype(dtype_text);
  const int threads = std::stoi(args.get("threads", std::to_string(std::thread::hardware_concurrency())));
  if (threads < 1) throw std::invalid_argument("--threads must be at least 1");
  const int repeat = std::stoi(args.get("repeat", "1"));
  if (repeat < 1) throw std::invalid_argument("--repeat must be at least 1");
  io::SourceOptions opts;
  opts.pool.budget = parse_bytes(args.get("budget", "256M"));
  // A load has every tensor in flight at once: deeper and larger requests keep both cores
  // copying (recycled 4 GiB loads: 11-13.5 GB/s at depth 8 / 8 MiB, 10.6-11.6 at 4 / 4 MiB).
  opts.reader.depth = static_cast<unsigned>(std::stoul(args.get("depth", "8")));
  opts.reader.max_request = parse_bytes(args.get("request", "8M"));
  const std::string reader = args.get("reader", "auto");
  if (reader == "uring")
    opts.reader.kind = io::ReaderKind::uring;
  else if (reader == "pread")
    opts.reader.kind = io::ReaderKind::pread;
  else if (reader != "auto")
    throw std::invalid_argument("--reader must be auto, uring or pread");
  // Converted tensors are read in chunk leases of this size, each converted while the next is read.
  opts.chunk_bytes = parse_bytes(args.get("chunk", "64M"));
  const bool json = args.has("json");
  const std::string copies = args.get("copies", "arena");
  if (copies != "arena" && copies != "reader") throw std::invalid_argument("--copies must be arena or reader");
  const std::string kernels = args.get("kernels", "best");
  if (kernels == "generic")
    cpu::use_convert_isa(cpu::ConvertIsa::generic);
  else if (kernels != "best")
    throw std::invalid_argument("--kernels must be best or generic");

  // The event loop thread only submits reads and resumes coroutines; populating memory and
  // converting run on TBB workers, so there must be `threads` of them besides this thread.
  tbb::global_control workers(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(threads) + 1);
  cpu::Executor executor(threads);
  cpu::StoragePool storage;
  // A load has the machine to itself: copying resident tensors on the arena beats the
  // kernel's copies (docs/performance.md).
  cpu::MaterializationContext context{executor, storage, copies == "arena"};

  asio::io_context ctx(1);
  auto source = io::CheckpointSource::open(ctx.get_executor(), args.positional[0], opts);
  const auto& catalog = source->catalog();
  const cpu::CatalogModule blueprint = cpu::CatalogModule::mirror(catalog, cast_to);
  const std::uint64_t source_bytes = catalog.total_bytes();

  std::vector<LoadRun> runs;
  std::optional<cpu::CatalogModule> model;
  for (int r = 0; r < repeat; ++r) {
    // Drop the previous model first: its storage returns to the pool and is reused.
    model.reset();
    const bool recycled = storage.stats().retained_bytes > 0;
    model.emplace(blueprint.unbound());
    engine::MaterializeProgress counters;
    Progress bar(repeat > 1 ? fmt::format("load {}/{}", r + 1, repeat) : std::string("load"), blueprint.bytes());
    bool done = false;
    asio::steady_timer timer(ctx);
    watch_progress(timer, counters, bar, done);
    const double t0 = now_seconds();
    std::exception_ptr failure;
    double seconds = 0;
    engine::async_load<cpu::Backend>(*model, *source, blueprint.plan(), context, {.progress = &counters},
                                     [&](std::exception_ptr e) {
                                       seconds = now_seconds() - t0;
                                       failure = e;
                                       done = true;
                                       timer.cancel();
                                     });
    ctx.restart();
    ctx.run();  // returns once the load has completed and the progress timer is cancelled
    bar.finish();
    if (failure) std::rethrow_exception(failure);
    runs.push_back({seconds, recycled});
  }

  const std::uint64_t rss = peak_rss_bytes();
  if (json) {
    std::string loads;
    for (const auto& run : runs)
      loads += fmt::format("{}{{\"seconds\":{:.6f},\"gb_per_s\":{:.4f},\"recycled\":{}}}", loads.empty() ? "" : ",",
                           run.seconds, static_cast<double>(source_bytes) / run.seconds / 1e9,
                           run.recycled ? "true" : "false");
    fmt::print(
        "{{\"path\":{},\"reader\":{},\"tensors\":{},\"files\":{},\"source_bytes\":{},\"bytes\":{},\"dtype\":{},"
        "\"threads\":{},\"kernels\":{},\"copies\":{},\"budget\":{},\"loads\":[{}],\"staging_high_water\":{},\"peak_rss_"
        "bytes\":{},"
        "\"storage_retained_bytes\":{}}}\n",
        io::json::quoted(args.positional[0]), io::json::quoted(source->reader().name()), catalog.size(),
        catalog.files().size(), source_bytes, blueprint.bytes(), io::json::quoted(dtype_text), threads,
        io::json::quoted(cpu::convert_isa_name()), io::json::quoted(copies), source->pool().budget(), loads,
        source->pool().high_water(), rss, storage.stats().retained_bytes);
  } else {
    for (std::size_t i = 0; i < runs.size(); ++i)
      fmt::print("load{} {} ({} tensors, {} file{}) into {} of CPU tensors ({}) in {:.3f} s: {:.2f} GB/s{}\n",
                 runs.size() > 1 ? fmt::format(" {}", i + 1) : std::string(), format_bytes(source_bytes),
                 catalog.size(), catalog.files().size(), catalog.files().size() == 1 ? "" : "s",
                 format_bytes(blueprint.bytes()), dtype_text, runs[i].seconds,
                 static_cast<double>(source_bytes) / runs[i].seconds / 1e9,
                 runs[i].recycled ? " (recycled storage)" : " (fresh storage)");
    fmt::print("  threads  {} (TBB arena), conversion kernels {}, reader {}\n", threads, cpu::convert_isa_name(),
               source->reader().describe());
    fmt::print("  staging  high-water {} of a {} budget\n", format_bytes(source->pool().high_water()),
               format_bytes(source->pool().budget()));
    fmt::print("  memory   peak RSS {}\n", format_bytes(rss));
  }
  return 0;
}

}  // namespace eredu::cli
