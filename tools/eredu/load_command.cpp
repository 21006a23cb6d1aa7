// `eredu load PATH`: every tensor of a checkpoint into CPU tensors through the engine.
#include <tbb/global_control.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "commands.hpp"
#include "eredu/app/tensor_set_module.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/cpu/convert.hpp"
#include "eredu/engine/orchestration/load.hpp"
#include "eredu/io/mapping/mapped_tensor.hpp"
#include "eredu/io/remote/remote_url.hpp"
#include "interrupt.hpp"
#include "load_options.hpp"
#include "progress.hpp"
#include "shard_options.hpp"
#include "trace_option.hpp"
#include "verify_flags.hpp"
#include "weights_flag.hpp"

namespace eredu::cli {
namespace {

/// One timed load.
struct LoadRun {
  double seconds = 0;
  bool recycled = false;
  std::uint64_t tensors_verified = 0;
  std::uint64_t bytes_verified = 0;
  std::uint64_t tensors_unverified = 0;
};

/// Redraws the progress display from the engine's counters every 100 ms until `done`. The
/// counters count the bytes the tensors occupy after any cast; the display counts the
/// checkpoint's bytes, as the summary does, by scaling with `source_per_output`.
void watch_progress(asio::steady_timer& timer, const engine::MaterializeProgress& counters, Progress& bar,
                    double source_per_output, const bool& done) {
  timer.expires_after(std::chrono::milliseconds(100));
  timer.async_wait([&timer, &counters, &bar, source_per_output, &done](std::error_code ec) {
    if (ec || done) return;
    const auto output_done = static_cast<double>(counters.bytes_done.load(std::memory_order_relaxed));
    bar.update(static_cast<std::uint64_t>(output_done * source_per_output));
    watch_progress(timer, counters, bar, source_per_output, done);
  });
}

std::optional<DType> cast_of(const std::string& text) {
  return app::parse_cast(text).value_or(std::nullopt);  // the option's check refused any other
}

}  // namespace

io::SourceOptions source_options(const LoadOptions& o) {
  io::SourceOptions opts;
  opts.pool.budget = o.budget;
  // Kept until the command exits (see read_command.cpp): no idle-release timer holding the loop.
  opts.pool.release_after = std::chrono::milliseconds(0);
  opts.reader.depth = o.depth;
  opts.reader.max_request = o.request;
  opts.reader.kind = app::parse_choice(app::reader_choices, o.reader).value_or(io::ReaderKind::automatic);
  opts.reader.uring_policy = o.uring_files == "all" ? io::UringPolicy::every_file : io::UringPolicy::by_file_system;
  opts.chunk_bytes = o.chunk;
  opts.remote = remote_options(o.remote);
  return opts;
}

void select_kernels(const LoadOptions& o) {
  if (o.kernels == "generic") cpu::use_convert_isa(cpu::ConvertIsa::generic);
  if (o.kernels == "avx2") cpu::use_convert_isa(cpu::ConvertIsa::avx2);
}

namespace {

int run_load(const LoadOptions& o, const CommonFlags& flags) {
  const std::optional<DType> cast_to = cast_of(o.dtype);
  io::SourceOptions opts = source_options(o);
  select_kernels(o);

  // The event loop thread only submits reads and resumes coroutines; populating memory and
  // converting run on TBB workers, so there must be `threads` of them besides this thread
  // (without this, TBB warns that the number of workers is limited and runs fewer).
  tbb::global_control workers(tbb::global_control::max_allowed_parallelism, std::size_t{o.threads} + 1);
  cpu::Executor executor(static_cast<int>(o.threads));
  cpu::StoragePool storage(
      cpu::StoragePoolOptions{.pages = o.pages == "huge" ? cpu::StoragePages::huge : cpu::StoragePages::small});
  // A load has the machine to itself: copying resident tensors on the arena beats the
  // kernel's copies (docs/performance.md).
  cpu::MaterializationContext context{executor, storage, o.copies == "arena", weight_storage(o.weights),
                                      o.cold_reads == "window"};

  Progress bar(!flags.quiet);
  bar.phase("open");
  asio::io_context ctx(1);
  Interrupt interrupt(ctx);
  interrupt.doing(fmt::format("opening {}", io::shown_location(o.path)));
  auto source = io::CheckpointSource::open(ctx.get_executor(), o.path, opts);
  interrupt.check();
  const auto& catalog = source->catalog();
  const app::TensorSetModule blueprint = app::TensorSetModule::mirror(catalog, cast_to);
  const std::uint64_t source_bytes = catalog.total_bytes();
  const double source_per_output =
      blueprint.bytes() ? static_cast<double>(source_bytes) / static_cast<double>(blueprint.bytes()) : 1.0;
  bool converts = false;  // slots are in catalog order
  for (std::size_t i = 0; i < blueprint.size(); ++i) converts |= blueprint.slot(i).dtype != catalog.tensors()[i].dtype;
  // Under require, a tensor without a digest fails here, before anything is read.
  const io::Checksums sums = checksums_for(o.path, catalog, o.verify, o.checksums);
  const std::size_t digest_count = sums.size();
  const engine::VerifyOptions verify = verify_options(o.verify, sums);

  std::vector<LoadRun> runs;
  std::optional<app::TensorSetModule> model;
  for (unsigned r = 0; r < o.repeat; ++r) {
    // Drop the previous model first: its storage returns to the pool and is reused.
    model.reset();
    const bool recycled = storage.stats().retained_bytes > 0;
    model.emplace(blueprint.unbound());
    engine::MaterializeProgress counters;
    bar.phase(converts ? "convert" : "read", source_bytes,
              o.repeat > 1 ? fmt::format("load {}/{}", r + 1, o.repeat) : std::string("load"));
    bool done = false;
    asio::steady_timer timer(ctx);
    watch_progress(timer, counters, bar, source_per_output, done);
    const double t0 = now_seconds();
    std::exception_ptr failure;
    double seconds = 0;
    // The one asynchronous engine call of this command.
    interrupt.doing(fmt::format("loading {} (load {} of {}); the module was left unbound", io::shown_location(o.path),
                                r + 1, o.repeat));
    engine::async_load<cpu::Backend>(*model, *source, blueprint.plan(), context,
                                     {.progress = &counters, .verify = verify},
                                     asio::bind_cancellation_slot(interrupt.slot(), [&](std::exception_ptr e) {
                                       seconds = now_seconds() - t0;
                                       failure = e;
                                       done = true;
                                       timer.cancel();
                                       interrupt.disarm();
                                     }));
    interrupt.arm();
    ctx.restart();
    ctx.run();  // returns once the load has completed and the progress timer is cancelled
    interrupt.rethrow(failure);
    runs.push_back({seconds, recycled, counters.tensors_verified.load(), counters.bytes_verified.load(),
                    counters.tensors_unverified.load()});
  }
  bar.finish();

  const MappedCount mapped = count_mapped(*model);
  const std::uint64_t rss = peak_rss_bytes();
  if (flags.json) {
    JsonWriter json;
    begin_document(json, "load");
    json.field("path", io::shown_location(o.path)).field("reader", source->reader().name());
    json.count("tensor", catalog.size()).count("file", catalog.files().size());
    json.bytes("tensor", source_bytes).bytes("", source_bytes).bytes("output", blueprint.bytes());
    json.field("dtype", o.dtype).field("threads", o.threads).field("kernels", cpu::convert_isa_name());
    json.field("copies", o.copies).field("cold_reads", o.cold_reads).field("pages", o.pages);
    json.bytes("budget", source->pool().budget()).bytes("alignment_read", source->alignment_bytes());
    json.field("verify", o.verify).count("checksum", digest_count);
    json.field("weights", o.weights).count("tensor_mapped", mapped.tensors).bytes("mapped", mapped.bytes);
    json.bytes("locked", mapped.locked_bytes);
    if (o.weights == "map-lock") {
      const io::MemoryLockLimit lock_limit = io::memory_lock_limit();
      if (lock_limit.limit == UINT64_MAX)
        json.field("memlock_limit", "unlimited");
      else
        json.bytes("memlock_limit", lock_limit.limit);
      json.field("memlock_exempt", lock_limit.exempt);
    }
    json.key("loads").begin_array();
    for (const LoadRun& run : runs) {
      json.begin_object().seconds("", run.seconds).rate("", gb_per_s(source_bytes, run.seconds));
      json.field("recycled", run.recycled).count("tensor_verified", run.tensors_verified);
      json.bytes("verified", run.bytes_verified).count("tensor_unverified", run.tensors_unverified).end_object();
    }
    json.end_array();
    json.bytes("staging_high_water", source->pool().high_water()).bytes("peak_rss", rss);
    json.bytes("storage_retained", storage.stats().retained_bytes);
    print_document(json);
  } else {
    for (std::size_t i = 0; i < runs.size(); ++i)
      fmt::print("load{} {} ({} tensors, {} file{}) into {} of CPU tensors ({}) in {:.3f} s: {:.2f} GB/s{}\n",
                 runs.size() > 1 ? fmt::format(" {}", i + 1) : std::string(), format_bytes(source_bytes),
                 catalog.size(), catalog.files().size(), catalog.files().size() == 1 ? "" : "s",
                 format_bytes(blueprint.bytes()), o.dtype, runs[i].seconds, gb_per_s(source_bytes, runs[i].seconds),
                 runs[i].recycled ? " (recycled storage)" : " (fresh storage)");
    fmt::print("  threads  {} (TBB arena), conversion kernels {}, reader {}\n", o.threads, cpu::convert_isa_name(),
               source->reader().describe());
    fmt::print("  staging  high-water {} of a {} budget\n", format_bytes(source->pool().high_water()),
               format_bytes(source->pool().budget()));
    fmt::print("  memory   peak RSS {}\n", format_bytes(rss));
    if (o.weights != "copy") fmt::print("  weights  {}\n", weights_summary(o.weights, mapped, catalog.size()));
    const LoadRun& last = runs.back();
    fmt::print("  verify   {}\n", verify_summary(o.verify, last.tensors_verified, last.bytes_verified,
                                                 last.tensors_unverified, digest_count));
  }
  return 0;
}

}  // namespace

Command add_load_command(CLI::App& app, CommonFlags& flags) {
  auto o = std::make_shared<LoadOptions>();
  CLI::App* cmd = add_command(
      app, "load", "load every tensor into CPU tensors through the engine",
      "Loads every tensor into CPU tensors through the engine (one slot per tensor, --dtype casting the float "
      "ones and dequantizing GGUF's quantized ones) and prints bytes, seconds, GB/s, staging high-water and peak RSS. "
      "Bytes and rates count the "
      "checkpoint's bytes as stored, whatever --dtype converts to. --repeat N loads N times, each reusing the "
      "previous load's storage.");
  add_path(*cmd, "PATH", o->path,
           "a .safetensors file, a sharded directory or its model.safetensors.index.json, a .gguf file, a split "
           "GGUF's file (*-00001-of-0000N.gguf), or a directory holding one GGUF checkpoint; or the URL of one "
           "(https://, http://, s3://: a file, an index, or an s3:// prefix)");
  add_choice(*cmd, "--dtype", o->dtype, app::choice_names<std::vector<std::string>>(app::cast_choices),
             "cast every float tensor to this dtype, and dequantize every quantized GGUF tensor to it (ggml's f32 "
             "values, rounded once to bf16 or f16); keep delivers each tensor's bytes as stored, quantized blocks "
             "too. Any letter case; the names Python's dtype= takes (docs/python.md)",
             /*any_case=*/true);
  add_integer(*cmd, "--threads", o->threads, app::option_range::threads, "TBB threads that populate and convert",
              "the number of CPUs; --tensor-parallel: divided among the ranks on this host");
  add_bytes(*cmd, "--budget", o->budget, app::option_range::budget, "staging memory of the lease pool");
  add_integer(*cmd, "--repeat", o->repeat, 1u, 1000u, "load this many times, each reusing the previous load's storage");
  add_choice(*cmd, "--reader", o->reader, app::choice_names<std::vector<std::string>>(app::reader_choices),
             "reader: io_uring, pread, or auto (io_uring where the kernel allows it)");
  add_choice(*cmd, "--uring-files", o->uring_files, {"local", "all"},
             "files io_uring may read: local (ext4, xfs, btrfs, tmpfs, overlayfs...; FUSE, NFS, SMB, 9p, ceph and "
             "unknown file systems are read with pread, where io_uring can hide a failed read) or all");
  add_integer(*cmd, "--depth", o->depth, app::option_range::depth, "read requests in flight");
  add_bytes(*cmd, "--request", o->request, app::option_range::request, "largest single read request");
  add_choice(*cmd, "--kernels", o->kernels, {"best", "avx2", "generic"},
             "conversion kernels: best (AVX2/F16C where the CPU has them, AVX512-BF16 for dequantizing to bf16), "
             "avx2 (no AVX-512) or generic (portable C++)");
  add_bytes(*cmd, "--chunk", o->chunk, app::option_range::chunk,
            "lease size converted tensors are read and converted in");
  add_choice(*cmd, "--copies", o->copies, {"arena", "reader"},
             "who copies page-cache-resident tensors: the TBB arena, from a mapping, or the reader");
  add_choice(
      *cmd, "--cold-reads", o->cold_reads, {"window", "buffered"},
      "how a tensor not in the page cache, at an offset that is not page-aligned, is read: window (its page-aligned "
      "window of the file, O_DIRECT, into storage laid out like the file) or buffered (through the page cache)");
  add_choice(*cmd, "--pages", o->pages, {"4k", "huge"},
             "pages of tensor storage: 4k (MADV_NOHUGEPAGE: the faster first touch on the machines measured) or huge "
             "(MADV_HUGEPAGE: faster recycled loads, a first touch that may wait for compaction)");
  add_weights_flag(*cmd, o->weights);
  add_verify_flags(*cmd, o->verify, o->checksums, "of every tensor as it lands (each load)");
  add_remote_flags(*cmd, o->remote);
  auto trace_path = std::make_shared<std::string>();
  add_trace_option(*cmd, *trace_path);
  CLI::Option* trace = cmd->get_option("--trace");
  TensorParallelOptions& tp = o->tensor_parallel;
  cmd->add_flag("--tensor-parallel", tp.enabled,
                "load one shard per MPI rank (mpirun -np N eredu load PATH --tensor-parallel): each rank reads only "
                "its bytes, by the --family sharding rules and --shard; rank 0 prints every rank's figures and the "
                "totals (builds with MPI only)");
  std::vector<CLI::Option*> tp_options = add_tensor_parallel_rule_options(*cmd, tp);
  tp_options.push_back(add_choice(
      *cmd, "--replicated", tp.replicated, {"read", "gather"},
      "--tensor-parallel: how replicated tensors are read: read (every rank reads them whole) or gather (on shared "
      "storage: each rank reads 1/N of dim 0 and the ranks all-gather, so they are read once in total; a tensor "
      "whose dim 0 the ranks do not divide is read whole)"));
  CLI::Option* threads = cmd->get_option("--threads");
  add_common_flags(*cmd, flags, true);
  return {cmd, [o, trace_path, tp_options, threads, trace](const CommonFlags& f) {
            o->threads_given = threads->count() > 0;
            if (!o->tensor_parallel.enabled) {
              for (const CLI::Option* option : tp_options)
                if (option->count() > 0)
                  throw UsageError(fmt::format("{}: only with --tensor-parallel", option->get_name()));
              return run_traced(*trace_path, [&] { return run_load(*o, f); });
            }
#ifndef EREDU_CLI_MPI
            (void)trace;  // what the MPI build checks
            throw UsageError(
                "--tensor-parallel: this build of eredu has no MPI (reconfigure with -DEREDU_MPI=ON or AUTO after "
                "apt-get install libopenmpi-dev openmpi-bin)");
#else
            // A rank holds slices of tensors: there is no whole tensor to cast in place of
            // another, and one trace file per rank would overwrite each other. Its shards are
            // verified against shard digests (`eredu checksum --tensor-parallel N`).
            if (cast_of(o->dtype))
              throw UsageError("--dtype: --tensor-parallel loads keep the stored dtypes (give --dtype keep)");
            if (trace->count() > 0) throw UsageError("--trace: not with --tensor-parallel");
            if (o->weights != "copy") throw UsageError("--weights: --tensor-parallel loads copy their shards");
            // A gathered tensor's rows have no digest of their own (eredu checksum records the
            // shards of the default reads), so require could only refuse the load.
            if (o->tensor_parallel.replicated == "gather" && o->verify == "require")
              throw UsageError(
                  "--replicated gather: --verify require cannot check the rows a rank reads of a gathered tensor (no "
                  "digests are recorded for them); give --verify on (they count as unverified) or --replicated read");
            return run_tensor_parallel_load(*o, f);
#endif
          }};
}

}  // namespace eredu::cli
