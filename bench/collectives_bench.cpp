// Collectives benchmark (bench/distributed.sh runs it under mpirun): eredu's all_reduce and
// all_gather (engine::async_all_reduce / async_all_gather<mpi::Backend>, the public API, each
// awaited through a future) against the same MPI calls in a plain blocking loop
// (MPI_Allreduce in place, MPI_Allgather into a preallocated buffer) on the same
// communicator's ranks, at each size. Rounds alternate which of the two goes first.
//
//   mpirun -np N collectives_bench [ROUNDS] [MIB...]     (defaults: 7 rounds; 1 4 16 64 MiB)
//
// Rank 0 prints one line per measurement, "<op> <MiB> <eredu|mpi> round <r> <seconds per
// call> <GB/s>", then per op and size the medians (min-max) of both and their ratio. GB/s is
// the tensor's bytes per call over the seconds per call (nccl-tests' "algorithm bandwidth").
// Values are zeros: sums in place stay finite however many calls. For all_gather a third loop,
// MPI_Allgather into a new output tensor per call as eredu's returns one, separates the cost
// of that allocation from the collective's.
#include <mpi.h>

#include <algorithm>
#include <asio/use_future.hpp>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "eredu/cpu/backend.hpp"
#include "eredu/engine/collective_backend.hpp"
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
  mpi::Environment env(argc, argv, {.required = mpi::ThreadLevel::multiple, .progress = {}});
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
    struct Row {
      std::string op;
      std::size_t mib;
      std::vector<double> eredu, mpi, mpi_fresh;
    };
    std::vector<Row> rows;
    for (const char* op : {"all_reduce", "all_gather"}) {
      const bool reduce = std::string(op) == "all_reduce";
      for (std::size_t mib : mibs) {
        const std::size_t bytes = mib << 20;
        const int calls = calls_for(bytes);
        Row row{op, mib, {}, {}, {}};
        // eredu: an F32 tensor (reduce) or U8 bytes (gather), the result fed back in.
        cpu::Tensor t = reduce ? cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::F32, {bytes / 4})
                               : cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::U8, {bytes});
        std::memset(t.mutable_bytes().data(), 0, bytes);
        std::vector<float> plain(bytes / 4, 0.0f);
        std::vector<std::byte> gathered(bytes * static_cast<std::size_t>(size));
        auto eredu_call = [&] {
          if (reduce) {
            t = engine::async_all_reduce<mpi::Backend>(arena, world, std::move(t), engine::ReduceOp::sum,
                                                       asio::use_future)
                    .get();
          } else {
            engine::async_all_gather<mpi::Backend>(arena, world, t, asio::use_future).get();
          }
        };
        auto mpi_call = [&] {
          if (reduce)
            MPI_Allreduce(MPI_IN_PLACE, plain.data(), static_cast<int>(plain.size()), MPI_FLOAT, MPI_SUM, comm);
          else
            MPI_Allgather(t.bytes().data(), static_cast<int>(bytes), MPI_BYTE, gathered.data(), static_cast<int>(bytes),
                          MPI_BYTE, comm);
        };
        // What eredu's gather does besides MPI's: a new output tensor per call (from the CPU
        // backend's default storage, as the API returns it). The plain loop into a fresh tensor
        // tells that cost apart from the collective's.
        auto mpi_fresh_call = [&] {
          cpu::Tensor out = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::U8,
                                                  {bytes * static_cast<std::size_t>(size)});
          MPI_Allgather(t.bytes().data(), static_cast<int>(bytes), MPI_BYTE, out.mutable_bytes().data(),
                        static_cast<int>(bytes), MPI_BYTE, comm);
        };
        for (int w = 0; w < 2; ++w) {  // warm-up: connections, first touches, allocator
          eredu_call();
          mpi_call();
          if (!reduce) mpi_fresh_call();
        }
        for (int r = 0; r < rounds; ++r) {
          double e = 0, m = 0;
          if (r % 2 == 0) {
            e = time_calls(comm, calls, eredu_call);
            m = time_calls(comm, calls, mpi_call);
          } else {
            m = time_calls(comm, calls, mpi_call);
            e = time_calls(comm, calls, eredu_call);
          }
          if (!reduce) {
            const double f = time_calls(comm, calls, mpi_fresh_call);
            row.mpi_fresh.push_back(static_cast<double>(bytes) / f / 1e9);
            if (rank == 0)
              fmt::print("{} {} mpi_fresh_output round {} {:.6f} {:.3f}\n", op, mib, r, f, row.mpi_fresh.back());
          }
          row.eredu.push_back(static_cast<double>(bytes) / e / 1e9);
          row.mpi.push_back(static_cast<double>(bytes) / m / 1e9);
          if (rank == 0) {
            fmt::print("{} {} eredu round {} {:.6f} {:.3f}\n", op, mib, r, e, row.eredu.back());
            fmt::print("{} {} mpi round {} {:.6f} {:.3f}\n", op, mib, r, m, row.mpi.back());
          }
        }
        rows.push_back(std::move(row));
      }
    }
    if (rank == 0) {
      fmt::print("\n{} ranks, {} rounds; GB/s per call, median (min-max)\n", size, rounds);
      fmt::print("{:<11} {:>5}  {:<22} {:<22} {:<18} {}\n", "op", "MiB", "eredu", "MPI", "eredu/MPI",
                 "MPI into a fresh output tensor");
      for (const Row& row : rows) {
        const Summary e = summarize(row.eredu), m = summarize(row.mpi);
        std::vector<double> ratios;
        for (std::size_t i = 0; i < row.eredu.size(); ++i) ratios.push_back(row.eredu[i] / row.mpi[i]);
        const Summary q = summarize(ratios);
        std::string fresh = "-";
        if (!row.mpi_fresh.empty()) {
          const Summary f = summarize(row.mpi_fresh);
          fresh = fmt::format("{:.2f} ({:.2f}-{:.2f})", f.median, f.min, f.max);
        }
        fmt::print("{:<11} {:>5}  {:<22} {:<22} {:<18} {}\n", row.op, row.mib,
                   fmt::format("{:.2f} ({:.2f}-{:.2f})", e.median, e.min, e.max),
                   fmt::format("{:.2f} ({:.2f}-{:.2f})", m.median, m.min, m.max),
                   fmt::format("{:.2f} ({:.2f}-{:.2f})", q.median, q.min, q.max), fresh);
      }
    }
    MPI_Comm_free(&comm);
  }
  return rc;
}
