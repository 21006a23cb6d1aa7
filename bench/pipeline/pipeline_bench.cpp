// pipeline_bench: PrefetchPipeline against a serial loop over the same layers, in one
// process, round after round.
//
//   serial    for each pass, for each layer: load it (I/O), then compute with it. Gives
//             Σ I/O and Σ compute, measured separately, and their sum as the serial time.
//   pipeline  the same passes through engine::PrefetchPipeline (look-ahead K, budget
//             (K+1) layers): the consumer computes with layer i while i+1..i+K load.
//
// The target is pipeline ≤ 1.1 × max(Σ I/O, Σ compute) of the same round. --tokens is the
// compute knob (each weight row is used for that many token vectors); --cold evicts the
// checkpoint from the page cache before each run and every layer's bytes right after use, so
// every read goes to the disk. Storage comes from a pool warmed by an untimed pass first, so
// neither run pays for first-touching memory.
//
//   pipeline_bench PATH [--generate] [--layers 16] [--hidden 1024] [--tokens 1] [--lookahead 2] [--concurrent 1]
//                  [--passes 3] [--rounds 3] [--threads N] [--cold] [--json]
//
// --generate writes an MLP-only BF16 checkpoint of --layers × --hidden at PATH if it is
// missing. The JSON object (one line) is the last line of the output.

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <tbb/global_control.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/engine/orchestration/load.hpp"
#include "eredu/engine/serving/prefetch_pipeline.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "eredu/io/reading/unique_fd.hpp"
#include "mlp_stack.hpp"

using namespace eredu;
using namespace eredu::example;

namespace {

using Clock = std::chrono::steady_clock;
using Pipeline = engine::PrefetchPipeline<cpu::Backend, MlpLayer>;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

/// The command line.
struct Options {
  std::filesystem::path path;
  bool generate = false;
  std::uint64_t layers = 16;
  std::uint64_t hidden = 1024;
  std::size_t tokens = 1;
  std::size_t lookahead = 2;
  std::size_t concurrent = 1;  // units read at once (PrefetchOptions::concurrent_loads)
  std::size_t passes = 3;
  std::size_t rounds = 3;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool cold = false;
  bool json = false;
};

/// Drops the page cache of checkpoint byte ranges (clean pages go without root), so the next
/// read of them goes to the disk.
class Evictor {
 public:
  explicit Evictor(const io::Catalog& catalog) {
    for (const io::CheckpointFile& f : catalog.files()) {
      const int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0)
        throw Error(errc::io_error, {.file = f.path, .os_error = std::error_code(errno, std::generic_category())},
                    "cannot open to evict");
      fds_.emplace_back(fd);
    }
  }
  /// Evicts every file whole.
  void all() const {
    for (const io::UniqueFd& fd : fds_) ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  }
  /// Evicts the bytes of tensor `t`.
  void tensor(const io::TensorInfo& t) const {
    ::posix_fadvise(fds_.at(t.file).get(), static_cast<off_t>(t.offset), static_cast<off_t>(t.nbytes),
                    POSIX_FADV_DONTNEED);
  }

 private:
  std::vector<io::UniqueFd> fds_;
};

/// What one round measured.
struct Round {
  double io_s = 0;        // serial: Σ load time
  double compute_s = 0;   // serial: Σ compute time
  double serial_s = 0;    // serial: wall
  double pipeline_s = 0;  // pipeline: wall
  double pipeline_compute_s = 0;
  double stall_s = 0;        // pipeline: Σ consumer wait
  double pipeline_io_s = 0;  // pipeline: Σ per-unit load time (loads overlap)
  std::uint64_t high_water = 0;
  std::uint64_t budget = 0;
  double ratio() const { return pipeline_s / std::max(io_s, compute_s); }
};

/// Everything the runs share.
struct Bench {
  io::CheckpointSource& source;
  StackConfig config;
  Options options;
  cpu::Executor& compute;
  cpu::MaterializationContext& context;
  Evictor evict;
  // posix_fadvise(DONTNEED) drains every CPU's LRU lists and waits for it: on a busy
  // machine that blocks for milliseconds, so it runs here, never on the event loop.
  asio::thread_pool& evict_thread;
  std::vector<engine::PipelineUnit> units() const {
    std::vector<engine::PipelineUnit> out;
    for (std::uint64_t i = 0; i < config.layers; ++i) out.push_back(layer_unit(source.catalog(), i));
    return out;
  }
  /// With --cold, drops layer `i`'s bytes from the page cache (it has just been read).
  void used(std::uint64_t i) const {
    if (!options.cold) return;
    std::vector<const io::TensorInfo*> tensors;
    for (const char* leaf :
         {"post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"})
      tensors.push_back(&source.catalog().at(layer_key(i, leaf)));
    asio::post(evict_thread, [this, tensors] {
      for (const io::TensorInfo* t : tensors) evict.tensor(*t);
    });
  }
};

asio::awaitable<void> compute(cpu::Executor& executor, const MlpLayer& layer, Activations& a) {
  Completion done = executor.submit([&layer, &a] { apply_layer(layer, a); });
  co_await done.async_wait(asio::use_awaitable);
}

/// Load, then compute, layer after layer; the previous layer is dropped before the next
/// load so its storage is recycled, as the pipeline's is.
asio::awaitable<void> run_serial(Bench& b, Round& r) {
  if (b.options.cold) b.evict.all();
  Activations a = Activations::initial(b.options.tokens, b.config.hidden);
  std::vector<engine::PipelineUnit> units = b.units();
  const Clock::time_point start = Clock::now();
  for (std::size_t pass = 0; pass < b.options.passes; ++pass)
    for (std::uint64_t i = 0; i < b.config.layers; ++i) {
      MlpLayer layer(b.config);
      Clock::time_point t = Clock::now();
      co_await engine::async_load<cpu::Backend>(layer, b.source, units[i].plan, b.context, asio::use_awaitable);
      r.io_s += seconds_since(t);
      b.used(i);
      t = Clock::now();
      co_await compute(b.compute, layer, a);
      r.compute_s += seconds_since(t);
    }
  r.serial_s = seconds_since(start);
}

/// The same passes through the pipeline. `timed` false: a warm-up pass.
asio::awaitable<void> run_pipeline(Bench& b, Round& r, std::size_t passes) {
  if (b.options.cold) b.evict.all();
  Activations a = Activations::initial(b.options.tokens, b.config.hidden);
  const engine::PrefetchOptions prefetch{.lookahead = b.options.lookahead,
                                         .resident_budget = (b.options.lookahead + 1) * b.config.layer_bytes(),
                                         .passes = passes,
                                         .concurrent_loads = b.options.concurrent};
  const StackConfig config = b.config;
  Pipeline pipeline(
      b.source, b.units(), [config](std::size_t) { return MlpLayer(config); }, b.context, prefetch);
  const Clock::time_point start = Clock::now();
  while (auto unit = co_await pipeline.async_next(asio::use_awaitable)) {
    b.used(unit.index());
    const Clock::time_point t = Clock::now();
    co_await compute(b.compute, unit.module(), a);
    r.pipeline_compute_s += seconds_since(t);
  }
  r.pipeline_s = seconds_since(start);
  co_await pipeline.async_close(asio::use_awaitable);
  const engine::PipelineStats stats = pipeline.stats();
  r.stall_s = stats.stall_s;
  r.pipeline_io_s = stats.load_s;
  r.high_water = stats.resident_high_water;
  r.budget = stats.budget;
}

/// Opens the checkpoint, warms up, then runs the rounds.
asio::awaitable<std::vector<Round>> run_all(asio::any_io_executor executor, Options options,
                                            cpu::Executor& compute_arena, cpu::MaterializationContext& context,
                                            StackConfig* config_out) {
  io::SourceOptions source_options;
  // Every weight is read straight into its tensor (no staging); depth 8 / 8 MiB requests
  // keep both cores copying as `eredu load` does.
  source_options.reader.depth = 8;
  source_options.reader.max_request = std::size_t{8} << 20;
  std::unique_ptr<io::CheckpointSource> source =
      co_await io::async_open_checkpoint(executor, options.path, source_options, asio::use_awaitable);
  const StackConfig config = StackConfig::from_catalog(source->catalog());
  *config_out = config;
  asio::thread_pool evict_thread(1);
  Bench bench{*source, config, options, compute_arena, context, Evictor(source->catalog()), evict_thread};
  Round warm;
  co_await run_pipeline(bench, warm, 1);
  std::vector<Round> rounds(options.rounds);
  for (Round& r : rounds) {
    co_await run_serial(bench, r);
    co_await run_pipeline(bench, r, options.passes);
  }
  evict_thread.join();  // before `bench`, which its evictions use, goes
  co_return rounds;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::uint64_t {
      if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value", arg));
      return std::stoull(argv[++i]);
    };
    if (arg == "--generate")
      o.generate = true;
    else if (arg == "--cold")
      o.cold = true;
    else if (arg == "--json")
      o.json = true;
    else if (arg == "--layers")
      o.layers = value();
    else if (arg == "--hidden")
      o.hidden = value();
    else if (arg == "--tokens")
      o.tokens = value();
    else if (arg == "--lookahead")
      o.lookahead = value();
    else if (arg == "--concurrent")
      o.concurrent = value();
    else if (arg == "--passes")
      o.passes = value();
    else if (arg == "--rounds")
      o.rounds = value();
    else if (arg == "--threads")
      o.threads = static_cast<int>(value());
    else if (arg.rfind("--", 0) == 0 || !o.path.empty())
      throw std::invalid_argument("unexpected " + arg);
    else
      o.path = arg;
  }
  if (o.path.empty()) throw std::invalid_argument("PATH is required");
  if (o.lookahead < 1 || o.concurrent < 1 || o.passes < 1 || o.tokens < 1 || o.threads < 1 || o.rounds < 1 ||
      o.hidden < 8)
    throw std::invalid_argument("counts must be at least 1, --hidden at least 8");
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

int run(int argc, char** argv) {
  const Options options = parse(argc, argv);
  if (options.generate && !std::filesystem::exists(options.path)) {
    const std::uint64_t inter = std::max<std::uint64_t>(256, (options.hidden * 8 / 3 + 128) / 256 * 256);
    const StackConfig config{options.hidden, inter, options.layers, DType::BF16};
    // Written under another name so an interrupted run never leaves a truncated checkpoint.
    const std::filesystem::path partial = options.path.string() + ".partial";
    write_stack_checkpoint(partial, config, 5);
    std::filesystem::rename(partial, options.path);
  }
  tbb::global_control workers(tbb::global_control::max_allowed_parallelism,
                              static_cast<std::size_t>(options.threads) + 1);
  cpu::Executor loads(options.threads), compute_arena(options.threads);
  cpu::StoragePool storage;
  cpu::MaterializationContext context{loads, storage};
  asio::io_context ctx(1);
  StackConfig config;
  std::future<std::vector<Round>> done =
      asio::co_spawn(ctx, run_all(ctx.get_executor(), options, compute_arena, context, &config), asio::use_future);
  ctx.run();
  const std::vector<Round> rounds = done.get();

  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  const std::uint64_t peak_rss = static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;
  std::vector<double> ratios, io, comp, serial, pipe, stall;
  std::uint64_t high_water = 0, budget = 0;
  for (const Round& r : rounds) {
    ratios.push_back(r.ratio());
    io.push_back(r.io_s);
    comp.push_back(r.compute_s);
    serial.push_back(r.serial_s);
    pipe.push_back(r.pipeline_s);
    stall.push_back(r.stall_s);
    high_water = std::max(high_water, r.high_water);
    budget = r.budget;
  }
  const std::uint64_t units = config.layers * options.passes;
  {
    fmt::print(
        "{} blocks of {:.2f} MiB (hidden {}, intermediate {}), {} passes, {} tokens, look-ahead {}, "
        "{} threads, {} reads\n",
        config.layers, static_cast<double>(config.layer_bytes()) / (1 << 20), config.hidden, config.intermediate,
        options.passes, options.tokens, options.lookahead, options.threads, options.cold ? "cold" : "page-cache");
    fmt::print("round  Σ I/O s  Σ compute s  serial s  pipeline s  stall s  pipeline/max(I/O,compute)\n");
    for (std::size_t i = 0; i < rounds.size(); ++i) {
      const Round& r = rounds[i];
      fmt::print("{:>5} {:>8.3f} {:>12.3f} {:>9.3f} {:>11.3f} {:>8.3f} {:>26.3f}\n", i + 1, r.io_s, r.compute_s,
                 r.serial_s, r.pipeline_s, r.stall_s, r.ratio());
    }
    const double m = median(ratios);
    fmt::print(
        "median ratio {:.3f} (target ≤ 1.10: {}); per layer: I/O {:.2f} ms, compute {:.2f} ms (serial medians)\n", m,
        m <= 1.10 ? "met" : "NOT met", 1e3 * median(io) / static_cast<double>(units),
        1e3 * median(comp) / static_cast<double>(units));
    fmt::print("resident high-water {} of a {} budget ({}); peak RSS {:.1f} MiB\n", high_water, budget,
               high_water <= budget ? "within" : "OVER", static_cast<double>(peak_rss) / (1 << 20));
  }
  if (options.json) {
    std::string list;
    for (const Round& r : rounds)
      list += fmt::format(
          "{}{{\"io_s\":{:.6f},\"compute_s\":{:.6f},\"serial_s\":{:.6f},\"pipeline_s\":{:.6f},"
          "\"pipeline_compute_s\":{:.6f},\"pipeline_io_s\":{:.6f},\"stall_s\":{:.6f},\"ratio\":{:.4f}}}",
          list.empty() ? "" : ",", r.io_s, r.compute_s, r.serial_s, r.pipeline_s, r.pipeline_compute_s, r.pipeline_io_s,
          r.stall_s, r.ratio());
    fmt::print(
        "{{\"layers\":{},\"layer_bytes\":{},\"hidden\":{},\"intermediate\":{},\"passes\":{},\"tokens\":{},"
        "\"lookahead\":{},\"concurrent_loads\":{},\"threads\":{},\"cold\":{},\"rounds\":[{}],\"median_ratio\":{:.4f},"
        "\"median_io_s\":{:.6f},\"median_compute_s\":{:.6f},\"median_pipeline_s\":{:.6f},"
        "\"resident_high_water\":{},\"budget\":{},\"peak_rss_bytes\":{}}}\n",
        config.layers, config.layer_bytes(), config.hidden, config.intermediate, options.passes, options.tokens,
        options.lookahead, options.concurrent, options.threads, options.cold ? "true" : "false", list, median(ratios),
        median(io), median(comp), median(pipe), high_water, budget, peak_rss);
  }
  return high_water <= budget ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr,
               "pipeline_bench: {}\nusage: pipeline_bench PATH [--generate] [--layers 16] [--hidden 1024] [--tokens 1] "
               "[--lookahead 2] [--concurrent 1] [--passes 3] [--rounds 3] [--threads N] [--cold] [--json]\n",
               e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "pipeline_bench: {}\n", e.what());
  }
  return 1;
}
