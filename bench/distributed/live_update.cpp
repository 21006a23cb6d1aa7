// live_update: a live weight update from a trainer's memory to a tensor-parallel pair of
// inference ranks (mpi::Publisher → mpi::PublishedSource → DistributedModelSlot), against
// the same bytes moved by MPI_Bcast and against each rank swapping to the same version from a
// hot local file, in the same rounds (the order rotated each round). Run under mpirun -np 3:
// rank 0 publishes, ranks 1 and 2 serve; rank 0 prints one JSON line per round and a summary.
//
//   mpirun -np 3 build/release/bench/distributed/live_update [--size-mib 2048] [--rounds 7] [--dir /dev/shm/eredu-live]
//     [--only update,update2]   (time only these contenders; bench/live_update.sh needs them all)
//     [--transport two_sided]   (every contender's transport but update2's; default one_sided,
//                                which is not the library's default: the sections of
//                                docs/performance.md compare this update with update2)
//
// Each round, on the subscribers:
//   update  open the newest version, fetch the publisher's digests of this rank's selections,
//           swap (every tensor verified where it lands, the canary confirms the version is
//           still offered, the ranks vote): from the open to the commit, the slower rank's time;
//   bcast   MPI_Bcast of the whole model from rank 0 in 64 MiB pieces (the naive weight sync);
//   file    swap to the same version from a safetensors file in DIR (tmpfs: page cache), with
//           the same digests verified;
//   delta1, delta10
//           a delta update: the subscribers first swap (untimed) to a version B published whole,
//           then to a version that differs from B in every value of 1 % (10 %) of its 64 KiB
//           blocks, published against B; each rank copies B's bytes from its serving version
//           and reads only the changed blocks of its shard. Timed like update, from the open to
//           the commit;
//   sparse  the same with 1.5 % of the bf16 values changed (their lowest bit flipped) at random
//           places: every block changes, and the publisher sends the changed values;
//   drift   the same with 78 % of the bf16 values moved by 1-3 units in the last place: every
//           block and most values change, and the publisher sends the XOR with the base,
//           compressed;
//   update2 update over LiveTransport::two_sided: each part a request the publisher answers
//           with a copy of the bytes (a second publisher and subscribers on their own group);
//   inplace the full version into an InPlaceModelSlot on each subscriber (a model of its own,
//           made only when this contender runs): staged and verified as update, the canary
//           confirms, then the gate closes, the requests in flight drain and the new bytes are
//           copied over the serving ones. No vote: each rank's slot swaps alone;
//   patch1  a delta with 1 % of its 64 KiB blocks changed (as delta1) into another
//           InPlaceModelSlot with async_patch: each version is the last one changed again, and
//           each rank reads the changed blocks of its shard over its serving bytes, compares them
//           with those and writes only the 64-byte blocks that differ, with no staged copy. Its
//           first version (warm-up) is bound by async_swap, which adopts the staged weights.
// Meanwhile a serving thread on each subscriber takes the version for each request
// (version_for_step) and reads two tensors of it; its latencies are kept apart for requests
// during an update and in steady state, and every response checks that both tensors come from
// one version (a mixed response counts as an error). With inplace (patch1), another serving
// thread does the same through that in-place slot's gate (async_read), where a request waits
// during a copy (a patch's write).

#include <mpi.h>

#include <algorithm>
#include <array>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "eredu/engine/description/plan_module.hpp"
#include "eredu/engine/parallel/sharding.hpp"
#include "eredu/engine/serving/distributed_model_slot.hpp"
#include "eredu/engine/serving/in_place_model_slot.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "eredu/mpi/backend.hpp"
#include "eredu/mpi/environment.hpp"
#include "eredu/mpi/published_source.hpp"
#include "eredu/mpi/publisher.hpp"
#include "eredu/synth/synthetic_checkpoint.hpp"

using namespace eredu;

namespace {

using Module = engine::PlanModule<cpu::Parameter>;
using Slot = engine::DistributedModelSlot<cpu::Backend, Module, mpi::Backend>;
using InPlaceSlot = engine::InPlaceModelSlot<cpu::Backend, Module>;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

/// This process's peak resident memory (VmHWM), MiB.
double peak_rss_mib() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  double kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::strncmp(line, "VmHWM:", 6) == 0) kib = std::strtod(line + 6, nullptr);
  std::fclose(f);
  return kib / 1024;
}

/// Flips the lowest bit of every value of `percent` % of the `block`-byte blocks of `t`, as
/// where a layer was trained (`next` draws which); returns the blocks changed.
template <class Next>
std::uint64_t change_blocks(std::vector<std::byte>& t, std::size_t block, int percent, Next& next) {
  std::uint64_t changed = 0;
  for (std::size_t o = 0; o < t.size(); o += block) {
    if (next() % 100 >= static_cast<std::uint64_t>(percent)) continue;
    for (std::size_t v = o; v < std::min(o + block, t.size()); v += 2) t[v] ^= std::byte{0x01};
    ++changed;
  }
  return changed;
}

/// The slowest rank's value (every rank gets it).
double slowest(double mine) {
  double out = 0;
  MPI_Allreduce(&mine, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

template <class T>
T run(asio::io_context& ctx, asio::awaitable<T> a) {
  auto f = asio::co_spawn(ctx, std::move(a), asio::use_future);
  while (f.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    ctx.restart();
    ctx.run_one_for(std::chrono::milliseconds(5));
  }
  return f.get();
}

template <class F>
auto wait(asio::io_context& ctx, F& f) {
  while (f.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    ctx.restart();
    ctx.run_one_for(std::chrono::milliseconds(5));
  }
  return f.get();
}

/// The serving thread of a subscriber (see file comment).
struct Server {
  /// Takes the version for request `step` and reads the first 8 bytes of the two tensors every
  /// response reads; false while there is no version.
  using Respond = std::function<bool(std::uint64_t step, std::uint64_t& first, std::uint64_t& last)>;
  explicit Server(Respond r) : respond(std::move(r)) {}
  Respond respond;
  std::vector<std::uint64_t> first_prefix, last_prefix;  // their first 8 bytes, by version seed index
  std::atomic<bool> stop{false};
  std::atomic<bool> updating{false};
  std::vector<double> steady_us, during_us;
  std::uint64_t responses = 0, mixed = 0;
  std::thread thread;

  void start() {
    thread = std::thread([this] {
      for (std::uint64_t step = 0; !stop.load(std::memory_order_relaxed); ++step) {
        const bool during = updating.load(std::memory_order_relaxed);
        const Clock::time_point t0 = Clock::now();
        std::uint64_t a = 0, b = 0;
        if (respond(step, a, b)) {
          const auto ia = std::find(first_prefix.begin(), first_prefix.end(), a) - first_prefix.begin();
          const auto ib = std::find(last_prefix.begin(), last_prefix.end(), b) - last_prefix.begin();
          if (ia != ib) ++mixed;
          ++responses;
        }
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
        (during ? during_us : steady_us).push_back(us);
        std::this_thread::sleep_for(std::chrono::microseconds(200));  // ~5000 requests a second
      }
    });
  }
};

int run_ranks(mpi::Environment& env, std::uint64_t size_mib, int rounds, const std::filesystem::path& dir,
              unsigned only, mpi::LiveTransport transport);

/// The contenders, in the order their numbers rotate.
constexpr std::array<std::string_view, 10> contender_names{"update", "bcast",   "file",  "delta1",  "delta10",
                                                           "sparse", "update2", "drift", "inplace", "patch1"};
/// The warm-up updates' contenders (one round per version): update, update2, inplace, patch1.
constexpr std::array<int, 4> warm_up{0, 6, 8, 9};
/// The most a patch1 update may change (PatchOptions::budget): 1 % of the blocks is less.
constexpr std::uint64_t patch_budget = std::uint64_t{256} << 20;

/// The bit set of the contenders `list` names ("update,update2"), to time only those.
unsigned contender_set(std::string_view list) {
  unsigned set = 0;
  while (!list.empty()) {
    const std::string_view name = list.substr(0, list.find(','));
    list.remove_prefix(std::min(list.size(), name.size() + 1));
    const auto it = std::find(contender_names.begin(), contender_names.end(), name);
    if (it == contender_names.end()) throw std::invalid_argument(fmt::format("--only: no contender '{}'", name));
    set |= 1u << (it - contender_names.begin());
  }
  return set;
}

int run_bench(int argc, char** argv) {
  unsigned only = 0x3ff;  // every contender
  std::uint64_t size_mib = 2048;
  int rounds = 7;
  std::filesystem::path dir = "/dev/shm/eredu-live";
  mpi::LiveTransport transport = mpi::LiveTransport::one_sided;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (flag == "--size-mib")
      size_mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (flag == "--rounds")
      rounds = std::atoi(argv[i + 1]);
    else if (flag == "--dir")
      dir = argv[i + 1];
    else if (flag == "--only")
      only = contender_set(argv[i + 1]);
    else if (flag == "--transport" &&
             (argv[i + 1] == std::string_view("one_sided") || argv[i + 1] == std::string_view("two_sided")))
      transport =
          argv[i + 1] == std::string_view("one_sided") ? mpi::LiveTransport::one_sided : mpi::LiveTransport::two_sided;
    else
      throw std::invalid_argument(fmt::format(
          "unknown option '{}' (--size-mib N, --rounds N, --dir D, --only NAME,..., --transport one_sided|two_sided)",
          flag));
  }
  mpi::Environment env(argc, argv, {.required = mpi::ThreadLevel::multiple, .progress = {}});
  try {
    return run_ranks(env, size_mib, rounds, dir, only, transport);
  } catch (const std::exception& e) {
    // The other ranks wait for this one in a barrier: end the job rather than hang it.
    std::fprintf(stderr, "live_update: rank %d: %s\n", env.world_rank(), e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}

int run_ranks(mpi::Environment& env, std::uint64_t size_mib, int rounds, const std::filesystem::path& dir,
              unsigned only, mpi::LiveTransport transport) {
  // update, bcast, file, delta1, delta10, sparse, update2 (two-sided), drift, inplace, patch1
  constexpr int contenders = 10;
  mpi::Communicator world = mpi::Communicator::world(env, {.timeout = std::chrono::minutes(5)});
  if (world.size() != 3) throw std::invalid_argument("run it with mpirun -np 3");
  const int rank = world.rank();
  mpi::Communicator live = world.split(0, rank, "live");
  mpi::Communicator live2 = world.split(0, rank, "live2");  // the two-sided transport's group
  mpi::Communicator tp = world.split(rank == 0 ? -1 : 0, rank, "tp");

  // Two versions (seeds 1 and 2), alternated round by round, so that a mixed response shows.
  const synth::SyntheticOptions options_a{.target_bytes = size_mib << 20, .seed = 1};
  synth::SyntheticOptions options_b = options_a;
  options_b.seed = 2;
  const synth::SyntheticModel model = synth::plan_model(options_a);
  const std::filesystem::path file_a = dir / "a", file_b = dir / "b";
  if (rank == 0) {
    std::filesystem::create_directories(dir);
    if (!std::filesystem::exists(file_a / "model.safetensors")) synth::write_synthetic(file_a, options_a);
    if (!std::filesystem::exists(file_b / "model.safetensors")) synth::write_synthetic(file_b, options_b);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  asio::io_context ctx;
  const std::size_t piece = std::size_t{64} << 20;
  std::vector<std::byte> bcast_buffer(piece);
  if (rank == 0) {
    // The trainer's memory: both versions, filled as the files were.
    std::vector<std::vector<std::byte>> mem_a, mem_b, mem_d;  // mem_d: a delta's version
    for (const synth::TensorSpec& t : model.tensors) {
      mem_a.emplace_back(synth::tensor_nbytes(t));
      mem_b.emplace_back(synth::tensor_nbytes(t));
      mem_d.emplace_back(synth::tensor_nbytes(t));
      synth::fill_tensor_bytes(options_a.seed, t, 0, mem_a.back());
      synth::fill_tensor_bytes(options_b.seed, t, 0, mem_b.back());
    }
    const auto tensors_of = [&](const std::vector<std::vector<std::byte>>& mem) {
      std::vector<mpi::PublishedTensor> tensors;
      for (std::size_t i = 0; i < model.tensors.size(); ++i)
        tensors.push_back({model.tensors[i].name, model.tensors[i].dtype, model.tensors[i].shape, mem[i]});
      return tensors;
    };
    const std::size_t block = mpi::PublisherOptions{}.delta_block;
    // The serving threads check every response by the first bytes of two tensors (see Server):
    // a delta leaves those two as in its base, so that a version is still told by them.
    std::set<std::string> checked;
    {
      std::unique_ptr<io::CheckpointSource> probe = io::CheckpointSource::open(ctx.get_executor(), file_a, {});
      for (int tp_rank = 0; tp_rank < 2; ++tp_rank) {
        const engine::TensorParallelPlan p = engine::plan_tensor_parallel(
            probe->catalog(),
            engine::ShardingRules::llama(
                {.head_dim = model.hidden / model.heads, .heads = model.heads, .kv_heads = model.kv_heads}),
            tp_rank, 2);
        checked.insert(p.tensors.front().key);
        checked.insert(p.tensors.back().key);
      }
    }
    mpi::Publisher publisher(live, {.transport = transport, .xor_deltas = true});  // drift: the compressed XOR
    // patch1's versions: the one offered (patch_last, in patch_mem[patch_cur]) and the next.
    std::vector<std::vector<std::byte>> patch_mem[2];
    if (only >> 9 & 1) patch_mem[0] = patch_mem[1] = mem_a;
    std::optional<mpi::Publication> patch_last;
    std::string patch_last_tag;
    int patch_cur = 0;
    mpi::Publisher publisher2(live2, {.transport = mpi::LiveTransport::two_sided});
    for (int r = -2; r < rounds; ++r) {  // warm-up updates first, one per version and transport
      for (int k = 0; k < (r < 0 ? static_cast<int>(warm_up.size()) : contenders); ++k) {
        const int contender = r < 0 ? warm_up[static_cast<std::size_t>(k)] : (r + k) % contenders;
        if (!(only >> contender & 1)) continue;
        MPI_Barrier(MPI_COMM_WORLD);
        if ((contender >= 3 && contender <= 5) || contender == 7) {
          auto& base = ((r + 2) % 2 == 0) ? mem_a : mem_b;
          const std::string base_tag = fmt::format("base-{}-{}", r, k);
          mpi::Publication b = publisher.publish(base_tag, {}, tensors_of(base));
          MPI_Barrier(MPI_COMM_WORLD);
          b.wait_served(2, std::chrono::minutes(5));
          // The trainer's next step: the base with a byte changed in `percent` of its blocks, or
          // 1.5 % of its values changed (contender 5), or 78 % of its values moved by 1-3 units in
          // the last place (drift, contender 7).
          const int percent = contender == 3 ? 1 : 10;
          for (std::size_t i = 0; i < base.size(); ++i) mem_d[i] = base[i];
          std::uint64_t x = 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(r + 3) + static_cast<std::uint64_t>(k);
          const auto next = [&x] {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            return x;
          };
          std::uint64_t changed = 0;
          for (std::size_t i = 0; i < mem_d.size(); ++i) {
            auto& t = mem_d[i];
            if (checked.contains(model.tensors[i].name)) continue;
            if (contender == 7) {
              for (std::size_t v = 0; v + 1 < t.size(); v += 8) {
                std::uint64_t bits = next();
                for (std::size_t u = v; u + 1 < std::min(v + 8, t.size()); u += 2, bits >>= 16) {
                  if ((bits & 127) >= 100) continue;  // 100 of 128: 78 %
                  const int step = static_cast<int>((bits >> 7) % 3) + 1;
                  std::uint16_t value = static_cast<std::uint16_t>(std::to_integer<unsigned>(t[u]) |
                                                                   std::to_integer<unsigned>(t[u + 1]) << 8);
                  value = static_cast<std::uint16_t>((bits >> 9) & 1 ? value + step : value - step);
                  t[u] = static_cast<std::byte>(value & 0xff);
                  t[u + 1] = static_cast<std::byte>(value >> 8);
                  ++changed;
                }
              }
              continue;
            }
            if (contender == 5) {
              const std::size_t values = t.size() / 2;
              for (std::size_t n = values * 15 / 1000; n > 0; --n, ++changed)
                t[(next() % values) * 2] ^= std::byte{0x01};
              continue;
            }
            changed += change_blocks(t, block, percent, next);
          }
          const Clock::time_point t0 = Clock::now();
          mpi::Publication p = publisher.publish(fmt::format("delta-{}-{}", r, k), base_tag, tensors_of(mem_d));
          const double publish_s = seconds_since(t0);
          MPI_Barrier(MPI_COMM_WORLD);
          p.wait_served(2, std::chrono::minutes(5));
          const double s = slowest(0);
          double parts[3] = {};
          MPI_Reduce(MPI_IN_PLACE, parts, 3, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
          std::printf("%s\n", fmt::format(R"({{"round": {}, "case": "{}", "seconds": {:.4f}, )"
                                          R"("publish_s": {:.4f}, "changed": {}, "load_s": {:.4f}, )"
                                          R"("transferred_bytes": {:.0f}, "delta": {:.0f}}})",
                                          r,
                                          contender == 5   ? std::string("sparse")
                                          : contender == 7 ? std::string("drift")
                                                           : fmt::format("delta{}", percent),
                                          s, publish_s, changed, parts[0], parts[1], parts[2])
                                  .c_str());
        } else if (contender == 0 || contender == 6 || contender == 8) {
          auto& mem = ((r + 2) % 2 == 0) ? mem_a : mem_b;
          const Clock::time_point t0 = Clock::now();
          mpi::Publication p = (contender == 6 ? publisher2 : publisher)
                                   .publish(fmt::format("round-{}-{}", r, contender), {}, tensors_of(mem));
          const double publish_s = seconds_since(t0);
          MPI_Barrier(MPI_COMM_WORLD);
          p.wait_served(2, std::chrono::minutes(5));
          const double s = slowest(0);
          double parts[6] = {};
          MPI_Reduce(MPI_IN_PLACE, parts, contender == 8 ? 6 : 5, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
          if (r >= 0 && contender == 8)
            std::printf("%s\n", fmt::format(R"({{"round": {}, "case": "inplace", "seconds": {:.4f}, )"
                                            R"("publish_s": {:.4f}, "open_s": {:.4f}, "digests_s": {:.4f}, )"
                                            R"("load_s": {:.4f}, "canary_s": {:.4f}, "pause_s": {:.4f}, )"
                                            R"("fresh_blocks": {:.0f}}})",
                                            r, s, publish_s, parts[0], parts[1], parts[2], parts[3], parts[4], parts[5])
                                    .c_str());
          else if (r >= 0)
            std::printf("%s\n", fmt::format(R"({{"round": {}, "case": "{}", "seconds": {:.4f}, "publish_s": {:.4f}, )"
                                            R"("open_s": {:.4f}, "digests_s": {:.4f}, "load_s": {:.4f}, )"
                                            R"("canary_s": {:.4f}, "commit_s": {:.4f}}})",
                                            r, contender == 0 ? "update" : "update2", s, publish_s, parts[0], parts[1],
                                            parts[2], parts[3], parts[4])
                                    .c_str());
        } else if (contender == 9) {
          // patch1: the last version with 1 % of its blocks changed again (the first, whole).
          const std::string tag = fmt::format("patch-{}", r);
          std::uint64_t changed = 0;
          std::optional<mpi::Publication> p;
          Clock::time_point t0 = Clock::now();
          if (!patch_last) {
            p.emplace(publisher.publish(tag, {}, tensors_of(patch_mem[0])));
          } else {
            const auto& from = patch_mem[patch_cur];
            auto& to = patch_mem[1 - patch_cur];  // the version before patch_last: withdrawn
            std::uint64_t x = 0xD1B54A32D192ED03ull * static_cast<std::uint64_t>(r + 3);
            const auto next = [&x] {
              x ^= x << 13;
              x ^= x >> 7;
              x ^= x << 17;
              return x;
            };
            for (std::size_t i = 0; i < to.size(); ++i) {
              std::copy(from[i].begin(), from[i].end(), to[i].begin());
              if (!checked.contains(model.tensors[i].name)) changed += change_blocks(to[i], block, 1, next);
            }
            t0 = Clock::now();
            p.emplace(publisher.publish(tag, patch_last_tag, tensors_of(to)));
            patch_cur = 1 - patch_cur;
          }
          const double publish_s = seconds_since(t0);
          MPI_Barrier(MPI_COMM_WORLD);
          p->wait_served(2, std::chrono::minutes(5));
          patch_last = std::move(p);
          patch_last_tag = tag;
          const double s = slowest(0);
          double parts[7] = {};
          MPI_Reduce(MPI_IN_PLACE, parts, 7, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
          if (r >= 0)
            std::printf("%s\n", fmt::format(R"({{"round": {}, "case": "patch1", "seconds": {:.4f}, )"
                                            R"("publish_s": {:.4f}, "changed": {}, "load_s": {:.4f}, )"
                                            R"("pause_s": {:.4f}, "written_bytes": {:.0f}, )"
                                            R"("transferred_bytes": {:.0f}, "delta": {:.0f}, "fresh_blocks": {:.0f}, )"
                                            R"("hashed_bytes": {:.0f}}})",
                                            r, s, publish_s, changed, parts[0], parts[1], parts[2], parts[3], parts[4],
                                            parts[5], parts[6])
                                    .c_str());
        } else if (contender == 1) {
          const Clock::time_point t0 = Clock::now();
          auto& mem = ((r + 2) % 2 == 0) ? mem_a : mem_b;
          for (auto& t : mem)
            for (std::size_t o = 0; o < t.size(); o += piece)
              MPI_Bcast(t.data() + o, static_cast<int>(std::min(piece, t.size() - o)), MPI_BYTE, 0, MPI_COMM_WORLD);
          const double s = slowest(seconds_since(t0));
          std::printf("%s\n", fmt::format(R"({{"round": {}, "case": "bcast", "seconds": {:.4f}}})", r, s).c_str());
        } else {
          const double s = slowest(0);
          std::printf("%s\n", fmt::format(R"({{"round": {}, "case": "file", "seconds": {:.4f}}})", r, s).c_str());
        }
        std::fflush(stdout);
      }
    }
    double dummy[14] = {};
    MPI_Reduce(MPI_IN_PLACE, dummy, 14, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    std::printf("%s\n", fmt::format(R"({{"model_bytes": {}, "rank_read_bytes": {:.0f}, "steady_p99_us": {:.1f}, )"
                                    R"("during_p99_us": {:.1f}, "max_pause_us": {:.1f}, "mixed_responses": {:.0f}, )"
                                    R"("publisher_peak_rss_mib": {:.0f}, "subscriber_peak_rss_mib": {:.0f}, )"
                                    R"("inplace_steady_p99_us": {:.1f}, "inplace_during_p99_us": {:.1f}, )"
                                    R"("inplace_max_pause_us": {:.1f}, "inplace_mixed_responses": {:.0f}, )"
                                    R"("patch_steady_p99_us": {:.1f}, "patch_during_p99_us": {:.1f}, )"
                                    R"("patch_max_pause_us": {:.1f}, "patch_mixed_responses": {:.0f}}})",
                                    model.total_bytes, dummy[4], dummy[0], dummy[1], dummy[2], dummy[3], peak_rss_mib(),
                                    dummy[5], dummy[6], dummy[7], dummy[8], dummy[9], dummy[10], dummy[11], dummy[12],
                                    dummy[13])
                            .c_str());
    return 0;
  }

  mpi::Subscriber subscriber(
      live, 0, ctx.get_executor(),
      {.timeout = std::chrono::minutes(2), .budget = std::size_t{256} << 20, .transport = transport});
  mpi::Subscriber subscriber2(live2, 0, ctx.get_executor(),
                              {.timeout = std::chrono::minutes(2),
                               .budget = std::size_t{256} << 20,
                               .transport = mpi::LiveTransport::two_sided});
  cpu::Executor arena(2);
  cpu::MaterializationContext context{arena, cpu::Backend::default_storage()};
  io::SourceOptions file_options;
  std::unique_ptr<io::CheckpointSource> probe = io::CheckpointSource::open(ctx.get_executor(), file_a, file_options);
  const synth::SyntheticModel& m = model;
  engine::TensorParallelPlan plan = engine::plan_tensor_parallel(
      probe->catalog(),
      engine::ShardingRules::llama({.head_dim = m.hidden / m.heads, .heads = m.heads, .kv_heads = m.kv_heads}),
      tp.rank(), tp.size());
  probe.reset();
  Slot slot([&] { return Module::from_tensor_parallel(plan); }, tp,
            {.keep_previous = false, .vote_timeout = std::chrono::minutes(2)});
  const std::string first = plan.tensors.front().parameter, last = plan.tensors.back().parameter;
  Server server([&](std::uint64_t step, std::uint64_t& a, std::uint64_t& b) {
    auto v = slot.version_for_step(step);
    if (!v) return false;
    std::memcpy(&a, v->model.find(first)->value.bytes().data(), 8);
    std::memcpy(&b, v->model.find(last)->value.bytes().data(), 8);
    return true;
  });
  // The in-place slot and its serving thread, only where its contender runs (a model more).
  std::optional<InPlaceSlot> inplace;
  if (only >> 8 & 1) inplace.emplace([&] { return Module::from_tensor_parallel(plan); });
  // A request to an in-place slot, as a server would make it: it enters at once while the gate
  // is open, else waits for the copy (the patch's write) to end.
  const auto in_place_request = [&](std::optional<InPlaceSlot>& in_place) {
    return [&](std::uint64_t, std::uint64_t& a, std::uint64_t& b) {
      std::optional<InPlaceSlot::Reader> entered = in_place->try_read();
      InPlaceSlot::Reader reader = entered ? std::move(*entered) : in_place->async_read(asio::use_future).get();
      std::memcpy(&a, reader.model().find(first)->value.bytes().data(), 8);
      std::memcpy(&b, reader.model().find(last)->value.bytes().data(), 8);
      return true;
    };
  };
  Server inplace_server(in_place_request(inplace));
  for (const synth::SyntheticOptions* o : {&options_a, static_cast<const synth::SyntheticOptions*>(&options_b)}) {
    // The first 8 bytes each rank holds of the two tensors, per version.
    for (auto [name, prefix] : {std::pair{&first, &server.first_prefix}, std::pair{&last, &server.last_prefix}}) {
      const auto it = std::find_if(plan.tensors.begin(), plan.tensors.end(),
                                   [&](const engine::ShardedTensor& t) { return t.parameter == *name; });
      const auto spec = std::find_if(m.tensors.begin(), m.tensors.end(),
                                     [&](const synth::TensorSpec& t) { return t.name == it->key; });
      const std::vector<ByteRun> runs = selection_runs(it->full_shape, it->dtype, it->pieces.front());
      std::vector<std::byte> head(8);
      synth::fill_tensor_bytes(o->seed, *spec, runs.front().source_offset, head);
      std::uint64_t v = 0;
      std::memcpy(&v, head.data(), 8);
      prefix->push_back(v);
    }
  }
  inplace_server.first_prefix = server.first_prefix;
  inplace_server.last_prefix = server.last_prefix;
  // patch1's slot and serving thread, likewise; its versions all keep version A's prefixes.
  std::optional<InPlaceSlot> patched;
  if (only >> 9 & 1) patched.emplace([&] { return Module::from_tensor_parallel(plan); });
  std::string patched_tag;  // the version it serves
  Server patch_server(in_place_request(patched));
  patch_server.first_prefix = server.first_prefix;
  patch_server.last_prefix = server.last_prefix;
  io::Checksums sums[2];
  server.start();
  for (int r = -2; r < rounds; ++r) {
    const int version = (r + 2) % 2;
    if (r == 0 && inplace) inplace_server.start();  // the warm-ups bound a version, then copied one
    if (r == 0 && patched) patch_server.start();    // the warm-ups bound a version, then patched it
    for (int k = 0; k < (r < 0 ? static_cast<int>(warm_up.size()) : contenders); ++k) {
      const int contender = r < 0 ? warm_up[static_cast<std::size_t>(k)] : (r + k) % contenders;
      if (!(only >> contender & 1)) continue;
      MPI_Barrier(MPI_COMM_WORLD);
      if ((contender >= 3 && contender <= 5) || contender == 7) {
        // The base, whole and untimed (the serving thread sees it as steady state).
        MPI_Barrier(MPI_COMM_WORLD);
        std::unique_ptr<mpi::PublishedSource> b = run(ctx, subscriber.async_open("", asio::use_awaitable));
        const std::string base_tag = b->version();
        {
          engine::SwapOptions<Module> o;
          o.checksums = run(ctx, b->async_checksums(plan.bindings, asio::use_awaitable));
          auto f = slot.async_swap(*b, plan.bindings, context, std::move(o), asio::use_future);
          wait(ctx, f);
          b->finish(true);
        }
        MPI_Barrier(MPI_COMM_WORLD);  // the delta is published
        server.updating = true;
        const Clock::time_point t0 = Clock::now();
        std::unique_ptr<mpi::PublishedSource> v = run(ctx, subscriber.async_open("", asio::use_awaitable));
        engine::SwapOptions<Module> o;
        o.checksums = run(ctx, v->async_checksums(plan.bindings, asio::use_awaitable));
        auto serving = slot.current();
        const bool delta =
            v->use_base(base_tag, mpi::base_from_parameters(plan.bindings, [serving](const std::string& name) {
                          return serving->model.find(name)->value.bytes();
                        }));
        mpi::PublishedSource* s = v.get();
        o.canary = [s](const Module&) -> asio::awaitable<void> { co_await s->async_confirm(asio::use_awaitable); };
        auto f = slot.async_swap(*v, plan.bindings, context, std::move(o), asio::use_future);
        const engine::DistributedSwapReport report = wait(ctx, f);
        const double mine = seconds_since(t0);
        server.updating = false;
        v->finish(true);
        serving.reset();
        slowest(mine);
        const double parts[3] = {report.load_s, static_cast<double>(v->transferred_bytes()), delta ? 1.0 : 0.0};
        MPI_Reduce(parts, nullptr, 3, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      } else if (contender == 0 || contender == 6 || contender == 8) {
        // A full version into the double-buffered slot (update, update2) or the in-place one.
        Server& serving_thread = contender == 8 ? inplace_server : server;
        MPI_Barrier(MPI_COMM_WORLD);  // published
        serving_thread.updating = r >= 0;
        const Clock::time_point t0 = Clock::now();
        std::unique_ptr<mpi::PublishedSource> v =
            run(ctx, (contender == 6 ? subscriber2 : subscriber).async_open("", asio::use_awaitable));
        const double open_s = seconds_since(t0);
        engine::SwapOptions<Module> o;
        o.checksums = run(ctx, v->async_checksums(plan.bindings, asio::use_awaitable));
        const double digests_s = seconds_since(t0) - open_s;
        if (contender != 8) sums[version] = o.checksums;
        mpi::PublishedSource* s = v.get();
        o.canary = [s](const Module&) -> asio::awaitable<void> { co_await s->async_confirm(asio::use_awaitable); };
        // load_s, canary_s, then commit_s, or the in-place pause and the staging blocks that came
        // from the system (populated) rather than from the pool.
        double steps[4] = {};
        if (contender == 8) {
          const std::uint64_t fresh_before = context.storage.stats().fresh_allocations;
          auto f = inplace->async_swap(*v, plan.bindings, context, arena, std::move(o), asio::use_future);
          const engine::SwapReport report = wait(ctx, f);
          steps[0] = report.load_s;
          steps[1] = report.canary_s;
          steps[2] = std::chrono::duration<double>(report.publish_pause).count();
          steps[3] = static_cast<double>(context.storage.stats().fresh_allocations - fresh_before);
        } else {
          auto f = slot.async_swap(*v, plan.bindings, context, std::move(o), asio::use_future);
          const engine::DistributedSwapReport report = wait(ctx, f);
          steps[0] = report.load_s;
          steps[1] = report.canary_s;
          steps[2] = report.commit_s;
        }
        const double mine = seconds_since(t0);
        serving_thread.updating = false;
        v->finish(true);
        slowest(mine);
        const double parts[6] = {open_s, digests_s, steps[0], steps[1], steps[2], steps[3]};
        MPI_Reduce(parts, nullptr, contender == 8 ? 6 : 5, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      } else if (contender == 9) {
        // patch1: its first version bound whole (adopted: no copy), then each written as a patch.
        MPI_Barrier(MPI_COMM_WORLD);  // published
        patch_server.updating = r >= 0;
        const Clock::time_point t0 = Clock::now();
        std::unique_ptr<mpi::PublishedSource> v = run(ctx, subscriber.async_open("", asio::use_awaitable));
        engine::SwapOptions<Module> o;
        o.checksums = run(ctx, v->async_checksums(plan.bindings, asio::use_awaitable));
        mpi::PublishedSource* s = v.get();
        o.canary = [s](const Module&) -> asio::awaitable<void> { co_await s->async_confirm(asio::use_awaitable); };
        // load_s, pause_s, written bytes, bytes read, whether a delta, fresh staging blocks, bytes
        // hashed.
        double parts[7] = {};
        const std::uint64_t fresh_before = context.storage.stats().fresh_allocations;
        if (patched->generation() == 0) {
          auto f = patched->async_swap(*v, plan.bindings, context, arena, std::move(o), asio::use_future);
          wait(ctx, f);
        } else {
          // The serving bytes are the base: written only after every read, with the gate closed.
          std::map<std::string, std::span<const std::byte>> held;
          if (std::optional<InPlaceSlot::Reader> reader = patched->try_read())
            for (const engine::ShardedTensor& t : plan.tensors)
              held[t.parameter] = reader->model().find(t.parameter)->value.bytes();
          const bool delta =
              v->use_base(patched_tag, mpi::base_from_parameters(plan.bindings, [&held](const std::string& name) {
                            const auto it = held.find(name);
                            return it == held.end() ? std::span<const std::byte>{} : it->second;
                          }));
          auto f =
              patched->async_patch(*v, plan.bindings, arena, std::move(o), {.budget = patch_budget}, asio::use_future);
          const engine::SwapReport report = wait(ctx, f);
          parts[0] = report.load_s;
          parts[1] = std::chrono::duration<double>(report.publish_pause).count();
          parts[2] = static_cast<double>(report.written_bytes);
          parts[3] = static_cast<double>(v->transferred_bytes());
          parts[4] = delta ? 1.0 : 0.0;
          parts[6] = static_cast<double>(report.hashed_bytes);
        }
        parts[5] = static_cast<double>(context.storage.stats().fresh_allocations - fresh_before);
        patched_tag = v->version();
        const double mine = seconds_since(t0);
        patch_server.updating = false;
        v->finish(true);
        slowest(mine);
        MPI_Reduce(parts, nullptr, 7, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      } else if (contender == 1) {
        const Clock::time_point t0 = Clock::now();
        for (const synth::TensorSpec& t : model.tensors) {
          const std::uint64_t n = synth::tensor_nbytes(t);
          for (std::uint64_t o = 0; o < n; o += piece)
            MPI_Bcast(bcast_buffer.data(), static_cast<int>(std::min<std::uint64_t>(piece, n - o)), MPI_BYTE, 0,
                      MPI_COMM_WORLD);
        }
        slowest(seconds_since(t0));
      } else {
        // The same digests as the update of this version (from the warm-up).
        server.updating = true;
        const Clock::time_point t0 = Clock::now();
        auto source = io::CheckpointSource::open(ctx.get_executor(), version == 0 ? file_a : file_b, file_options);
        engine::SwapOptions<Module> o;
        o.checksums = sums[version];
        auto f = slot.async_swap(*source, plan.bindings, context, std::move(o), asio::use_future);
        wait(ctx, f);
        const double mine = seconds_since(t0);
        server.updating = false;
        slowest(mine);
      }
    }
  }
  for (Server* s : {&server, &inplace_server, &patch_server}) {
    s->stop = true;
    if (s->thread.joinable()) s->thread.join();
  }
  double mine[14] = {quantile(server.steady_us, 0.99),         quantile(server.during_us, 0.99),
                     quantile(server.during_us, 1.0),          static_cast<double>(server.mixed),
                     static_cast<double>(plan.read_bytes),     peak_rss_mib(),
                     quantile(inplace_server.steady_us, 0.99), quantile(inplace_server.during_us, 0.99),
                     quantile(inplace_server.during_us, 1.0),  static_cast<double>(inplace_server.mixed),
                     quantile(patch_server.steady_us, 0.99),   quantile(patch_server.during_us, 0.99),
                     quantile(patch_server.during_us, 1.0),    static_cast<double>(patch_server.mixed)};
  MPI_Reduce(mine, nullptr, 14, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  std::fprintf(stderr, "rank %d: %llu responses, plan reads %llu bytes\n", rank,
               static_cast<unsigned long long>(server.responses), static_cast<unsigned long long>(plan.read_bytes));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_bench(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "live_update: %s\n", e.what());
    return 1;
  }
}
