// Collectives benchmark (bench/distributed.sh runs it under mpirun): eredu's all_reduce and
// all_gather (engine::async_all_reduce / async_all_gather<mpi::Backend>, the public API, each
// awaited through a future) against the same MPI calls in a plain blocking loop
// (MPI_Allreduce in place, MPI_Allgather into a preallocated buffer) on the same
// communicator's ranks, at each size. Each round starts with the next variant.
//
//   mpirun -np N collectives_bench [ROUNDS] [MIB...]     (defaults: 7 rounds; 1 4 16 64 MiB)
//
// Rank 0 prints one line per measurement, "<op> <MiB> <variant> round <r> <seconds per call>
// <GB/s>", then per op and size the medians (min-max) of each variant and the ratios. GB/s is
// the tensor's bytes per call over the seconds per call (nccl-tests' "algorithm bandwidth").
// Besides the blocking calls, MPI_Iallreduce / MPI_Iallgather + MPI_Wait (what eredu starts,
// on its progress thread) separate eredu's own overhead from the non-blocking algorithms'.
// Values are zeros: sums in place stay finite however many calls. For all_gather a third loop,
// MPI_Allgather into a new output tensor per call as eredu's returns one, separates the cost
// of that allocation from the collective's; and eredu_into, engine::async_all_gather_into into
// one output allocated before the timed loops (a recycled output), is eredu without it.
// EREDU_BENCH_IDLE_SPIN_US sets mpi::ProgressOptions::idle_spin (default 200).
#include <mpi.h>

#include <algorithm>
#include <asio/use_future.hpp>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "eredu/cpu/backend.hpp"
#include "eredu/engine/backend/collective_backend.hpp"
#include "eredu/mpi/backend.hpp"
#include "eredu/mpi/communicator.hpp"
#include "eredu/mpi/environment.hpp"

using namespace eredu;
using Clock = std::chrono::steady_clock;

namespace {

/// Median, min and max of a list of samples.
struct Summary {
  double median = 0, min = 0, max = 0;
};

Summary summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return {n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v.front(), v.back()};
}

/// Calls per timed loop: enough calls that the small sizes run for tens of milliseconds.
int calls_for(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>((std::size_t{128} << 20) / bytes, 4, 128));
}

/// Seconds per call of `calls` calls of `op`, from a common start (a barrier) on every rank.
template <class Op>
double time_calls(MPI_Comm comm, int calls, Op&& op) {
  MPI_Barrier(comm);
  const auto t0 = Clock::now();
  for (int i = 0; i < calls; ++i) op();
  // The slowest rank's time: a call completes on one rank before it has on the others.
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, comm);
  return seconds / calls;
}

}  // namespace

int main(int argc, char** argv) {
  // The plain MPI loop calls MPI from this thread while eredu's progress thread exists.
  mpi::ProgressOptions progress;
  // EREDU_BENCH_IDLE_SPIN_US=0 measures the progress thread as it was before its idle spin.
  if (const char* v = std::getenv("EREDU_BENCH_IDLE_SPIN_US"))
    progress.idle_spin = std::chrono::microseconds(std::atol(v));
  mpi::Environment env(argc, argv, {.required = mpi::ThreadLevel::multiple, .progress = progress});
  int rounds = 7;
  std::vector<std::size_t> mibs = {1, 4, 16, 64};
  if (argc > 1) rounds = std::max(1, std::atoi(argv[1]));
  if (argc > 2) {
    mibs.clear();
    for (int i = 2; i < argc; ++i) mibs.push_back(static_cast<std::size_t>(std::max(1, std::atoi(argv[i]))));
  }
  int rc = 0;
  {
    mpi::Communicator world = mpi::Communicator::world(env);
    // The MPI loop runs on its own duplicate, so its traffic never matches eredu's.
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    const int rank = world.rank(), size = world.size();
    cpu::Executor arena(1);
    // One measured variant: its name and one call.
    struct Variant {
      std::string name;
      std::function<void()> call;
    };
    struct Row {
      std::string op;
      std::size_t mib;
      std::map<std::string, std::vector<double>> gb_per_s;  // by variant, one per round
    };
    std::vector<Row> rows;
    for (const char* op : {"all_reduce", "all_gather"}) {
      const bool reduce = std::string(op) == "all_reduce";
      for (std::size_t mib : mibs) {
        const std::size_t bytes = mib << 20;
        const int calls = calls_for(bytes);
        const int n = static_cast<int>(reduce ? bytes / 4 : bytes);
        // eredu: an F32 tensor (reduce) or U8 bytes (gather), the result fed back in.
        cpu::Tensor t = reduce ? cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::F32, {bytes / 4})
                               : cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::U8, {bytes});
        std::memset(t.mutable_bytes().data(), 0, bytes);
        std::vector<float> plain(bytes / 4, 0.0f);
        std::vector<std::byte> gathered(bytes * static_cast<std::size_t>(size));
        // eredu_into's output: allocated (and first touched by the warm-up) once, outside the timing.
        cpu::Tensor recycled = reduce ? cpu::Tensor{}
                                      : cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::U8,
                                                              {bytes * static_cast<std::size_t>(size)});
        std::vector<Variant> variants;
        variants.push_back({"eredu", [&] {
                              if (reduce)
                                t = engine::async_all_reduce<mpi::Backend>(arena, world, std::move(t),
                                                                           engine::ReduceOp::sum, asio::use_future)
                                        .get();
                              else
                                engine::async_all_gather<mpi::Backend>(arena, world, t, asio::use_future).get();
                            }});
        variants.push_back({"mpi", [&] {
                              if (reduce)
                                MPI_Allreduce(MPI_IN_PLACE, plain.data(), n, MPI_FLOAT, MPI_SUM, comm);
                              else
                                MPI_Allgather(t.bytes().data(), n, MPI_BYTE, gathered.data(), n, MPI_BYTE, comm);
                            }});
        // What eredu calls: the non-blocking collective (OpenMPI's libnbc algorithms, not the
        // blocking ones' tuned ones), here waited for by this thread.
        variants.push_back({"mpi_nonblocking", [&] {
                              MPI_Request request = MPI_REQUEST_NULL;
                              if (reduce)
                                MPI_Iallreduce(MPI_IN_PLACE, plain.data(), n, MPI_FLOAT, MPI_SUM, comm, &request);
                              else
                                MPI_Iallgather(t.bytes().data(), n, MPI_BYTE, gathered.data(), n, MPI_BYTE, comm,
                                               &request);
                              MPI_Wait(&request, MPI_STATUS_IGNORE);
                            }});
        // eredu's gather returns a new tensor per call (from the CPU backend's default
        // storage): the blocking call into a fresh tensor tells that cost apart.
        if (!reduce)
          variants.push_back({"mpi_fresh_output", [&] {
                                cpu::Tensor out = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::U8,
                                                                        {bytes * static_cast<std::size_t>(size)});
                                MPI_Allgather(t.bytes().data(), n, MPI_BYTE, out.mutable_bytes().data(), n, MPI_BYTE,
                                              comm);
                              }});
        // eredu's gather into the caller's output, the same one every call (what a step that
        // gathers each iteration does with all_gather_into).
        if (!reduce)
          variants.push_back(
              {"eredu_into", [&] {
                 engine::async_all_gather_into<mpi::Backend>(arena, world, t, recycled, asio::use_future).get();
               }});
        for (int w = 0; w < 2; ++w)  // warm-up: connections, first touches, allocator
          for (Variant& v : variants) v.call();
        Row row{op, mib, {}};
        for (int r = 0; r < rounds; ++r) {
          // Each round starts with the next variant: none always follows the same one.
          for (std::size_t i = 0; i < variants.size(); ++i) {
            Variant& v = variants[(i + static_cast<std::size_t>(r)) % variants.size()];
            const double seconds = time_calls(comm, calls, v.call);
            row.gb_per_s[v.name].push_back(static_cast<double>(bytes) / seconds / 1e9);
            if (rank == 0)
              fmt::print("{} {} {} round {} {:.6f} {:.3f}\n", op, mib, v.name, r, seconds, row.gb_per_s[v.name].back());
          }
        }
        rows.push_back(std::move(row));
      }
    }
    if (rank == 0) {
      auto text = [](const std::vector<double>& v) {
        if (v.empty()) return std::string("-");
        const Summary s = summarize(v);
        return fmt::format("{:.2f} ({:.2f}-{:.2f})", s.median, s.min, s.max);
      };
      auto ratio = [](const std::vector<double>& a, const std::vector<double>& b) {
        std::vector<double> q;
        for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) q.push_back(a[i] / b[i]);
        return q;
      };
      fmt::print("\n{} ranks, {} rounds; GB/s per call, median (min-max); ratios of the same round\n", size, rounds);
      fmt::print("{:<11} {:>4}  {:<20} {:<20} {:<18} {:<20} {:<18} {:<24} {:<20} {}\n", "op", "MiB", "eredu",
                 "MPI blocking", "eredu/blocking", "MPI non-blocking", "eredu/non-block.", "MPI into a fresh output",
                 "eredu into recycled", "into/blocking");
      for (Row& row : rows) {
        auto& g = row.gb_per_s;
        fmt::print("{:<11} {:>4}  {:<20} {:<20} {:<18} {:<20} {:<18} {:<24} {:<20} {}\n", row.op, row.mib,
                   text(g["eredu"]), text(g["mpi"]), text(ratio(g["eredu"], g["mpi"])), text(g["mpi_nonblocking"]),
                   text(ratio(g["eredu"], g["mpi_nonblocking"])), text(g["mpi_fresh_output"]), text(g["eredu_into"]),
                   text(ratio(g["eredu_into"], g["mpi"])));
      }
    }
    MPI_Comm_free(&comm);
  }
  return rc;
}
