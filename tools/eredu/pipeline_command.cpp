// `eredu pipeline`: streams a checkpoint's layers through engine::PrefetchPipeline, as an
// application too large to keep its model resident would: units i+1..i+K load while unit i
// is used, within a byte budget, pass after pass.
#include <tbb/global_control.h>

#include <algorithm>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "commands.hpp"
#include "eredu/app/matvec_probe.hpp"
#include "eredu/app/tensor_set_module.hpp"
#include "eredu/app/unit_grouping.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/printable.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/engine/serving/prefetch_pipeline.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "eredu/io/remote/remote_url.hpp"
#include "interrupt.hpp"
#include "progress.hpp"
#include "remote_flags.hpp"
#include "trace_option.hpp"
#include "verify_flags.hpp"

namespace eredu::cli {
namespace {

/// The options of `eredu pipeline`, with their defaults.
struct PipelineCommandOptions {
  std::string path;
  std::uint64_t budget = 0;  // 0: (lookahead + 1) x the largest unit
  unsigned lookahead = 2;
  unsigned passes = 1;
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::string compute = "matvec";
  std::uint64_t staging = std::uint64_t{64} << 20;
  std::string verify = "off";
  std::string checksums;  // --checksums FILE
  std::string units = "layers";
  RemoteFlags remote;
};

using Pipeline = engine::PrefetchPipeline<cpu::Backend, app::TensorSetModule>;

/// The checkpoint's units (app::group_units: layers, or layers and their experts) as pipeline
/// units, with each unit's module.
struct Grouping {
  app::UnitGrouping layers;
  std::vector<engine::PipelineUnit> units{};
  std::vector<app::TensorSetModule> modules{};  // the unbound module of each unit
  std::vector<std::uint64_t> bytes{};
};

Grouping pipeline_units(const io::Catalog& catalog, app::UnitPreset preset) {
  Grouping g{app::group_units(catalog, preset)};
  for (const app::UnitGroup& unit : g.layers.units) {
    app::TensorSetModule module = app::TensorSetModule::build(catalog, unit.requests);
    g.units.push_back({unit.name, module.plan()});
    g.bytes.push_back(module.bytes());
    g.modules.push_back(std::move(module));
  }
  return g;
}

/// What the consumer measured.
struct Consumed {
  std::vector<double> compute_s;  // per delivered unit
  double wall_s = 0;
  double checksum = 0;
};

/// The consumer: takes each unit in order, computes with it (or not), releases it. However
/// it ends (the last pass, a unit's error, a signal's cancellation at any await), it closes
/// the pipeline before it completes: loads still running or waiting for budget stop, so the
/// event loop has nothing left and run() returns.
asio::awaitable<void> consume(Pipeline& pipeline, cpu::Executor& compute, bool matvec, Progress& bar,
                              const std::vector<std::uint64_t>& unit_bytes, Consumed& out) {
  const double t0 = now_seconds();
  std::uint64_t done = 0;
  std::exception_ptr failure;
  try {
    while (auto unit = co_await pipeline.async_next(asio::use_awaitable)) {
      const double t = now_seconds();
      if (matvec) {
        double sum = 0;
        Completion finished = compute.submit([&sum, &unit] { sum = app::matvec_probe(unit.module()); });
        co_await finished.async_wait(asio::use_awaitable);
        out.checksum += sum;
      }
      out.compute_s.push_back(now_seconds() - t);
      done += unit_bytes[unit.index()];
      bar.update(done);
    }
    out.wall_s = now_seconds() - t0;
  } catch (...) {
    failure = std::current_exception();
  }
  // After a cancellation every later await would throw at once: the close must run.
  co_await asio::this_coro::reset_cancellation_state();
  co_await pipeline.async_close(asio::use_awaitable);
  if (failure) std::rethrow_exception(failure);
}

int run_pipeline(const PipelineCommandOptions& o, const CommonFlags& flags) {
  io::SourceOptions opts;
  opts.pool.budget = o.staging;
  // Kept until the command exits (see read_command.cpp): no idle-release timer holding the loop.
  opts.pool.release_after = std::chrono::milliseconds(0);
  // Units read straight into their tensors (no staging unless a tensor needs it), with many
  // requests in flight, as `eredu load`; a small pool keeps peak RSS near the budget.
  opts.reader.depth = 8;
  opts.reader.max_request = std::size_t{8} << 20;
  opts.remote = remote_options(o.remote);

  // The event loop thread only submits reads and resumes coroutines: `threads` TBB workers
  // besides it run the populates and the matvecs (without this, TBB warns that the number of
  // workers is limited and runs fewer).
  tbb::global_control workers(tbb::global_control::max_allowed_parallelism, std::size_t{o.threads} + 1);
  cpu::Executor loads(static_cast<int>(o.threads)), compute(static_cast<int>(o.threads));
  cpu::StoragePool storage;
  cpu::MaterializationContext context{loads, storage};
  Progress bar(!flags.quiet);
  bar.phase("open");
  asio::io_context ctx(1);
  Interrupt interrupt(ctx);
  interrupt.doing(fmt::format("opening {}", io::shown_location(o.path)));
  auto source = io::CheckpointSource::open(ctx.get_executor(), o.path, opts);
  interrupt.check();
  Grouping g = pipeline_units(source->catalog(), app::parse_unit_preset(o.units));
  if (g.units.empty())
    throw Error(
        errc::invalid_argument, {.file = io::shown_location(o.path)},
        fmt::format(
            "none of its {} tensors is named like '<prefix>layers.<N>.<name>' or 'blk.<N>.<name>': nothing to stream",
            source->catalog().size()));
  const std::size_t unit_count = g.units.size();
  const std::uint64_t largest = *std::max_element(g.bytes.begin(), g.bytes.end());
  std::uint64_t pass_bytes = 0;
  for (std::uint64_t b : g.bytes) pass_bytes += b;

  // Under require, a tensor without a digest fails here, before anything is read.
  const io::Checksums sums = checksums_for(o.path, source->catalog(), o.verify, o.checksums);
  const std::size_t digest_count = sums.size();
  std::vector<app::TensorSetModule> modules = std::move(g.modules);
  Pipeline pipeline(*source, std::move(g.units), [&modules](std::size_t i) { return modules[i]; }, context,
                    {.lookahead = o.lookahead,
                     .resident_budget = o.budget,
                     .passes = o.passes,
                     .verify = verify_options(o.verify, sums)});
  const std::uint64_t total_bytes = pass_bytes * o.passes;
  bar.phase("read", total_bytes, o.passes > 1 ? fmt::format("pipeline ×{}", o.passes) : std::string("pipeline"));
  Consumed consumed;
  interrupt.doing(fmt::format("streaming {} through the pipeline", io::shown_location(o.path)));
  // Whatever the consumer is awaiting when the signal comes, every load stops now.
  interrupt.on_signal([&pipeline] { pipeline.async_close(asio::detached); });
  std::exception_ptr failure;  // a unit's load error, its parameter named after the unit
  asio::co_spawn(ctx, consume(pipeline, compute, o.compute == "matvec", bar, g.bytes, consumed),
                 asio::bind_cancellation_slot(interrupt.slot(), [&](std::exception_ptr e) {
                   failure = e;
                   interrupt.disarm();
                 }));
  interrupt.arm();
  ctx.run();
  bar.finish();
  interrupt.rethrow(failure);

  const engine::PipelineStats stats = pipeline.stats();
  double compute_total = 0;
  for (double c : consumed.compute_s) compute_total += c;
  const double rate = gb_per_s(total_bytes, consumed.wall_s);
  const std::uint64_t rss = peak_rss_bytes();
  const bool within = stats.resident_high_water <= stats.budget;
  if (flags.json) {
    JsonWriter json;
    begin_document(json, "pipeline");
    json.field("path", io::shown_location(o.path)).field("reader", source->reader().name());
    json.count("unit", unit_count)
        .count("layer_tensor", g.layers.grouped_tensors)
        .count("skipped_tensor", g.layers.skipped.size());
    json.bytes("skipped", g.layers.skipped_bytes).count("pass", o.passes).field("lookahead", o.lookahead);
    json.field("threads", o.threads).field("compute", o.compute).bytes("pass", pass_bytes).bytes("", total_bytes);
    json.seconds("", consumed.wall_s).rate("", rate).seconds("io", stats.load_s).seconds("compute", compute_total);
    json.seconds("stall", stats.stall_s).bytes("budget", stats.budget).bytes("largest_unit", largest);
    json.bytes("resident_high_water", stats.resident_high_water).field("within_budget", within);
    json.bytes("staging_budget", source->pool().budget()).bytes("staging_high_water", source->pool().high_water());
    json.bytes("peak_rss", rss).field("checksum", consumed.checksum);
    json.field("verify", o.verify).count("digest", digest_count).count("tensor_verified", stats.tensors_verified);
    json.bytes("verified", stats.bytes_verified);
    json.key("units").begin_array();
    for (std::size_t i = 0; i < stats.units.size(); ++i) {
      const engine::UnitTiming& u = stats.units[i];
      json.begin_object().field("index", u.index).field("pass", u.pass).bytes("", u.bytes);
      json.seconds("load", u.load_s).seconds("compute", consumed.compute_s.at(i)).seconds("stall", u.stall_s);
      json.end_object();
    }
    json.end_array();
    print_document(json);
  } else {
    fmt::print("pipeline {} units ({} {} × {} pass{}) of {}: {} in {:.3f} s: {:.2f} GB/s\n", stats.delivered,
               unit_count, o.units == "layers" ? "layers" : "units", o.passes, o.passes == 1 ? "" : "es",
               printable(io::shown_location(o.path)), format_bytes(total_bytes), consumed.wall_s, rate);
    fmt::print("  units    {} tensors in layers, largest unit {}; {} tensors outside layers skipped ({})\n",
               g.layers.grouped_tensors, format_bytes(largest), g.layers.skipped.size(),
               format_bytes(g.layers.skipped_bytes));
    fmt::print(
        "  time     I/O {:.3f} s (Σ per-unit load, overlapping), compute {:.3f} s ({}), stall {:.3f} s "
        "(first unit {:.3f} s)\n",
        stats.load_s, compute_total, o.compute, stats.stall_s, stats.units.empty() ? 0.0 : stats.units.front().stall_s);
    fmt::print(
        "  memory   look-ahead {}, resident high-water {} of a {} budget{}; staging high-water {} of {}; "
        "peak RSS {}\n",
        o.lookahead, format_bytes(stats.resident_high_water), format_bytes(stats.budget),
        within ? "" : " (OVER BUDGET)", format_bytes(source->pool().high_water()),
        format_bytes(source->pool().budget()), format_bytes(rss));
    fmt::print("  threads  {} (TBB arenas for loads and compute), reader {}\n", o.threads, source->reader().describe());
    // Every read tensor of a layer is checked each pass; those without a digest are the rest.
    const std::uint64_t reads = static_cast<std::uint64_t>(g.layers.grouped_tensors) * o.passes;
    fmt::print("  verify   {}\n",
               verify_summary(o.verify, stats.tensors_verified, stats.bytes_verified,
                              o.verify == "off" ? 0 : reads - std::min(reads, stats.tensors_verified), digest_count));
  }
  return within ? 0 : 1;
}

}  // namespace

Command add_pipeline_command(CLI::App& app, CommonFlags& flags) {
  auto o = std::make_shared<PipelineCommandOptions>();
  CLI::App* cmd = add_command(
      app, "pipeline", "stream the checkpoint's layers through a prefetch pipeline",
      "Streams the checkpoint's layers (tensors named <prefix>layers.<N>.<rest>, or blk.<N>.<rest> as in "
      "GGUF, one unit per layer, each tensor in its stored dtype; other tensors are skipped; with --units experts, "
      "each expert of a mixture-of-experts layer is a unit of its own) through "
      "engine::PrefetchPipeline: while unit i is used, units i+1..i+K are read "
      "into CPU tensors, within --budget bytes of resident units. Prints GB/s, I/O, compute and stall time, "
      "the resident high-water against the budget (exit status 1 when over it) and peak RSS.");
  add_path(*cmd, "PATH", o->path,
           "a .safetensors file, a sharded directory or its model.safetensors.index.json, or a GGUF checkpoint; or the "
           "URL of one (https://, http://, s3://)");
  add_bytes(*cmd, "--budget", o->budget, app::option_range::budget, "bytes of resident units", {},
            "(lookahead + 1) x the largest unit");
  add_integer(*cmd, "--lookahead", o->lookahead, app::option_range::lookahead,
              "units loaded ahead of the one in use (K)");
  add_integer(*cmd, "--passes", o->passes, app::option_range::passes, "passes over the layers");
  add_choice(*cmd, "--units", o->units, app::choice_names<std::vector<std::string>>(app::unit_preset_choices),
             "what a unit is: layers (one per <prefix>layers.<N> or blk.<N>) or experts (a layer's dense tensors, "
             "then each of its experts, *.experts.<E>.*, or a GGUF layer's *_exps stacks, as a unit of its own)");
  add_integer(*cmd, "--threads", o->threads, app::option_range::threads, "TBB threads of each arena (loads, compute)",
              "the number of CPUs");
  add_choice(*cmd, "--compute", o->compute, {"none", "matvec"},
             "matvec multiplies every 2-D BF16/F16/F32 weight by a vector while the next units load; none "
             "releases each unit at once (pure streaming)");
  add_bytes(*cmd, "--staging", o->staging, app::option_range::staging, "staging memory of the lease pool");
  add_verify_flags(*cmd, o->verify, o->checksums, "of every unit as it is read (each pass)");
  add_remote_flags(*cmd, o->remote);
  auto trace_path = std::make_shared<std::string>();
  add_trace_option(*cmd, *trace_path);
  add_common_flags(*cmd, flags, true);
  return {cmd, [o, trace_path](const CommonFlags& f) {
            return run_traced(*trace_path, [&] { return run_pipeline(*o, f); });
          }};
}

}  // namespace eredu::cli
