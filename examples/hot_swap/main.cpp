// hot_swap: many concurrent requests on one Asio loop, each a forward pass of the serving
// version of a model, while engine::ModelSlot swaps that version between two checkpoints
// in the background, then tries a swap to a corrupt copy, which must change nothing.
//
//   hot_swap [--swaps N] [--requests N] [--concurrency N] [--serve-threads N] [--swap-threads N]
//
// It generates two small Llama-shaped BF16 checkpoints (A, B: different seeds) with SHA-256
// sidecars and a copy of B with bytes flipped in one tensor, in a temporary directory. It
// prints request latency per phase, each publish pause, and proves that every response came
// from exactly one version: each response carries its version's tag (a SHA-256 of the
// weights, computed by the swap's canary) and its output, and both are compared with values
// computed from the checkpoint files alone, before serving starts. See README.md.

#include <tbb/global_control.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "../common/temp_dir.hpp"
#include "../load_unit/model.hpp"
#include "eredu/core/error.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/cpu/float_formats.hpp"
#include "eredu/engine/serving/model_slot.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "eredu/io/integrity/checksums.hpp"
#include "eredu/io/integrity/sha256.hpp"
#include "eredu/synth/synthetic_checkpoint.hpp"
#include "forward.hpp"

using namespace eredu;
using namespace eredu::example;

namespace {

using Slot = engine::ModelSlot<cpu::Backend, Model>;
using Clock = std::chrono::steady_clock;

/// Writes the SHA-256 sidecar of the checkpoint file `path` (what a publisher ships with it).
void write_sidecar(const std::filesystem::path& path, const io::Catalog& catalog) {
  io::Checksums sums;
  for (const io::TensorInfo& t : catalog.tensors()) sums.add(t.name, io::sha256_hex(read_bytes(catalog, t.name)));
  std::ofstream(io::Checksums::sidecar_path(path)) << sums.to_json();
}

/// A, B and the corrupt copy of B, with their sidecars, in `dir`.
struct Files {
  std::filesystem::path a, b, corrupt;
};

Files generate(const std::filesystem::path& dir) {
  Files f{dir / "a.safetensors", dir / "b.safetensors", dir / "b-corrupt.safetensors"};
  for (auto [path, seed] : {std::pair{f.a, 7}, std::pair{f.b, 8}}) {
    const synth::SyntheticOptions options{.target_bytes = 3 << 20,
                                          .dtype = DType::BF16,
                                          .shards = 1,
                                          .seed = static_cast<std::uint64_t>(seed),
                                          .layers = 2,
                                          .tie_embeddings = true};
    synth::write_synthetic(path, options);
    write_sidecar(path, io::open_catalog(path));
  }
  // The corrupt copy keeps B's sidecar (the digests of B's true bytes) and has four bytes of
  // one weight overwritten: it opens and loads cleanly, and only the checksums can tell.
  std::filesystem::copy_file(f.b, f.corrupt);
  std::filesystem::copy_file(io::Checksums::sidecar_path(f.b), io::Checksums::sidecar_path(f.corrupt));
  const io::Catalog catalog = io::open_catalog(f.corrupt);
  const io::TensorInfo& t = catalog.at("model.layers.1.mlp.down_proj.weight");
  std::fstream file(f.corrupt, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(static_cast<std::streamoff>(t.offset + t.nbytes / 2));
  file.write("\x5a\x5a\x5a\x5a", 4);
  if (!file) throw Error(errc::io_error, {.file = f.corrupt.string()}, "cannot write the corrupt copy");
  return f;
}

/// What one response carried, and when it arrived and left.
struct Response {
  std::uint32_t epoch_start = 0;  // even: between swaps; odd: while a swap ran
  std::uint32_t epoch_end = 0;
  std::uint32_t token = 0;
  std::uint64_t generation = 0;
  std::string tag;           // the version's weight tag
  std::uint64_t output = 0;  // hash of the output vector
  double latency_us = 0;
};

/// What the request coroutines share; only the event-loop thread touches it.
struct Server {
  Slot* slot = nullptr;
  cpu::Executor* compute = nullptr;                    // null: the forward runs on the loop thread
  std::unordered_map<const Model*, std::string> tags;  // written by the canary before publication
  std::vector<Response> responses;
  std::uint32_t epoch = 0;
  std::uint64_t served_in_epoch = 0;
  std::uint32_t tokens = 0;  // requests use tokens [0, tokens)
  bool stop = false;
  int running = 0;
};

/// One client: send a request, await the answer, repeat. Latency counts from arrival on
/// the loop (the post) to the answer.
asio::awaitable<void> client(Server& s, std::uint32_t id) {
  auto executor = co_await asio::this_coro::executor;
  for (std::uint32_t n = id; !s.stop; n += 7) {
    Response r;
    r.token = n % s.tokens;
    r.epoch_start = s.epoch;
    const Clock::time_point arrival = Clock::now();
    co_await asio::post(executor, asio::use_awaitable);
    // The version, taken once: wait-free, and it stays alive until `v` goes.
    std::shared_ptr<const Slot::Version> v = s.slot->current();
    r.generation = v->generation;
    r.tag = s.tags.at(&v->model);
    const Weights weights = Weights::of(v->model);
    std::vector<float> y;
    if (s.compute) {
      Completion done = s.compute->submit([&] { y = forward(weights, r.token); });
      co_await done.async_wait(asio::use_awaitable);
    } else {
      y = forward(weights, r.token);
    }
    v.reset();
    r.output = hash_floats(y);
    r.latency_us = std::chrono::duration<double, std::micro>(Clock::now() - arrival).count();
    r.epoch_end = s.epoch;
    s.responses.push_back(std::move(r));
    ++s.served_in_epoch;
  }
  --s.running;
}

/// The canary: hashes the new version's weights on the swap's arena (the loop keeps serving
/// meanwhile) into its tag, and rejects it if a probe forward pass is not finite.
asio::awaitable<void> canary(const Model& model, cpu::Executor& background, Server& s) {
  std::string tag;
  bool finite = false;
  Completion done = background.submit([&] {
    tag = weight_tag(Weights::of(model));
    const std::vector<float> y = forward(Weights::of(model), 0);
    finite = std::all_of(y.begin(), y.end(), [](float f) { return std::isfinite(f); });
  });
  co_await done.async_wait(asio::use_awaitable);
  if (!finite) throw std::runtime_error("the probe forward pass is not finite");
  s.tags[&model] = tag;
}

/// Waits until `n` requests have been answered in the current epoch.
asio::awaitable<void> serve(Server& s, std::uint64_t n) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (s.served_in_epoch < n) {
    timer.expires_after(std::chrono::milliseconds(1));
    co_await timer.async_wait(asio::use_awaitable);
  }
}

/// One attempted swap.
struct SwapResult {
  std::string target{};
  std::optional<engine::SwapReport> report{};  // empty: rejected
  std::string error{};
};

/// The user's code, in one place: swap the slot to `source`, checking `sums` and the canary.
asio::awaitable<SwapResult> swap_to(Server& s, io::CheckpointSource& source, std::string origin,
                                    const engine::WeightBindingPlan& plan, cpu::MaterializationContext& context,
                                    cpu::Executor& background) {
  SwapResult result{origin};
  engine::SwapOptions<Model> options{
      .origin = origin,
      .checksums = io::Checksums::discover(origin, source.catalog()),  // the sidecar's digests
      .canary = [&background, &s](const Model& m) { return canary(m, background, s); }};
  try {
    result.report = co_await s.slot->async_swap(source, plan, context, std::move(options), asio::use_awaitable);
  } catch (const Error& e) {  // typed: checksum_mismatch, canary_failed, unexpected_eof, ...
    result.error = e.what();
  }
  co_return result;
}

/// Sources in the order the run swaps to them.
struct Run {
  std::vector<io::CheckpointSource*> sources;  // A, B, corrupt
  std::vector<std::string> origins;
  const engine::WeightBindingPlan* plan = nullptr;
  cpu::MaterializationContext* context = nullptr;
  cpu::Executor* background = nullptr;
  int swaps = 0, concurrency = 0;
  std::uint64_t requests = 0;
};

/// Publishes A, starts the clients, alternates steady phases with swaps B, A, B..., then the
/// corrupt swap, then stops the clients.
asio::awaitable<std::vector<SwapResult>> drive(Server& s, const Run& run) {
  std::vector<SwapResult> results;
  SwapResult first = co_await swap_to(s, *run.sources[0], run.origins[0], *run.plan, *run.context, *run.background);
  if (!first.report) throw std::runtime_error("A did not load: " + first.error);
  auto executor = co_await asio::this_coro::executor;
  for (int c = 0; c < run.concurrency; ++c, ++s.running)
    asio::co_spawn(executor, client(s, static_cast<std::uint32_t>(c)), [](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);  // a failed request is a bug: end the run
    });
  co_await serve(s, run.requests);
  for (int k = 1; k <= run.swaps + 1; ++k) {
    const std::size_t target = k > run.swaps ? 2 : (k % 2 == 1 ? 1 : 0);  // the last one: corrupt
    ++s.epoch;
    s.served_in_epoch = 0;
    results.push_back(
        co_await swap_to(s, *run.sources[target], run.origins[target], *run.plan, *run.context, *run.background));
    ++s.epoch;
    s.served_in_epoch = 0;
    co_await serve(s, run.requests);
  }
  s.stop = true;
  asio::steady_timer timer(executor);
  while (s.running > 0) {
    timer.expires_after(std::chrono::milliseconds(1));
    co_await timer.async_wait(asio::use_awaitable);
  }
  co_return results;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1)];
}

/// Reads "--name value" options; returns false on a malformed command line.
bool parse(int argc, char** argv, std::map<std::string, long>& options) {
  for (int i = 1; i < argc; i += 2) {
    const std::string name = argv[i];
    if (name.rfind("--", 0) != 0 || !options.count(name.substr(2)) || i + 1 >= argc) return false;
    options[name.substr(2)] = std::stol(argv[i + 1]);
  }
  return options["swaps"] >= 0 && options["requests"] > 0 && options["concurrency"] > 0 &&
         options["serve-threads"] >= 0 && options["swap-threads"] > 0;
}

int run(int argc, char** argv) {
  std::map<std::string, long> opt{
      {"swaps", 2}, {"requests", 300}, {"concurrency", 8}, {"serve-threads", 0}, {"swap-threads", 1}};
  if (!parse(argc, argv, opt)) {
    fmt::print(stderr,
               "usage: {} [--swaps 2] [--requests 300] [--concurrency 8] [--serve-threads 0] [--swap-threads 1]\n",
               argv[0]);
    return 2;
  }
  TempDir dir("eredu-hot-swap");
  const Files files = generate(dir.path());

  // Serving and swapping get their own arenas; the loop thread joins neither, so TBB needs
  // a worker for every slot of both.
  const auto serve_threads = static_cast<int>(opt["serve-threads"]),
             swap_threads = static_cast<int>(opt["swap-threads"]);
  tbb::global_control workers(tbb::global_control::max_allowed_parallelism,
                              static_cast<std::size_t>(serve_threads + swap_threads) + 1);
  std::optional<cpu::Executor> serving;
  if (serve_threads > 0) serving.emplace(serve_threads);
  cpu::Executor background(swap_threads);  // the swap's throttle: a small arena of its own
  cpu::StoragePool storage;                // retired versions' storage is reused by the next swap
  cpu::MaterializationContext context{background, storage};

  asio::io_context ctx(1);
  io::SourceOptions source_options;
  source_options.pool.budget = 16 << 20;  // bounded staging for the background load
  std::vector<std::unique_ptr<io::CheckpointSource>> sources;
  for (const auto& p : {files.a, files.b, files.corrupt})
    sources.push_back(io::CheckpointSource::open(ctx.get_executor(), p, source_options));
  const ModelConfig config = ModelConfig::from_catalog(sources[0]->catalog());
  const engine::WeightBindingPlan plan = model_plan(sources[0]->catalog(), config);

  // What each version must answer, from the files alone (plain reads, scalar casts, the
  // fused layouts rebuilt by hand): tag and output hash per token.
  Server s;
  s.tokens = 64;
  struct Expected {
    std::string tag;
    std::vector<std::uint64_t> outputs;
  };
  std::vector<Expected> expected;
  for (std::size_t i = 0; i < 2; ++i) {
    const ReferenceWeights ref(sources[i]->catalog(), config);
    Expected e{weight_tag(ref.view()), {}};
    for (std::uint32_t t = 0; t < s.tokens; ++t) e.outputs.push_back(hash_floats(forward(ref.view(), t)));
    expected.push_back(std::move(e));
  }
  fmt::print("A {} and B {}: {} layers, hidden {}, {} parameters; tags {}… and {}…\n", files.a.filename().string(),
             files.b.filename().string(), config.layers, config.hidden, plan.bindings().size(),
             expected[0].tag.substr(0, 12), expected[1].tag.substr(0, 12));

  Slot slot([config] { return Model(config); });
  s.slot = &slot;
  s.compute = serving ? &*serving : nullptr;
  Run r{{sources[0].get(), sources[1].get(), sources[2].get()},
        {files.a.string(), files.b.string(), files.corrupt.string()},
        &plan,
        &context,
        &background,
        static_cast<int>(opt["swaps"]),
        static_cast<int>(opt["concurrency"]),
        static_cast<std::uint64_t>(opt["requests"])};
  std::vector<SwapResult> results;
  std::exception_ptr failure;
  asio::co_spawn(ctx, drive(s, r), [&](std::exception_ptr e, std::vector<SwapResult> out) {
    failure = e;
    results = std::move(out);
  });
  ctx.run();
  if (failure) std::rethrow_exception(failure);

  // Phases: 0 before, 2k-1 during swap k, 2k after it; the last swap is the corrupt one.
  const std::size_t swaps = results.size();
  const std::uint32_t failed_epoch = static_cast<std::uint32_t>(2 * swaps - 1);
  const std::uint64_t last_good = 1 + swaps - 1;  // generation serving when the corrupt swap starts
  std::vector<std::vector<double>> latency(2 * swaps + 1);
  std::vector<std::set<std::uint64_t>> generations(latency.size());
  std::vector<std::uint64_t> mismatches(latency.size());
  std::vector<double> steady, during;
  std::uint64_t wrong = 0, changed = 0, after_failure = 0;
  for (const Response& resp : s.responses) {
    const Expected& want = expected[resp.generation % 2 == 1 ? 0 : 1];  // odd generations are A
    const bool ok = resp.tag == want.tag && resp.output == want.outputs[resp.token];
    std::size_t phase = resp.epoch_start;
    if (resp.epoch_end != phase && phase % 2 == 0) ++phase;  // it overlapped the next swap
    phase = std::min(phase, latency.size() - 1);
    latency[phase].push_back(resp.latency_us);
    generations[phase].insert(resp.generation);
    if (!ok) ++mismatches[phase], ++wrong;
    if (resp.epoch_end >= failed_epoch) {
      ++after_failure;
      if (!ok || resp.generation != last_good) ++changed;
    }
    if (phase % 2 == 0)
      steady.push_back(resp.latency_us);
    else if (phase != failed_epoch)
      during.push_back(resp.latency_us);
  }

  fmt::print("{} clients, forward pass {}; swaps on a {}-thread arena, 16 MiB staging\n", opt["concurrency"],
             serve_threads ? fmt::format("on a {}-thread arena", serve_threads) : std::string("on the loop thread"),
             swap_threads);
  fmt::print("  {:<13} {:>8} {:>9} {:>9} {:>9}  {:<11} {}\n", "phase", "requests", "p50 µs", "p99 µs", "max µs",
             "generations", "mismatches");
  for (std::size_t i = 0; i < latency.size(); ++i) {
    const std::size_t k = (i + 1) / 2;
    const std::string name = i == 0       ? "before"
                             : k == swaps ? (i % 2 ? "corrupt swap" : "after it")
                                          : fmt::format("{} {}", i % 2 ? "swap" : "after", k);
    std::string gens;
    for (std::uint64_t g : generations[i]) gens += fmt::format("{}{}", gens.empty() ? "" : ",", g);
    const auto& l = latency[i];
    fmt::print("  {:<13} {:>8} {:>9.1f} {:>9.1f} {:>9.1f}  {:<11} {}\n", name, l.size(), percentile(l, 0.5),
               percentile(l, 0.99), l.empty() ? 0.0 : *std::max_element(l.begin(), l.end()), gens, mismatches[i]);
  }
  bool ok = wrong == 0 && changed == 0;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const SwapResult& res = results[i];
    if (res.report) {
      fmt::print(
          "swap {} to {}: generation {}, load {:.1f} ms, verify {:.1f} ms, canary {:.1f} ms, publish pause {} ns\n",
          i + 1, std::filesystem::path(res.target).filename().string(), res.report->generation,
          1e3 * res.report->load_s, 1e3 * res.report->verify_s, 1e3 * res.report->canary_s,
          res.report->publish_pause.count());
    } else {
      fmt::print("swap {} to {} rejected: {}\n", i + 1, std::filesystem::path(res.target).filename().string(),
                 res.error);
    }
    ok &= (i + 1 == results.size()) != res.report.has_value();  // every swap but the corrupt one succeeds
  }
  const double p99_steady = percentile(steady, 0.99), p99_during = percentile(during, 0.99);
  fmt::print("request p99: steady {:.1f} µs, during swaps {:.1f} µs ({:.2f}×)\n", p99_steady, p99_during,
             p99_steady > 0 ? p99_during / p99_steady : 0.0);
  fmt::print(
      "{} responses, {} not from exactly one version; {} answered during or after the failed swap, {} changed; "
      "generation {} serving\n",
      s.responses.size(), wrong, after_failure, changed, slot.generation());
  const cpu::StoragePoolStats pool = storage.stats();
  fmt::print(
      "tensor storage: {:.1f} MiB live (one version), {:.1f} MiB retained for the next swap, {} recycled blocks\n",
      static_cast<double>(pool.live_bytes) / (1 << 20), static_cast<double>(pool.retained_bytes) / (1 << 20),
      pool.recycled_allocations);
  ok &= slot.generation() == last_good;
  fmt::print("{}\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // an eredu::Error names the file, tensor and parameter
    fmt::print(stderr, "hot_swap: {}\n", e.what());
  }
  return 1;
}
