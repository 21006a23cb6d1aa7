// eredu::nccl under mpirun (-np 1 and 2): NCCL's dtypes and their refusal, error text, empty and
// impossible communicators — everywhere eredu_nccl builds, no device needed — and, where every
// rank has a CUDA device of its own: every dtype and reduction against an exact reference,
// gathers (into a new or a recycled output) and exchanges in rank order, two collectives in
// stream order, refusals with a real group, and a collective or a creation a peer never joins,
// which fails within the timeout, typed, and leaves the communicator aborted. Also a trainer's
// device tensor offered to a live-update subscriber (nccl::published_tensor), where the
// publisher's rank has a device.

#include <cuda_runtime_api.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <bit>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/collective_error.hpp"
#include "eredu/core/float_formats.hpp"
#include "eredu/cuda/device.hpp"
#include "eredu/cuda/executor.hpp"
#include "eredu/engine/backend/collective_backend.hpp"
#include "eredu/mpi/published_source.hpp"
#include "eredu/mpi/publisher.hpp"
#include "eredu/nccl/backend.hpp"
#include "eredu/nccl/communicator.hpp"
#include "eredu/nccl/data_type.hpp"
#include "eredu/nccl/nccl_error.hpp"
#include "eredu/nccl/published_tensor.hpp"
#include "nccl/nccl_fixture.hpp"
#include "support/error_kind.hpp"

using namespace eredu;
using engine::ReduceOp;
using test::mpi_world;

namespace {

constexpr std::size_t kElements = 1037;  // not a power of two: no algorithm's sweet spot only

/// The dtypes NCCL reduces (docs/distributed.md).
const std::vector<DType> reducible = {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I8,
                                      DType::U8,  DType::I32, DType::U32,  DType::I64, DType::U64};

/// An environment variable as an int, or `fallback`.
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

/// This rank's index among the ranks of its host, and their number (OpenMPI's, MPICH's and
/// Slurm's variables; without them every rank counts as on one host).
int local_rank() {
  return env_int("OMPI_COMM_WORLD_LOCAL_RANK",
                 env_int("MPI_LOCALRANKID", env_int("SLURM_LOCALID", mpi_world().rank())));
}
int local_size() { return env_int("OMPI_COMM_WORLD_LOCAL_SIZE", env_int("MPI_LOCALNRANKS", mpi_world().size())); }

/// Why the device cases cannot run here, or "" — decided by every rank together (an
/// all-gather of each rank's answer), so that no rank starts a collective the others skip.
const std::string& gpu_skip_reason() {
  static const std::string reason = [] {
    std::string mine;
    const int devices = cuda::device_count();
    if (devices == 0)
      mine = fmt::format("no CUDA device ({})", cuda::no_device_reason());
    else if (devices < local_size())
      mine = fmt::format("{} CUDA device(s) for {} ranks on this host: NCCL needs a device of its own per rank",
                         devices, local_size());
    auto [all, done] = mpi_world().all_gather_bytes({std::byte{mine.empty() ? std::uint8_t{1} : std::uint8_t{0}}});
    done.get();
    if (!mine.empty()) return mine;
    for (std::size_t r = 0; r < all->size(); ++r)
      if ((*all)[r] != std::byte{1}) return fmt::format("rank {} has no CUDA device of its own", r);
    return std::string();
  }();
  return reason;
}

// Skips the rest of a test case, with the reason in the report, unless every rank has a device.
#define EREDU_REQUIRE_GPU_PER_RANK()           \
  do {                                         \
    if (!gpu_skip_reason().empty()) {          \
      WARN(gpu_skip_reason() << ": skipping"); \
      return;                                  \
    }                                          \
  } while (false)

int my_device() { return local_rank() % cuda::device_count(); }

/// Rank `r`'s value at element `i`: small integers and halves, so that every sum is exact in
/// every float format (the reference needs no tolerance) and min/max pick different ranks.
double value(DType dtype, int r, std::size_t i) {
  const auto k = static_cast<double>((i * 7 + static_cast<std::size_t>(r) * 3 + i / 13) % 11);
  switch (dtype) {
    case DType::U8:
    case DType::U32:
    case DType::U64:
      return k;
    case DType::I8:
    case DType::I32:
    case DType::I64:
      return k - 5;
    default:
      return (k - 5) * 0.5;
  }
}

/// Writes `v` as element `i` of `dtype` into `out`.
void store(DType dtype, std::byte* out, std::size_t i, double v) {
  auto put = [&](auto x) { std::memcpy(out + i * sizeof(x), &x, sizeof(x)); };
  switch (dtype) {
    case DType::F64:
      return put(v);
    case DType::F32:
      return put(static_cast<float>(v));
    case DType::BF16:
      return put(formats::f32_to_bf16(std::bit_cast<std::uint32_t>(static_cast<float>(v))));
    case DType::F16:
      return put(formats::f32_to_f16(std::bit_cast<std::uint32_t>(static_cast<float>(v))));
    case DType::I8:
      return put(static_cast<std::int8_t>(v));
    case DType::U8:
      return put(static_cast<std::uint8_t>(v));
    case DType::I32:
      return put(static_cast<std::int32_t>(v));
    case DType::U32:
      return put(static_cast<std::uint32_t>(v));
    case DType::I64:
      return put(static_cast<std::int64_t>(v));
    case DType::U64:
      return put(static_cast<std::uint64_t>(v));
    default:
      FAIL("no store for " << dtype_name(dtype));
  }
}

std::vector<std::byte> host_values(DType dtype, int r, std::size_t n) {
  std::vector<std::byte> out(n * dtype_bits(dtype) / 8);
  for (std::size_t i = 0; i < n; ++i) store(dtype, out.data(), i, value(dtype, r, i));
  return out;
}

/// The reduction over every rank of `size`, element by element, in exact arithmetic.
std::vector<std::byte> reference(DType dtype, ReduceOp op, int size) {
  std::vector<std::byte> out(kElements * dtype_bits(dtype) / 8);
  for (std::size_t i = 0; i < kElements; ++i) {
    double acc = value(dtype, 0, i);
    for (int r = 1; r < size; ++r) {
      const double v = value(dtype, r, i);
      acc = op == ReduceOp::sum ? acc + v : op == ReduceOp::min ? std::min(acc, v) : std::max(acc, v);
    }
    store(dtype, out.data(), i, acc);
  }
  return out;
}

/// A device tensor holding `bytes` (copied synchronously: the test's own setup).
cuda::Tensor upload(cuda::Executor& ex, DType dtype, Shape shape, const std::vector<std::byte>& bytes) {
  cuda::Tensor t =
      cuda::Tensor::allocate(cuda::Backend::default_memory(ex.device()), dtype, std::move(shape), ex.shared_stream());
  REQUIRE(t.nbytes() == bytes.size());
  REQUIRE(cudaMemcpyAsync(t.data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice, ex.stream()) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(ex.stream()) == cudaSuccess);
  return t;
}

/// The bytes of a device tensor whose writers have completed.
std::vector<std::byte> download(const cuda::Tensor& t) {
  std::vector<std::byte> out(t.nbytes());
  REQUIRE(cudaMemcpy(out.data(), t.data(), out.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
  return out;
}

/// The future's value, or its failure rethrown; fails the test after `limit` instead of hanging.
template <class T>
T get_within(std::future<T>& future, std::chrono::milliseconds limit = std::chrono::seconds(60)) {
  if (future.wait_for(limit) != std::future_status::ready)
    throw std::runtime_error(fmt::format("no completion within {} ms", limit.count()));
  return future.get();
}

/// Runs `ctx` until `future` is ready (its work completes on MPI's progress thread), then its
/// value or failure; fails the test after `limit` instead of hanging.
template <class T>
T run_within(asio::io_context& ctx, std::future<T>& future,
             std::chrono::milliseconds limit = std::chrono::seconds(60)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (future.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error(fmt::format("no completion within {} ms", limit.count()));
    ctx.restart();
    ctx.run_one_for(std::chrono::milliseconds(5));
  }
  return future.get();
}

nccl::Communicator make_group(const char* name, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  return nccl::Communicator::create(mpi_world(), my_device(), name, {.timeout = timeout});
}

}  // namespace

TEST_CASE("nccl – NCCL reduces its own dtypes and refuses every other one before anything starts", "[nccl]") {
  STATIC_REQUIRE(engine::CollectiveBackend<nccl::Backend>);
  STATIC_REQUIRE(engine::GatherIntoBackend<nccl::Backend>);
  STATIC_REQUIRE(!std::is_copy_constructible_v<nccl::Communicator>);
  STATIC_REQUIRE(std::is_nothrow_move_constructible_v<nccl::Communicator>);
  for (std::size_t i = 0; i < dtype_count; ++i) {
    const auto dtype = static_cast<DType>(i);
    const bool ok = std::find(reducible.begin(), reducible.end(), dtype) != reducible.end();
    INFO(dtype_name(dtype));
    CHECK(nccl::reduce_data_type(dtype).has_value() == ok);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::min, ReduceOp::max}) {
      if (ok) {
        CHECK(nccl::require_reducible(dtype, op) == *nccl::reduce_data_type(dtype));
        continue;
      }
      try {
        (void)nccl::require_reducible(dtype, op);
        FAIL("expected a refusal");
      } catch (const Error& e) {
        CHECK(e.kind() == errc::invalid_argument);
        CHECK_THAT(e.what(), Catch::Contains(std::string(dtype_name(dtype))) &&
                                 Catch::Contains(engine::reduce_op_name(op)) && Catch::Contains("NCCL reduces only"));
      }
    }
  }
  CHECK(nccl::reduce_data_type(DType::BF16) == ncclBfloat16);
  CHECK(nccl::reduce_data_type(DType::U64) == ncclUint64);
  CHECK(nccl::reduce_op(ReduceOp::sum) == ncclSum);
  CHECK(nccl::reduce_op(ReduceOp::min) == ncclMin);
  CHECK(nccl::reduce_op(ReduceOp::max) == ncclMax);
}

TEST_CASE("nccl – a failed NCCL call is described by the call, NCCL's result and its text", "[nccl]") {
  const std::string text = nccl::nccl_error_text(ncclInvalidUsage, "ncclAllReduce");
  CHECK_THAT(text, Catch::StartsWith("ncclAllReduce failed: ncclInvalidUsage (") && Catch::Contains("NCCL error 5"));
  CHECK(std::string(nccl::result_name(ncclRemoteError)) == "ncclRemoteError");
  CHECK(std::string(nccl::result_name(static_cast<ncclResult_t>(99))) == "ncclResult (unknown)");
}

TEST_CASE("nccl – an empty communicator reports nothing, and an empty bootstrap is refused", "[nccl]") {
  nccl::Communicator none;
  CHECK_FALSE(none.valid());
  CHECK(none.rank() == -1);
  CHECK(none.size() == 0);
  CHECK(none.device() == -1);
  CHECK(none.name().empty());
  CHECK_FALSE(none.usable());
  CHECK(none.native() == nullptr);
  none.abort("nothing to abort");  // a no-op
  nccl::Communicator moved = std::move(none);
  CHECK_FALSE(moved.valid());

  mpi::Communicator empty;
  try {
    (void)nccl::Communicator::create(empty, 0);
    FAIL("expected a refusal");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("empty MPI communicator"));
  }
}

TEST_CASE("nccl – a communicator on a device that does not exist fails typed, on every rank, at once", "[nccl]") {
  // Every rank fails before the exchange, so none waits for the others.
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(nccl::Communicator::create(mpi_world(), 4096, "nowhere"), BackendError);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  auto b = mpi_world().async_barrier(asio::use_future);
  get_within(b);
}

TEST_CASE("nccl – every dtype and reduction all-reduces to the exact reference", "[nccl][gpu]") {
  EREDU_REQUIRE_GPU_PER_RANK();
  cuda::DeviceGuard guard(my_device());
  nccl::Communicator group = make_group("reduce");
  CHECK(group.rank() == mpi_world().rank());
  CHECK(group.size() == mpi_world().size());
  CHECK(group.device() == my_device());
  CHECK(group.usable());
  cuda::Executor ex(my_device());
  for (DType dtype : reducible) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::min, ReduceOp::max}) {
      INFO(dtype_name(dtype) << " " << engine::reduce_op_name(op));
      cuda::Tensor t = upload(ex, dtype, {kElements}, host_values(dtype, group.rank(), kElements));
      auto f = engine::async_all_reduce<nccl::Backend>(ex, group, t, op, asio::use_future);
      const cuda::Tensor out = get_within(f);
      CHECK(out.shares_storage_with(t));  // in place
      CHECK(download(out) == reference(dtype, op, group.size()));
    }
  }
}

TEST_CASE("nccl – collectives run in stream order after the executor's work", "[nccl][gpu]") {
  EREDU_REQUIRE_GPU_PER_RANK();
  cuda::DeviceGuard guard(my_device());
  nccl::Communicator group = make_group("order");
  cuda::Executor ex(my_device());
  const int n = group.size();
  std::vector<std::byte> ones(64 * sizeof(float));
  for (std::size_t i = 0; i < 64; ++i) store(DType::F32, ones.data(), i, static_cast<double>(group.rank() + 1));
  cuda::Tensor t = upload(ex, DType::F32, {64}, ones);
  // Two reductions of the same tensor, submitted back to back: the second sees the first's sum.
  auto first = engine::async_all_reduce<nccl::Backend>(ex, group, t, ReduceOp::sum, asio::use_future);
  auto second = engine::async_all_reduce<nccl::Backend>(ex, group, t, ReduceOp::sum, asio::use_future);
  (void)get_within(first);
  const cuda::Tensor out = get_within(second);
  std::vector<std::byte> want(64 * sizeof(float));
  for (std::size_t i = 0; i < 64; ++i) store(DType::F32, want.data(), i, static_cast<double>(n * (n * (n + 1) / 2)));
  CHECK(download(out) == want);
}

TEST_CASE("nccl – all_gather concatenates every rank's tensor along dim 0 in rank order", "[nccl][gpu]") {
  EREDU_REQUIRE_GPU_PER_RANK();
  cuda::DeviceGuard guard(my_device());
  nccl::Communicator group = make_group("gather");
  cuda::Executor ex(my_device());
  const int n = group.size();
  cuda::Tensor t = upload(ex, DType::BF16, {3, 5}, host_values(DType::BF16, group.rank(), 15));
  auto f = engine::async_all_gather<nccl::Backend>(ex, group, t, asio::use_future);
  const cuda::Tensor out = get_within(f);
  CHECK(out.shape() == Shape{static_cast<std::uint64_t>(3 * n), 5});
  std::vector<std::byte> want;
  for (int r = 0; r < n; ++r) {
    const std::vector<std::byte> part = host_values(DType::BF16, r, 15);
    want.insert(want.end(), part.begin(), part.end());
  }
  CHECK(download(out) == want);
}

TEST_CASE("nccl – all_gather_into writes the gather into the caller's output, recycled across calls", "[nccl][gpu]") {
  EREDU_REQUIRE_GPU_PER_RANK();
  cuda::DeviceGuard guard(my_device());
  nccl::Communicator group = make_group("gather_into");
  cuda::Executor ex(my_device());
  const int n = group.size();
  cuda::Tensor out = cuda::Tensor::allocate(cuda::Backend::default_memory(ex.device()), DType::BF16,
                                            {static_cast<std::uint64_t>(3 * n), 5}, ex.shared_stream());
  for (int k = 0; k < 3; ++k) {
    INFO("call " << k);
    // Rank r's values in call k are rank r + k's: each call's gather differs from the last.
    cuda::Tensor t = upload(ex, DType::BF16, {3, 5}, host_values(DType::BF16, group.rank() + k, 15));
    auto f = engine::async_all_gather_into<nccl::Backend>(ex, group, t, out, asio::use_future);
    const cuda::Tensor got = get_within(f);
    CHECK(got.shares_storage_with(out));
    std::vector<std::byte> want;
    for (int r = 0; r < n; ++r) {
      const std::vector<std::byte> part = host_values(DType::BF16, r + k, 15);
      want.insert(want.end(), part.begin(), part.end());
    }
    CHECK(download(out) == want);
  }
  // A wrong shape, a wrong dtype and an input sharing the output's storage (unless a group of
  // one, where the input is rank 0's block, the whole output) are refused before anything starts.
  cuda::Tensor t = upload(ex, DType::BF16, {3, 5}, host_values(DType::BF16, group.rank(), 15));
  cuda::Tensor wrong_shape = cuda::Tensor::allocate(cuda::Backend::default_memory(ex.device()), DType::BF16,
                                                    {static_cast<std::uint64_t>(3 * n + 1), 5}, ex.shared_stream());
  cuda::Tensor wrong_dtype = cuda::Tensor::allocate(cuda::Backend::default_memory(ex.device()), DType::F16,
                                                    {static_cast<std::uint64_t>(3 * n), 5}, ex.shared_stream());
  CHECK_THROWS_AS(nccl::Backend::all_gather_into(ex, group, t, wrong_shape), Error);
  CHECK_THROWS_AS(nccl::Backend::all_gather_into(ex, group, t, wrong_dtype), Error);
  if (n > 1) {
    CHECK_THROWS_AS(nccl::Backend::all_gather_into(ex, group, out, out), Error);
  } else {
    auto f = engine::async_all_gather_into<nccl::Backend>(ex, group, t, t, asio::use_future);  // in place
    CHECK(download(get_within(f)) == host_values(DType::BF16, 0, 15));
  }
  CHECK(group.usable());
}

TEST_CASE("nccl – all_to_all sends block j to rank j and returns the received blocks in rank order", "[nccl][gpu]") {
  EREDU_REQUIRE_GPU_PER_RANK();
  cuda::DeviceGuard guard(my_device());
  nccl::Communicator group = make_group("exchange");
  cuda::Executor ex(my_device());
  const int n = group.size();
  const int me = group.rank();
  constexpr std::size_t rows_per_block = 3, cols = 7;
  // Element (j, i) of rank r's block j is r * 1000 + j * 100 + i: who sent it, to whom, where.
  auto block_value = [](int from, int to, std::size_t i) {
    return static_cast<std::int32_t>(from * 1000 + to * 100 + i);
  };
  std::vector<std::byte> mine(static_cast<std::size_t>(n) * rows_per_block * cols * sizeof(std::int32_t));
  for (int j = 0; j < n; ++j)
    for (std::size_t i = 0; i < rows_per_block * cols; ++i)
      store(DType::I32, mine.data(), static_cast<std::size_t>(j) * rows_per_block * cols + i, block_value(me, j, i));
  cuda::Tensor t = upload(ex, DType::I32, {static_cast<std::uint64_t>(n) * rows_per_block, cols}, mine);
  auto f = engine::async_all_to_all<nccl::Backend>(ex, group, t, asio::use_future);
  const cuda::Tensor out = get_within(f);
  CHECK(out.shape() == t.shape());
  std::vector<std::byte> want(mine.size());
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < rows_per_block * cols; ++i)
      store(DType::I32, want.data(), static_cast<std::size_t>(r) * rows_per_block * cols + i, block_value(r, me, i));
  CHECK(download(out) == want);
}

TEST_CASE("nccl – a real group refuses an unreducible dtype and a dim 0 that does not split", "[nccl][gpu]") {
  EREDU_REQUIRE_GPU_PER_RANK();
  cuda::DeviceGuard guard(my_device());
  nccl::Communicator group = make_group("refuse");
  cuda::Executor ex(my_device());
  for (DType dtype : {DType::BOOL, DType::I16, DType::C64, DType::F8_E4M3}) {
    INFO(dtype_name(dtype));
    cuda::Tensor t = cuda::Tensor::allocate(cuda::Backend::default_memory(ex.device()), dtype, {8}, ex.shared_stream());
    auto f = engine::async_all_reduce<nccl::Backend>(ex, group, t, ReduceOp::sum, asio::use_future);
    try {
      (void)get_within(f, std::chrono::seconds(5));
      FAIL("expected a refusal");
    } catch (const Error& e) {
      CHECK(e.kind() == errc::invalid_argument);
    }
  }
  if (group.size() > 1) {
    cuda::Tensor t = cuda::Tensor::allocate(cuda::Backend::default_memory(ex.device()), DType::F32,
                                            {static_cast<std::uint64_t>(group.size()) + 1}, ex.shared_stream());
    CHECK_THROWS_AS(nccl::Backend::all_to_all(ex, group, t), Error);
  }
  CHECK(group.usable());  // refusals start nothing
}

TEST_CASE("nccl – a collective a peer never joins fails within the timeout, typed, and aborts the communicator",
          "[nccl][gpu]") {
  EREDU_REQUIRE_GPU_PER_RANK();
  const int size = mpi_world().size();
  const int rank = mpi_world().rank();
  if (size < 2) {
    WARN("needs 2 ranks");
    return;
  }
  cuda::DeviceGuard guard(my_device());
  // Made with the long timeout (a first NCCL initialization on a device can take seconds),
  // then shortened for the collective.
  nccl::Communicator lonely = make_group("lonely");
  lonely.set_timeout(std::chrono::milliseconds(500));
  cuda::Executor ex(my_device());
  if (rank == 0) {
    cuda::Tensor t = upload(ex, DType::F32, {1024}, host_values(DType::F32, rank, 1024));
    const auto start = std::chrono::steady_clock::now();
    auto f = engine::async_all_reduce<nccl::Backend>(ex, lonely, t, ReduceOp::sum, asio::use_future);
    try {
      (void)get_within(f, std::chrono::seconds(20));
      FAIL("expected a timeout");
    } catch (const CollectiveError& e) {
      const auto waited = std::chrono::steady_clock::now() - start;
      CHECK(e.kind() == errc::collective_error);
      CHECK(e.operation() == "all_reduce");
      CHECK(e.group() == "lonely");
      CHECK(e.rank() == 0);
      CHECK(e.size() == size);
      CHECK(e.ranks().size() == static_cast<std::size_t>(size - 1));
      CHECK_THAT(e.what(), Catch::Contains("500 ms") && Catch::Contains("aborted"));
      CHECK(waited >= std::chrono::milliseconds(500));
      CHECK(waited < std::chrono::seconds(10));
    }
    CHECK_FALSE(lonely.usable());
    CHECK(lonely.native() == nullptr);
    auto g = engine::async_all_reduce<nccl::Backend>(ex, lonely, t, ReduceOp::sum, asio::use_future);
    try {
      (void)get_within(g, std::chrono::seconds(5));
      FAIL("expected an unusable group");
    } catch (const CollectiveError& e) {
      CHECK_THAT(e.what(), Catch::Contains("unusable"));
    }
  }
  // The other ranks never join; their communicator goes without a collective (its finalize
  // may wait the timeout for rank 0, which aborted, and then aborts too).
  auto b = mpi_world().async_barrier(asio::use_future);
  get_within(b);
}

TEST_CASE("nccl – a creation a peer never joins fails within the timeout, typed", "[nccl][gpu]") {
  EREDU_REQUIRE_GPU_PER_RANK();
  const int size = mpi_world().size();
  const int rank = mpi_world().rank();
  if (size < 2) {
    WARN("needs 2 ranks");
    return;
  }
  cuda::DeviceGuard guard(my_device());
  mpi::Communicator bootstrap = mpi_world().split(0, rank, "late");
  const auto timeout = std::chrono::milliseconds(500);
  if (rank == 0) {
    // The exchange of the unique id outlives the timeout: the others have not called create.
    const auto start = std::chrono::steady_clock::now();
    try {
      (void)nccl::Communicator::create(bootstrap, my_device(), "late", {.timeout = timeout});
      FAIL("expected a timeout");
    } catch (const CollectiveError& e) {
      CHECK(e.kind() == errc::collective_error);
      CHECK(e.group() == "late");
      CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
    }
  }
  auto b = mpi_world().async_barrier(asio::use_future);
  get_within(b);
  if (rank != 0) {
    // Late: the exchange now completes against rank 0's timed-out contribution, but rank 0
    // never calls NCCL's initialization, so it times out here, and the half-made
    // communicator is aborted.
    const auto start = std::chrono::steady_clock::now();
    try {
      (void)nccl::Communicator::create(bootstrap, my_device(), "late", {.timeout = timeout});
      FAIL("expected a timeout");
    } catch (const CollectiveError& e) {
      CHECK(e.kind() == errc::collective_error);
      CHECK(e.operation() == "create");
      CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
    }
  }
  auto c = mpi_world().async_barrier(asio::use_future);
  get_within(c);
}

TEST_CASE("nccl – an empty device tensor handle cannot be published", "[nccl][live]") {
  CHECK(test::kind_of([] { (void)nccl::published_tensor("w", cuda::Tensor{}); }) == errc::invalid_argument);
}

TEST_CASE("nccl – a subscriber reads a device tensor's exact bytes, staged through the publisher's host",
          "[nccl][live][gpu]") {
  if (mpi_world().size() != 2) {
    WARN("needs 2 ranks: a publisher and a subscriber");
    return;
  }
  // Only the publisher (rank 0) needs a device; every rank learns whether it has one.
  auto [has, gathered] =
      mpi_world().all_gather_bytes({std::byte{cuda::device_count() > 0 ? std::uint8_t{1} : std::uint8_t{0}}});
  gathered.get();
  if ((*has)[0] != std::byte{1}) {
    WARN("the publisher's rank has no CUDA device (" << cuda::no_device_reason() << "): skipping");
    return;
  }
  // Not powers of two, and a bf16 one whose column shard reads strided runs.
  const std::vector<std::tuple<std::string, DType, Shape>> specs = {{"w.bf16", DType::BF16, {37, 53}},
                                                                    {"w.f32", DType::F32, {1037}}};
  std::vector<std::vector<std::byte>> bytes;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto& [name, dtype, shape] = specs[i];
    std::vector<std::byte> b(checked_element_count(shape).value_or(0) * dtype_bits(dtype) / 8);
    for (std::size_t k = 0; k < b.size(); ++k) b[k] = static_cast<std::byte>((k * 131 + i * 17 + k / 251) & 0xFF);
    bytes.push_back(std::move(b));
  }
  mpi::Communicator& world = mpi_world();
  if (world.rank() == 0) {
    cuda::Executor ex(0);
    std::vector<mpi::PublishedTensor> tensors;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const auto& [name, dtype, shape] = specs[i];
      tensors.push_back(nccl::published_tensor(name, upload(ex, dtype, shape, bytes[i])));
    }
    // The copier alone: exact bytes at an offset, rows at one stride (one strided copy) packed,
    // and a copy past the end refused.
    std::vector<std::byte> piece(100);
    const ByteRun at5{.source_offset = 5, .length = 100};
    tensors[0].copy_out(std::span(&at5, 1), piece);
    CHECK(std::memcmp(piece.data(), bytes[0].data() + 5, piece.size()) == 0);
    const std::vector<ByteRun> rows =
        selection_runs(std::get<2>(specs[0]), std::get<1>(specs[0]), Selection::columns(std::get<2>(specs[0]), 3, 20));
    std::vector<std::byte> strided(rows.back().dest_offset + rows.back().length);
    tensors[0].copy_out(rows, strided);
    for (const ByteRun& r : rows)
      CHECK(std::memcmp(strided.data() + r.dest_offset, bytes[0].data() + r.source_offset, r.length) == 0);
    const ByteRun past{.source_offset = bytes[0].size() - 50, .length = 100};
    CHECK(test::kind_of([&] { tensors[0].copy_out(std::span(&past, 1), piece); }) == errc::invalid_argument);
    mpi::Publisher publisher(world);
    mpi::Publication v = publisher.publish("d-1", "", std::move(tensors));
    auto b = world.async_barrier(asio::use_future);  // published: the subscriber may open it
    get_within(b);
    CHECK(v.wait_served(1, std::chrono::seconds(30)));
    CHECK(v.served() == 1);
    auto done = world.async_barrier(asio::use_future);
    get_within(done);
    return;
  }
  asio::io_context ctx;
  mpi::Subscriber subscriber(world, 0, ctx.get_executor(), {.part_size = 1000});
  auto b = world.async_barrier(asio::use_future);
  get_within(b);
  auto opened = asio::co_spawn(ctx, subscriber.async_open("d-1", asio::use_awaitable), asio::use_future);
  std::unique_ptr<mpi::PublishedSource> source = run_within(ctx, opened);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto& [name, dtype, shape] = specs[i];
    // The whole tensor, and its second half of columns (strided runs).
    for (const Selection& selection : {Selection::all(), Selection::columns(shape, shape.back() / 2, shape.back())}) {
      if (shape.size() == 1 && !selection.is_all()) continue;
      const io::TensorReadRequest request{.key = name, .selection = selection};
      std::vector<std::byte> got(source->selected_bytes(request));
      auto read = asio::co_spawn(ctx, source->async_read_into(request, got, asio::use_awaitable), asio::use_future);
      run_within(ctx, read);
      std::vector<std::byte> expected;
      for (const ByteRun& r : selection_runs(shape, dtype, selection))
        expected.insert(expected.end(), bytes[i].begin() + static_cast<std::ptrdiff_t>(r.source_offset),
                        bytes[i].begin() + static_cast<std::ptrdiff_t>(r.source_offset + r.length));
      CHECK(got == expected);
    }
  }
  CHECK(source->transferred_bytes() > 0);
  source->finish(true);
  auto done = world.async_barrier(asio::use_future);
  get_within(done);
}
