// prefetch_pipeline: run an MLP stack several times larger than its resident budget layer
// by layer, with engine::PrefetchPipeline reading layers i+1..i+K while layer i computes;
// then run it again with every layer resident and check the outputs are bit-identical.
//
//   prefetch_pipeline [CHECKPOINT] [--layers 12] [--hidden 768] [--lookahead 2] [--passes 3]
//                     [--tokens 4] [--threads N]
//
// Without CHECKPOINT it writes an MLP-only BF16 checkpoint of --layers blocks of width
// --hidden into a temporary directory. See README.md next to this file.

#include <tbb/global_control.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "../common/temp_dir.hpp"
#include "eredu/core/error.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/engine/orchestration/load.hpp"
#include "eredu/engine/serving/prefetch_pipeline.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "mlp_stack.hpp"

using namespace eredu;
using namespace eredu::example;

namespace {

using Clock = std::chrono::steady_clock;
using Pipeline = engine::PrefetchPipeline<cpu::Backend, MlpLayer>;

double mib(std::uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

/// The command line.
struct Options {
  std::filesystem::path checkpoint;  // empty: generate one
  std::uint64_t layers = 12;
  std::uint64_t hidden = 768;
  std::size_t lookahead = 2;
  std::size_t passes = 3;
  std::size_t tokens = 4;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
};

/// The executors and storage both runs use. Loads and compute get arenas of their own so
/// that a populate or a read never queues behind a layer's matvecs (TBB shares its workers
/// between arenas).
struct Runtime {
  cpu::Executor& loads;
  cpu::Executor& compute;
  cpu::StoragePool& storage;
  cpu::MaterializationContext context{loads, storage};
};

/// What the streamed run measured.
struct StreamedRun {
  Activations out;
  engine::PipelineStats stats;
  std::vector<double> compute_s;  // per delivered unit, in delivery order
  double wall_s = 0;
  std::uint64_t live_high_water = 0;  // the storage pool's live bytes, sampled per unit
};

/// What the all-resident run measured.
struct ResidentRun {
  Activations out;
  double load_s = 0;
  double compute_s = 0;
  std::uint64_t live_bytes = 0;
};

/// Applies `layer` to `a` on the compute arena; the event loop stays free meanwhile.
asio::awaitable<void> compute(cpu::Executor& executor, const MlpLayer& layer, Activations& a) {
  Completion done = executor.submit([&layer, &a] { apply_layer(layer, a); });
  co_await done.async_wait(asio::use_awaitable);
}

/// The streamed run: what a user writes (see docs/pipeline.md).
asio::awaitable<StreamedRun> run_streamed(io::CheckpointSource& source, StackConfig config, Options options,
                                          Runtime& rt) {
  std::vector<engine::PipelineUnit> units;
  for (std::uint64_t i = 0; i < config.layers; ++i) units.push_back(layer_unit(source.catalog(), i));
  const engine::PrefetchOptions prefetch{.lookahead = options.lookahead,
                                         .resident_budget = (options.lookahead + 1) * config.layer_bytes(),
                                         .passes = options.passes};
  Pipeline pipeline(
      source, std::move(units), [config](std::size_t) { return MlpLayer(config); }, rt.context, prefetch);

  StreamedRun run;
  run.out = Activations::initial(options.tokens, config.hidden);
  const Clock::time_point start = Clock::now();
  while (auto unit = co_await pipeline.async_next(asio::use_awaitable)) {
    run.live_high_water = std::max(run.live_high_water, rt.storage.stats().live_bytes);
    const Clock::time_point t = Clock::now();
    co_await compute(rt.compute, unit.module(), run.out);  // layers i+1..i+K load meanwhile
    run.compute_s.push_back(seconds_since(t));
  }  // each unit is released at the end of its iteration: its bytes can take unit i+K+1
  run.wall_s = seconds_since(start);
  co_await pipeline.async_close(asio::use_awaitable);
  run.stats = pipeline.stats();
  co_return run;
}

/// The reference: every layer loaded (and resident) first, then the same passes.
asio::awaitable<ResidentRun> run_resident(io::CheckpointSource& source, StackConfig config, Options options,
                                          Runtime& rt) {
  ResidentRun run;
  std::vector<MlpLayer> layers(config.layers, MlpLayer(config));
  Clock::time_point t = Clock::now();
  for (std::uint64_t i = 0; i < config.layers; ++i) {
    const engine::WeightBindingPlan plan = layer_unit(source.catalog(), i).plan;
    co_await engine::async_load<cpu::Backend>(layers[i], source, plan, rt.context, asio::use_awaitable);
  }
  run.load_s = seconds_since(t);
  run.live_bytes = rt.storage.stats().live_bytes;
  run.out = Activations::initial(options.tokens, config.hidden);
  t = Clock::now();
  for (std::size_t pass = 0; pass < options.passes; ++pass)
    for (const MlpLayer& layer : layers) co_await compute(rt.compute, layer, run.out);
  run.compute_s = seconds_since(t);
  co_return run;
}

/// Both runs, in order, on the event loop.
struct Runs {
  StackConfig config;
  StreamedRun streamed;
  ResidentRun resident;
};

asio::awaitable<Runs> run_both(asio::any_io_executor executor, Options options, Runtime& rt) {
  const io::SourceOptions source_options;  // named: no class temporaries inside co_await (g++ 12)
  std::unique_ptr<io::CheckpointSource> source =
      co_await io::async_open_checkpoint(executor, options.checkpoint, source_options, asio::use_awaitable);
  Runs runs;
  runs.config = StackConfig::from_catalog(source->catalog());
  if (runs.config.layers < options.lookahead + 2)
    throw Error(errc::invalid_argument, {},
                fmt::format("{} layers: streaming needs more layers than the look-ahead of {} plus 1",
                            runs.config.layers, options.lookahead));
  runs.streamed = co_await run_streamed(*source, runs.config, options, rt);
  runs.resident = co_await run_resident(*source, runs.config, options, rt);
  co_return runs;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::uint64_t {
      if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value", arg));
      return std::stoull(argv[++i]);
    };
    if (arg == "--layers")
      o.layers = value();
    else if (arg == "--hidden")
      o.hidden = value();
    else if (arg == "--lookahead")
      o.lookahead = value();
    else if (arg == "--passes")
      o.passes = value();
    else if (arg == "--tokens")
      o.tokens = value();
    else if (arg == "--threads")
      o.threads = static_cast<int>(value());
    else if (arg.rfind("--", 0) == 0 || !o.checkpoint.empty())
      throw std::invalid_argument("unexpected " + arg);
    else
      o.checkpoint = arg;
  }
  if (o.lookahead < 1 || o.passes < 1 || o.tokens < 1 || o.threads < 1 || o.hidden < 8)
    throw std::invalid_argument("--lookahead, --passes, --tokens, --threads must be at least 1, --hidden at least 8");
  return o;
}

/// Prints the per-layer table (means over passes) and the totals; returns whether the
/// resident bytes stayed within the budget.
bool report(const Runs& runs, const Options& options) {
  const StreamedRun& s = runs.streamed;
  const std::size_t n = runs.config.layers;
  std::vector<double> load(n), comp(n), stall(n);
  double sum_load = 0, sum_compute = 0, sum_stall = 0;
  for (std::size_t u = 0; u < s.stats.units.size(); ++u) {
    const engine::UnitTiming& t = s.stats.units[u];
    load[t.index] += t.load_s;
    comp[t.index] += s.compute_s[u];
    stall[t.index] += t.stall_s;
    sum_load += t.load_s;
    sum_compute += s.compute_s[u];
    sum_stall += t.stall_s;
  }
  const double p = static_cast<double>(options.passes);
  fmt::print("per layer, mean of {} passes (I/O: read and bind, from the unit's start to ready):\n", options.passes);
  fmt::print("  layer    MiB   I/O ms  compute ms  stall ms\n");
  for (std::size_t i = 0; i < n; ++i)
    fmt::print("  {:>5} {:>6.2f} {:>8.2f} {:>11.2f} {:>9.2f}\n", i, mib(runs.config.layer_bytes()), 1e3 * load[i] / p,
               1e3 * comp[i] / p, 1e3 * stall[i] / p);
  fmt::print("streamed: {} units in {:.3f} s; Σ I/O {:.3f} s, Σ compute {:.3f} s, Σ stall {:.3f} s\n",
             s.stats.delivered, s.wall_s, sum_load, sum_compute, sum_stall);
  fmt::print(
      "  overlap: {:.0f}% of the I/O time hidden behind compute (1 − Σ stall / Σ I/O); wall is {:.2f}× "
      "Σ I/O + Σ compute, {:.2f}× max(Σ I/O, Σ compute)\n",
      100 * (1 - sum_stall / sum_load), s.wall_s / (sum_load + sum_compute),
      s.wall_s / std::max(sum_load, sum_compute));
  const std::uint64_t model = n * runs.config.layer_bytes();
  const bool within = s.stats.resident_high_water <= s.stats.budget;
  fmt::print(
      "  memory: resident high-water {:.2f} MiB of a {:.2f} MiB budget ({} layers; the model is {:.2f} MiB, "
      "{:.1f}× the budget){}; storage pool live high-water {:.2f} MiB\n",
      mib(s.stats.resident_high_water), mib(s.stats.budget), options.lookahead + 1, mib(model),
      static_cast<double>(model) / static_cast<double>(s.stats.budget), within ? "" : "  OVER BUDGET",
      mib(s.live_high_water));
  fmt::print("resident: loaded {:.2f} MiB in {:.3f} s, then computed {} passes in {:.3f} s\n",
             mib(runs.resident.live_bytes), runs.resident.load_s, options.passes, runs.resident.compute_s);
  return within;
}

int run(int argc, char** argv) {
  Options options = parse(argc, argv);
  std::unique_ptr<TempDir> temp;
  if (options.checkpoint.empty()) {
    temp = std::make_unique<TempDir>("eredu-prefetch");
    options.checkpoint = temp->path() / "mlp.safetensors";
    const std::uint64_t inter = (options.hidden * 8 / 3 + 128) / 256 * 256;  // Llama's SwiGLU width
    const StackConfig config{options.hidden, std::max<std::uint64_t>(inter, 256), options.layers, DType::BF16};
    write_stack_checkpoint(options.checkpoint, config, 11);
    fmt::print("generated {}: {} MLP blocks, hidden {}, intermediate {}, BF16, {:.1f} MiB\n",
               options.checkpoint.string(), config.layers, config.hidden, config.intermediate,
               mib(config.layers * config.layer_bytes()));
  }

  // This thread runs the event loop and never joins TBB's work: let TBB start `threads`
  // workers besides it (its default assumes the main thread helps).
  tbb::global_control workers(tbb::global_control::max_allowed_parallelism,
                              static_cast<std::size_t>(options.threads) + 1);
  cpu::Executor loads(options.threads), compute_arena(options.threads);
  cpu::StoragePool storage;
  Runtime rt{loads, compute_arena, storage};
  asio::io_context ctx(1);
  std::future<Runs> done = asio::co_spawn(ctx, run_both(ctx.get_executor(), options, rt), asio::use_future);
  ctx.run();
  const Runs runs = done.get();  // rethrows the coroutine's failure (an eredu::Error)
  fmt::print("stack: {} blocks of {:.2f} MiB, look-ahead {}, {} passes, {} tokens, {} threads\n", runs.config.layers,
             mib(runs.config.layer_bytes()), options.lookahead, options.passes, options.tokens, options.threads);

  bool ok = report(runs, options);
  float diff = 0, scale = 0;
  const std::vector<float>& a = runs.streamed.out.x;
  const std::vector<float>& b = runs.resident.out.x;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  const bool same = a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  fmt::print("output: streamed vs resident max|diff| {:.3g} (of {:.3g}): {}\n", diff, scale,
             same ? "bit-identical" : "MISMATCH");
  ok &= same;
  fmt::print("{}\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr,
               "prefetch_pipeline: {}\nusage: {} [CHECKPOINT] [--layers 12] [--hidden 768] [--lookahead 2] "
               "[--passes 3] [--tokens 4] [--threads N]\n",
               e.what(), argv[0]);
    return 2;
  } catch (const std::exception& e) {  // an eredu::Error names the file, tensor and parameter
    fmt::print(stderr, "prefetch_pipeline: {}\n", e.what());
  }
  return 1;
}
