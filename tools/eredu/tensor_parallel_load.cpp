// `eredu load PATH --tensor-parallel` under `mpirun -np N`: every rank plans its shard of the
// checkpoint (engine::plan_tensor_parallel), loads only its bytes into CPU tensors, verifies
// them under --verify against the digests of its shards (and of its replicated tensors),
// checks that its reader delivered exactly the bytes its plan selects, and rank 0 prints
// every rank's figures and the totals. Under --replicated gather each rank reads 1/N of the
// replicated tensors and the ranks all-gather them (engine::async_gather_replicated). Built only with MPI (EREDU_MPI,
// tools/CMakeLists.txt).
#include <tbb/global_control.h>
#include <unistd.h>

#include <fcntl.h>
#include <algorithm>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "commands.hpp"
#include "eredu/core/error.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/cpu/convert.hpp"
#include "eredu/engine/description/plan_module.hpp"
#include "eredu/engine/orchestration/load.hpp"
#include "eredu/engine/orchestration/materialize.hpp"
#include "eredu/engine/parallel/gather_replicated.hpp"
#include "eredu/engine/parallel/sharding.hpp"
#include "eredu/io/remote/remote_url.hpp"
#include "eredu/mpi/backend.hpp"
#include "eredu/mpi/communicator.hpp"
#include "eredu/mpi/environment.hpp"
#include "interrupt.hpp"
#include "load_options.hpp"
#include "progress.hpp"
#include "shard_options.hpp"
#include "verify_flags.hpp"

namespace eredu::cli {
namespace {

using Model = engine::PlanModule<cpu::Parameter>;

/// One rank's timed load.
struct RankLoad {
  std::uint64_t read_bytes = 0;       ///< what its reader delivered during this load, alignment windows aside
  std::uint64_t alignment_bytes = 0;  ///< what it also read only to align direct reads (cold windows, re-reads)
  double seconds = 0;
  bool recycled = false;
  std::uint64_t tensors_verified = 0;    ///< tensors and shards that matched their digests
  std::uint64_t bytes_verified = 0;      ///< their bytes
  std::uint64_t tensors_unverified = 0;  ///< tensors read without a digest to check
  double gather_seconds = 0;             ///< of `seconds`, the all-gather of the replicated rows (--replicated gather)
};

/// What each rank sends rank 0 once its loads are done (a fixed size: every rank has the same
/// --repeat, as all_gather_bytes requires).
struct RankFigures {
  std::uint64_t planned_read_bytes = 0;
  std::uint64_t bound_bytes = 0;
  std::uint64_t peak_rss_bytes = 0;
  std::uint64_t staging_high_water_bytes = 0;
  std::uint64_t storage_retained_bytes = 0;
  std::uint64_t threads = 0;
  std::uint64_t gathered_bytes = 0;  // what each load's gather received from the other ranks
  std::vector<RankLoad> loads;

  static constexpr std::size_t fixed_words = 7;

  std::vector<std::byte> pack() const {
    std::vector<std::uint64_t> words = {planned_read_bytes,     bound_bytes, peak_rss_bytes, staging_high_water_bytes,
                                        storage_retained_bytes, threads,     gathered_bytes};
    for (const RankLoad& l : loads) {
      std::uint64_t s = 0;
      std::memcpy(&s, &l.seconds, sizeof s);
      std::uint64_t g = 0;
      std::memcpy(&g, &l.gather_seconds, sizeof g);
      words.insert(words.end(), {l.read_bytes, s, l.recycled ? 1u : 0u, l.tensors_verified, l.bytes_verified,
                                 l.tensors_unverified, g, l.alignment_bytes});
    }
    std::vector<std::byte> bytes(words.size() * sizeof(std::uint64_t));
    std::memcpy(bytes.data(), words.data(), bytes.size());
    return bytes;
  }

  static constexpr std::size_t words_per_load = 8;

  static RankFigures unpack(const std::byte* data, std::size_t repeat) {
    std::vector<std::uint64_t> w(fixed_words + words_per_load * repeat);
    std::memcpy(w.data(), data, w.size() * sizeof(std::uint64_t));
    RankFigures f{w[0], w[1], w[2], w[3], w[4], w[5], w[6], {}};
    for (std::size_t i = 0; i < repeat; ++i) {
      const std::uint64_t* at = &w[fixed_words + words_per_load * i];
      RankLoad l;
      l.read_bytes = at[0];
      std::memcpy(&l.seconds, &at[1], sizeof l.seconds);
      l.recycled = at[2] != 0;
      l.tensors_verified = at[3];
      l.bytes_verified = at[4];
      l.tensors_unverified = at[5];
      std::memcpy(&l.gather_seconds, &at[6], sizeof l.gather_seconds);
      l.alignment_bytes = at[7];
      f.loads.push_back(l);
    }
    return f;
  }
};

/// Every rank says whether its step succeeded; a rank that failed rethrows its own error,
/// the others fail naming it. Without this, one rank's error (a file missing on its node)
/// would leave the others waiting in the next collective until the timeout. Patient: ranks
/// reach it as their loads finish, seconds apart.
void agree(mpi::Communicator& world, std::exception_ptr mine, std::string_view step) {
  auto [all, done] = world.all_gather_bytes({std::byte{mine ? std::uint8_t{1} : std::uint8_t{0}}}, std::nullopt, true);
  done.get();
  if (mine) std::rethrow_exception(mine);
  for (int r = 0; r < world.size(); ++r)
    if ((*all)[static_cast<std::size_t>(r)] != std::byte{0})
      throw Error(errc::collective_error, {},
                  fmt::format("rank {} of {} failed {} (its error is on its standard error)", r, world.size(), step));
}

/// Ranks of `world` on this host (the same host hash as this rank's).
int ranks_on_this_host(const mpi::Communicator& world) {
  const std::uint64_t here = world.peers().at(static_cast<std::size_t>(world.rank())).host;
  return static_cast<int>(
      std::count_if(world.peers().begin(), world.peers().end(), [here](const mpi::Peer& p) { return p.host == here; }));
}

}  // namespace

int run_tensor_parallel_load(const LoadOptions& o, const CommonFlags& flags) {
  // MPI lives until the process exits (a static's destructor, after main() has printed the
  // error or report): MPI_Finalize waits for every rank, so no rank exits, and makes mpirun
  // abort the job, while another is still writing its output.
  static std::optional<mpi::Environment> environment;
  environment.emplace();
  // Loads of large checkpoints run for minutes on slow storage: waits are bounded by an hour.
  mpi::Communicator world = mpi::Communicator::world(*environment, {.timeout = std::chrono::hours(1)});
  const int rank = world.rank(), size = world.size();
  // One JSON document per job: rank 0's. The other ranks' errors still reach stderr.
  if (rank != 0 && flags.json) {
    const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (null >= 0) {
      ::dup2(null, STDOUT_FILENO);
      ::close(null);
    }
  }

  io::SourceOptions opts = source_options(o);
  // Every byte goes through the reader, so that its count is exactly what this rank read and
  // can be checked against the plan (a mapping's copy is counted nowhere).
  opts.map_resident = false;
  select_kernels(o);

  // Ranks on one host share its CPUs: by default each gets its share of them.
  const unsigned threads = o.threads_given ? o.threads
                                           : std::max(1u, std::max(1u, std::thread::hardware_concurrency()) /
                                                              static_cast<unsigned>(ranks_on_this_host(world)));
  tbb::global_control workers(tbb::global_control::max_allowed_parallelism, std::size_t{threads} + 1);
  cpu::Executor executor(static_cast<int>(threads));
  cpu::StoragePool storage(
      cpu::StoragePoolOptions{.pages = o.pages == "huge" ? cpu::StoragePages::huge : cpu::StoragePages::small});
  cpu::MaterializationContext context{executor, storage, false, cpu::WeightStorage::copied, o.cold_reads == "window"};

  Progress bar(!flags.quiet && rank == 0);
  bar.phase("open");
  asio::io_context ctx(1);
  Interrupt interrupt(ctx);
  std::shared_ptr<io::CheckpointSource> source;
  std::optional<engine::TensorParallelPlan> plan;
  LlamaDims dims;
  engine::VerifyOptions verify;
  std::uint64_t reread_bytes = 0;  // what verification reads again (the shards of fused tensors)
  const bool gather = o.tensor_parallel.replicated == "gather";
  std::exception_ptr failure;
  try {
    interrupt.doing(fmt::format("opening {}", io::shown_location(o.path)));
    source = io::CheckpointSource::open(ctx.get_executor(), o.path, opts);
    interrupt.check();
    const TensorParallelOptions& tp = o.tensor_parallel;
    dims = llama_dims(source->catalog(), {tp.heads, tp.kv_heads, tp.head_dim}, o.path);
    plan = engine::plan_tensor_parallel(source->catalog(), tensor_parallel_rules(tp.shard, tp.family, dims.sharding),
                                        rank, size,
                                        gather ? engine::ReplicatedReads::gather : engine::ReplicatedReads::every_rank);
    // The whole-tensor check of `require` in checksums_for does not apply to shards: the
    // engine fails a load under require when a tensor or shard this rank reads has no digest.
    verify = verify_options(o.verify,
                            checksums_for(o.path, source->catalog(), o.verify == "off" ? "off" : "on", o.checksums));
    reread_bytes = engine::verification_reread_bytes<cpu::Backend>(verify, source->catalog(), plan->bindings);
  } catch (...) {
    failure = std::current_exception();
  }
  agree(world, failure, "to open and plan the checkpoint");
  const io::Catalog& catalog = source->catalog();
  const Model blueprint = Model::from_tensor_parallel(*plan);

  RankFigures mine;
  std::optional<Model> model;
  for (unsigned r = 0; r < o.repeat; ++r) {
    model.reset();  // its storage returns to the pool and is reused
    const bool recycled = storage.stats().retained_bytes > 0;
    model.emplace(blueprint.unbound());
    engine::MaterializeProgress counters;
    bar.phase("read", plan->read_bytes,
              o.repeat > 1 ? fmt::format("load {}/{}", r + 1, o.repeat) : std::string("load"));
    // The ranks start each load together, so that the slowest rank's seconds are the group's.
    world.barrier().get();
    const std::uint64_t before = source->reader().stats().bytes;
    const std::uint64_t aligned_before = source->alignment_bytes();
    const double t0 = now_seconds();
    double seconds = 0, gather_seconds = 0;
    failure = nullptr;
    interrupt.doing(fmt::format("loading rank {} of {} of {} (load {} of {}); the module was left unbound", rank, size,
                                io::shown_location(o.path), r + 1, o.repeat));
    std::exception_ptr gathered;
    if (!gather) {
      engine::async_load<cpu::Backend>(*model, *source, plan->bindings, context,
                                       {.progress = &counters, .verify = verify},
                                       asio::bind_cancellation_slot(interrupt.slot(), [&](std::exception_ptr e) {
                                         seconds = now_seconds() - t0;
                                         failure = e;
                                         interrupt.disarm();
                                       }));
    } else {
      // Read this rank's rows (and its shards), then gather: on every rank, also one whose
      // read failed (with no unit), so that the others fail at once instead of waiting.
      engine::MaterializedUnit<mpi::Backend> unit;
      engine::async_materialize<mpi::Backend>(
          *source, plan->bindings, context, {.progress = &counters, .verify = verify},
          asio::bind_cancellation_slot(interrupt.slot(),
                                       [&](std::exception_ptr e, engine::MaterializedUnit<mpi::Backend> u) {
                                         failure = e;
                                         unit = std::move(u);
                                         interrupt.disarm();
                                       }));
      interrupt.arm();
      ctx.restart();
      ctx.run();
      try {
        interrupt.rethrow(failure);
      } catch (...) {
        failure = std::current_exception();
      }
      const double g0 = now_seconds();
      engine::async_gather_replicated<mpi::Backend>(ctx.get_executor(), executor, world, *plan, std::move(unit), *model,
                                                    {.timeout = std::chrono::hours(1), .group = "world"},
                                                    // g0 by value: this block ends before the handler runs.
                                                    [&, g0](std::exception_ptr e) {
                                                      seconds = now_seconds() - t0;
                                                      gather_seconds = now_seconds() - g0;
                                                      gathered = e;
                                                    });
    }
    if (!gather) interrupt.arm();
    ctx.restart();
    ctx.run();
    // The failure of the read, where there was one, says more than the gather's.
    if (!failure) failure = gathered;
    try {
      interrupt.rethrow(failure);
    } catch (...) {
      failure = std::current_exception();
    }
    agree(world, failure, fmt::format("load {} of {}", r + 1, o.repeat));
    // A direct-read window around a small piece (verification re-reads fused tensors' pieces)
    // reads bytes of its neighbours too: counted apart, so the plan's figure stays exact.
    const std::uint64_t aligned = source->alignment_bytes() - aligned_before;
    const std::uint64_t delivered = source->reader().stats().bytes - before - aligned;
    bar.update(delivered);
    mine.loads.push_back({delivered, aligned, seconds, recycled, counters.tensors_verified.load(),
                          counters.bytes_verified.load(), counters.tensors_unverified.load(), gather_seconds});
  }
  bar.finish();
  mine.planned_read_bytes = plan->read_bytes + reread_bytes;
  mine.bound_bytes = plan->bound_bytes;
  mine.peak_rss_bytes = peak_rss_bytes();
  mine.staging_high_water_bytes = source->pool().high_water();
  mine.storage_retained_bytes = storage.stats().retained_bytes;
  mine.threads = threads;
  mine.gathered_bytes = plan->gather_received_bytes;

  auto [gathered, done] = world.all_gather_bytes(mine.pack(), std::nullopt, true);
  done.get();
  const std::size_t stride = gathered->size() / static_cast<std::size_t>(size);
  std::vector<RankFigures> ranks;
  for (int r = 0; r < size; ++r)
    ranks.push_back(RankFigures::unpack(gathered->data() + static_cast<std::size_t>(r) * stride, o.repeat));

  // Each rank's reader must have delivered exactly its plan's bytes, in every load.
  bool ok = true;
  for (const RankFigures& f : ranks)
    for (const RankLoad& l : f.loads) ok &= l.read_bytes == f.planned_read_bytes;
  if (rank != 0) return ok ? 0 : 1;

  std::size_t split_tensors = 0;
  for (const engine::ShardedTensor& t : plan->tensors)
    split_tensors += t.shard.kind() != engine::Shard::Kind::replicated;
  // The group's load i: from the common start to its slowest rank's end, every rank's bytes.
  struct GroupLoad {
    std::uint64_t bytes = 0;
    double seconds = 0;
    bool recycled = false;
    std::uint64_t tensors_verified = 0, bytes_verified = 0, tensors_unverified = 0;  // summed over the ranks
  };
  std::vector<GroupLoad> group(o.repeat);
  std::uint64_t peak_rss = 0, staging = 0, retained = 0, bound = 0;
  for (const RankFigures& f : ranks) {
    for (unsigned i = 0; i < o.repeat; ++i) {
      group[i].bytes += f.loads[i].read_bytes;
      group[i].seconds = std::max(group[i].seconds, f.loads[i].seconds);
      group[i].recycled |= f.loads[i].recycled;
      group[i].tensors_verified += f.loads[i].tensors_verified;
      group[i].bytes_verified += f.loads[i].bytes_verified;
      group[i].tensors_unverified += f.loads[i].tensors_unverified;
    }
    peak_rss = std::max(peak_rss, f.peak_rss_bytes);
    staging = std::max(staging, f.staging_high_water_bytes);
    retained += f.storage_retained_bytes;
    bound += f.bound_bytes;
  }
  const GroupLoad& last = group.back();
  const std::size_t digest_count = verify.checksums.size() + verify.checksums.shard_count();
  const std::uint64_t source_bytes = catalog.total_bytes();

  if (flags.json) {
    JsonWriter json;
    begin_document(json, "load");
    json.field("path", io::shown_location(o.path)).field("reader", source->reader().name());
    json.count("tensor", catalog.size()).count("file", catalog.files().size());
    json.bytes("tensor", source_bytes).bytes("", last.bytes).bytes("output", bound);
    json.field("dtype", o.dtype).field("threads", threads).field("kernels", cpu::convert_isa_name());
    json.field("copies", "reader").field("cold_reads", o.cold_reads).field("pages", o.pages);
    json.bytes("budget", source->pool().budget());
    json.field("verify", o.verify).count("checksum", digest_count);
    json.key("loads").begin_array();
    for (const GroupLoad& g : group) {
      json.begin_object().bytes("", g.bytes).seconds("", g.seconds).rate("", gb_per_s(g.bytes, g.seconds));
      json.field("recycled", g.recycled)
          .count("tensor_verified", g.tensors_verified)
          .bytes("verified", g.bytes_verified);
      json.count("tensor_unverified", g.tensors_unverified).end_object();
    }
    json.end_array();
    json.bytes("staging_high_water", staging).bytes("peak_rss", peak_rss).bytes("storage_retained", retained);
    json.key("tensor_parallel").begin_object();
    json.count("rank", static_cast<std::uint64_t>(size)).field("ok", ok);
    json.field("head_dim", dims.sharding.head_dim).field("heads", dims.sharding.heads);
    json.field("kv_heads", dims.sharding.kv_heads).field("dims_from", dims.source);
    json.count("shard_rule", o.tensor_parallel.shard.size());
    json.bytes("split", plan->split_bytes).bytes("replicated", plan->replicated_bytes);
    json.count("split_tensor", split_tensors).count("replicated_tensor", plan->tensors.size() - split_tensors);
    json.field("replicated_reads", engine::replicated_reads_name(plan->replicated_reads))
        .bytes("gathered", plan->gathered_bytes);
    json.count("gathered_tensor", plan->gathered_tensors)
        .count("whole_replicated_tensor", plan->whole_replicated_tensors);
    json.bytes("read", last.bytes).seconds("", last.seconds).rate("", gb_per_s(last.bytes, last.seconds));
    json.key("ranks").begin_array();
    for (int r = 0; r < size; ++r) {
      const RankFigures& f = ranks[static_cast<std::size_t>(r)];
      const RankLoad& l = f.loads.back();
      json.begin_object().field("rank", r).bytes("read", l.read_bytes).bytes("planned_read", f.planned_read_bytes);
      json.bytes("alignment_read", l.alignment_bytes);
      json.field("ok", std::all_of(f.loads.begin(), f.loads.end(),
                                   [&](const RankLoad& x) { return x.read_bytes == f.planned_read_bytes; }));
      json.bytes("gathered", f.gathered_bytes)
          .bytes("bound", f.bound_bytes)
          .seconds("", l.seconds)
          .rate("", gb_per_s(l.read_bytes, l.seconds));
      json.field("threads", f.threads).bytes("peak_rss", f.peak_rss_bytes);
      json.bytes("staging_high_water", f.staging_high_water_bytes);
      json.key("loads").begin_array();
      for (const RankLoad& x : f.loads)
        json.begin_object()
            .bytes("read", x.read_bytes)
            .bytes("alignment_read", x.alignment_bytes)
            .seconds("", x.seconds)
            .rate("", gb_per_s(x.read_bytes, x.seconds))
            .field("recycled", x.recycled)
            .count("tensor_verified", x.tensors_verified)
            .bytes("verified", x.bytes_verified)
            .count("tensor_unverified", x.tensors_unverified)
            .seconds("gather", x.gather_seconds)
            .end_object();
      json.end_array().end_object();
    }
    json.end_array().end_object();
    print_document(json);
  } else {
    for (std::size_t i = 0; i < group.size(); ++i)
      fmt::print("load{} {} ({} tensors, {} file{}) on {} rank{}: read {} in {:.3f} s: {:.2f} GB/s{}\n",
                 group.size() > 1 ? fmt::format(" {}", i + 1) : std::string(), format_bytes(source_bytes),
                 catalog.size(), catalog.files().size(), catalog.files().size() == 1 ? "" : "s", size,
                 size == 1 ? "" : "s", format_bytes(group[i].bytes), group[i].seconds,
                 gb_per_s(group[i].bytes, group[i].seconds),
                 group[i].recycled ? " (recycled storage)" : " (fresh storage)");
    fmt::print("  sharding {} split over the ranks ({} tensors), {} replicated on each ({}); {} rules, head_dim {}",
               format_bytes(plan->split_bytes), split_tensors, format_bytes(plan->replicated_bytes),
               plan->tensors.size() - split_tensors, o.tensor_parallel.family == "llama" ? "Llama" : "moe",
               dims.sharding.head_dim);
    if (dims.sharding.heads) fmt::print(", {} head{}", dims.sharding.heads, dims.sharding.heads == 1 ? "" : "s");
    if (dims.sharding.kv_heads)
      fmt::print(", {} kv head{}", dims.sharding.kv_heads, dims.sharding.kv_heads == 1 ? "" : "s");
    fmt::print(" ({}){}\n", dims.source,
               o.tensor_parallel.shard.empty()
                   ? std::string()
                   : fmt::format(", after {} --shard rules", o.tensor_parallel.shard.size()));
    if (gather)
      fmt::print(
          "  replicated gather: {} in {} tensors read 1/{} by each rank and all-gathered, {} tensors read whole\n",
          format_bytes(plan->gathered_bytes), plan->gathered_tensors, size, plan->whole_replicated_tensors);
    for (int r = 0; r < size; ++r) {
      const RankFigures& f = ranks[static_cast<std::size_t>(r)];
      const RankLoad& l = f.loads.back();
      fmt::print(
          "  rank {:<3} read {} ({}){}{} in {:.3f} s: {:.2f} GB/s, peak RSS {}, {} thread{}\n", r,
          format_bytes(l.read_bytes),
          l.read_bytes == f.planned_read_bytes ? "= its plan"
                                               : fmt::format("its plan: {}!", format_bytes(f.planned_read_bytes)),
          l.alignment_bytes ? fmt::format(" + {} around pieces to align direct reads", format_bytes(l.alignment_bytes))
                            : std::string(),
          gather ? fmt::format(", gathered {} (in {:.3f} s)", format_bytes(f.gathered_bytes), l.gather_seconds)
                 : std::string(),
          l.seconds, gb_per_s(l.read_bytes, l.seconds), format_bytes(f.peak_rss_bytes), f.threads,
          f.threads == 1 ? "" : "s");
    }
    fmt::print("  total    read {} in {:.3f} s (the slowest rank): {:.2f} GB/s, peak RSS {} (the largest rank's)\n",
               format_bytes(last.bytes), last.seconds, gb_per_s(last.bytes, last.seconds), format_bytes(peak_rss));
    fmt::print("  reader   {} (every byte: no mappings), conversion kernels {}\n", source->reader().describe(),
               cpu::convert_isa_name());
    fmt::print("  staging  high-water {} of a {} budget (the largest rank's)\n", format_bytes(staging),
               format_bytes(source->pool().budget()));
    fmt::print(
        "  verify   {} (over all ranks; a shard counts as a tensor)\n",
        verify_summary(o.verify, last.tensors_verified, last.bytes_verified, last.tensors_unverified, digest_count));
  }
  if (!ok)
    fmt::print(stderr, "eredu load: a rank's reader delivered other bytes than its plan selects (see the report)\n");
  return ok ? 0 : 1;
}

}  // namespace eredu::cli
