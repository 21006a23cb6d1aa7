// eredu::mpi::Backend's collectives under mpirun (-np 2 and -np 4): every dtype and reduction
// against a reference each rank computes from every rank's (deterministic) input, gathers and
// exchanges in rank order, gathers into a caller's (recycled) output and their refusals, split
// groups, ordering on the arena, delivery on the awaiting coroutine's executor, typed errors for
// what MPI cannot reduce, and a timeout that names the operation, the group and the ranks it
// waited for.

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <bit>
#include <catch2/catch.hpp>
#include <chrono>
#include <complex>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "distributed/mpi_fixture.hpp"
#include "eredu/core/collective_error.hpp"
#include "eredu/core/float_formats.hpp"
#include "eredu/cpu/executor.hpp"
#include "eredu/engine/backend/collective_backend.hpp"
#include "eredu/mpi/backend.hpp"

using namespace eredu;
using engine::ReduceOp;
using test::get_within;
using test::mpi_world;

namespace {

constexpr std::size_t kElements = 1037;  // not a power of two: no algorithm's sweet spot only

/// Rank `r`'s value at element `i`: small integers and halves, so that every sum is exact in
/// every float format (the reference needs no tolerance) and min/max pick different ranks.
double value(DType dtype, int r, std::size_t i) {
  const auto k = static_cast<double>((i * 7 + static_cast<std::size_t>(r) * 3 + i / 13) % 11);
  switch (dtype) {
    case DType::U8:
    case DType::U16:
    case DType::U32:
    case DType::U64:
      return k;
    case DType::I8:
    case DType::I16:
    case DType::I32:
    case DType::I64:
      return k - 5;
    case DType::BOOL:
      return (i + static_cast<std::size_t>(r)) % 3 == 0 ? 1 : 0;
    default:
      return (k - 5) * 0.5;
  }
}

/// Writes `v` as element `i` of `dtype` into `out` (C64: v as real part, 2v as imaginary; not
/// -v, whose zero sums would differ from the reference in the sign of zero).
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
    case DType::I16:
      return put(static_cast<std::int16_t>(v));
    case DType::U16:
      return put(static_cast<std::uint16_t>(v));
    case DType::I32:
      return put(static_cast<std::int32_t>(v));
    case DType::U32:
      return put(static_cast<std::uint32_t>(v));
    case DType::I64:
      return put(static_cast<std::int64_t>(v));
    case DType::U64:
      return put(static_cast<std::uint64_t>(v));
    case DType::BOOL:
      return put(static_cast<std::uint8_t>(v != 0));
    case DType::C64:
      return put(std::complex<float>(static_cast<float>(v), static_cast<float>(2 * v)));
    default:
      FAIL("no store for " << dtype_name(dtype));
  }
}

cpu::Tensor filled(DType dtype, int r, Shape shape) {
  cpu::Tensor t = cpu::Tensor::allocate(cpu::Backend::default_storage(), dtype, std::move(shape));
  const std::uint64_t n = t.elements();
  for (std::size_t i = 0; i < n; ++i) store(dtype, t.mutable_bytes().data(), i, value(dtype, r, i));
  return t;
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

cpu::Tensor all_reduce(cpu::Executor& arena, cpu::Tensor t, ReduceOp op) {
  auto f = engine::async_all_reduce<mpi::Backend>(arena, mpi_world(), std::move(t), op, asio::use_future);
  return get_within(f);
}

}  // namespace

TEST_CASE("mpi – every dtype and reduction all-reduces to the exact reference", "[mpi]") {
  cpu::Executor arena(2);
  const int size = mpi_world().size();
  const int rank = mpi_world().rank();
  const DType dtypes[] = {DType::F64, DType::F32, DType::BF16, DType::F16, DType::I8,  DType::U8,   DType::I16,
                          DType::U16, DType::I32, DType::U32,  DType::I64, DType::U64, DType::BOOL, DType::C64};
  int reduced = 0;
  for (const DType dtype : dtypes)
    for (const ReduceOp op : {ReduceOp::sum, ReduceOp::min, ReduceOp::max}) {
      const bool supported =
          (dtype != DType::BOOL || op != ReduceOp::sum) && (dtype != DType::C64 || op == ReduceOp::sum);
      CAPTURE(dtype_name(dtype), engine::reduce_op_name(op), rank, size);
      cpu::Tensor in = filled(dtype, rank, {kElements});
      if (!supported) {
        try {
          all_reduce(arena, in, op);
          FAIL("expected invalid_argument");
        } catch (const Error& e) {
          CHECK(e.kind() == errc::invalid_argument);
          CHECK_THAT(e.what(), Catch::Contains(std::string(dtype_name(dtype))));
        }
        continue;
      }
      const cpu::Tensor out = all_reduce(arena, in, op);
      REQUIRE(out.dtype() == dtype);
      REQUIRE(out.shape() == Shape{kElements});
      const std::vector<std::byte> want = reference(dtype, op, size);
      REQUIRE(out.nbytes() == want.size());
      CHECK(std::memcmp(out.bytes().data(), want.data(), want.size()) == 0);
      ++reduced;
    }
  CHECK(reduced == 14 * 3 - 3);
  // FP8 (and every sub-byte type) has no reduction in MPI: a typed error, nothing started.
  for (const DType dtype : {DType::F8_E4M3, DType::F8_E5M2}) {
    cpu::Tensor t = cpu::Tensor::allocate(cpu::Backend::default_storage(), dtype, {16});
    try {
      all_reduce(arena, t, ReduceOp::max);
      FAIL("expected invalid_argument");
    } catch (const Error& e) {
      CHECK(e.kind() == errc::invalid_argument);
    }
  }
  CHECK(mpi_world().usable());
}

TEST_CASE("mpi – all_gather concatenates every rank's tensor along dim 0 in rank order", "[mpi]") {
  cpu::Executor arena(2);
  const int size = mpi_world().size();
  const int rank = mpi_world().rank();
  for (const DType dtype : {DType::F32, DType::BF16, DType::U8, DType::I64, DType::F8_E4M3}) {
    CAPTURE(dtype_name(dtype));
    const std::size_t eb = dtype_bits(dtype) / 8;
    cpu::Tensor in = cpu::Tensor::allocate(cpu::Backend::default_storage(), dtype, {3, 5});
    for (std::size_t b = 0; b < in.nbytes(); ++b) in.mutable_bytes()[b] = std::byte(rank * 31 + b);
    auto f = engine::async_all_gather<mpi::Backend>(arena, mpi_world(), in, asio::use_future);
    const cpu::Tensor out = get_within(f);
    REQUIRE(out.shape() == Shape{3 * static_cast<std::uint64_t>(size), 5});
    REQUIRE(out.nbytes() == 15 * eb * static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r)
      for (std::size_t b = 0; b < 15 * eb; ++b)
        REQUIRE(out.bytes()[static_cast<std::size_t>(r) * 15 * eb + b] == std::byte(r * 31 + b));
  }
}

namespace {

/// Rank `r`'s byte `b` of a gather input in call `k`: who sent it, which byte, which call.
std::byte gather_byte(int r, std::size_t b, int k) { return std::byte(static_cast<unsigned>(r * 31 + b * 7 + k * 13)); }

cpu::Tensor gather_input(DType dtype, const Shape& shape, int r, int k) {
  cpu::Tensor t = cpu::Tensor::allocate(cpu::Backend::default_storage(), dtype, shape);
  for (std::size_t b = 0; b < t.nbytes(); ++b) t.mutable_bytes()[b] = gather_byte(r, b, k);
  return t;
}

std::vector<std::byte> bytes_of(const cpu::Tensor& t) { return {t.bytes().begin(), t.bytes().end()}; }

/// The gathered shape over `size` ranks, computed here rather than by the code under test.
Shape gathered(Shape shape, int size) {
  if (shape.empty()) shape = {1};
  shape[0] *= static_cast<std::uint64_t>(size);
  return shape;
}

/// The message of the Error(invalid_argument) `f` fails with (fails the test otherwise).
std::string refusal(std::future<cpu::Tensor>& f) {
  try {
    get_within(f);
  } catch (const Error& e) {
    CHECK(e.kind() == errc::invalid_argument);
    return e.what();
  }
  FAIL("expected invalid_argument");
  return {};
}

}  // namespace

TEST_CASE("mpi – all_gather_into writes what all_gather returns into the caller's output", "[mpi]") {
  STATIC_REQUIRE(engine::GatherIntoBackend<mpi::Backend>);
  cpu::Executor arena(2);
  const int size = mpi_world().size();
  const int rank = mpi_world().rank();
  // Odd byte counts per rank (13, 14, 105), equal on every rank; a scalar; an empty tensor.
  const std::pair<DType, Shape> cases[] = {
      {DType::F32, {3, 5}}, {DType::BF16, {7}}, {DType::U8, {13}},         {DType::I64, {2, 3, 1}},
      {DType::C64, {1}},    {DType::F64, {}},   {DType::F8_E4M3, {15, 7}}, {DType::F32, {0, 4}},
  };
  for (const auto& [dtype, shape] : cases) {
    CAPTURE(dtype_name(dtype), format_shape(shape), rank, size);
    const cpu::Tensor in = gather_input(dtype, shape, rank, 0);
    auto g = engine::async_all_gather<mpi::Backend>(arena, mpi_world(), in, asio::use_future);
    const cpu::Tensor want = get_within(g);
    cpu::Tensor out = cpu::Tensor::allocate(cpu::Backend::default_storage(), dtype, gathered(shape, size));
    std::ranges::fill(out.mutable_bytes(), std::byte{0xA5});  // not what the gather writes
    auto f = engine::async_all_gather_into<mpi::Backend>(arena, mpi_world(), in, out, asio::use_future);
    const cpu::Tensor got = get_within(f);
    CHECK(got.shares_storage_with(out));  // the caller's output, no new tensor
    CHECK(got.dtype() == dtype);
    CHECK(got.shape() == want.shape());
    CHECK(bytes_of(got) == bytes_of(want));
    std::vector<std::byte> expected;
    for (int r = 0; r < size; ++r)
      for (std::size_t b = 0; b < in.nbytes(); ++b) expected.push_back(gather_byte(r, b, 0));
    CHECK(bytes_of(got) == expected);
  }
}

TEST_CASE("mpi – a recycled all_gather_into output holds each call's gather", "[mpi]") {
  cpu::Executor arena(2);
  const int size = mpi_world().size();
  const int rank = mpi_world().rank();
  const Shape shape{5, 3};
  cpu::Tensor out = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::I16, gathered(shape, size));
  for (int k = 0; k < 5; ++k) {
    CAPTURE(k);
    auto f = engine::async_all_gather_into<mpi::Backend>(arena, mpi_world(), gather_input(DType::I16, shape, rank, k),
                                                         out, asio::use_future);
    const cpu::Tensor got = get_within(f);
    REQUIRE(got.shares_storage_with(out));
    // Every byte differs from the previous call's: an output left unwritten fails here.
    for (int r = 0; r < size; ++r)
      for (std::size_t b = 0; b < 30; ++b)
        REQUIRE(out.bytes()[static_cast<std::size_t>(r) * 30 + b] == gather_byte(r, b, k));
  }
  // Back to back, the input written by the arena first: each gather reads its own call's input
  // (ordered after the arena's fence), and the last one's bytes are what the output keeps.
  std::vector<std::future<cpu::Tensor>> pending;
  for (int k = 5; k < 9; ++k) {
    cpu::Tensor in = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::I16, shape);
    arena.submit([in, rank, k] {
      for (std::size_t b = 0; b < in.nbytes(); ++b) in.mutable_bytes()[b] = gather_byte(rank, b, k);
    });
    pending.push_back(engine::async_all_gather_into<mpi::Backend>(arena, mpi_world(), in, out, asio::use_future));
  }
  for (auto& f : pending) get_within(f);
  for (int r = 0; r < size; ++r)
    for (std::size_t b = 0; b < 30; ++b)
      REQUIRE(out.bytes()[static_cast<std::size_t>(r) * 30 + b] == gather_byte(r, b, 8));
}

TEST_CASE("mpi – all_gather_into refuses a wrong shape, a wrong dtype and a shared input, naming both", "[mpi]") {
  cpu::Executor arena(2);
  const int size = mpi_world().size();
  const int rank = mpi_world().rank();
  const Shape shape{3, 5};
  const cpu::Tensor in = gather_input(DType::F32, shape, rank, 0);
  const Shape want = gathered(shape, size);
  const std::string in_text = "F32 " + format_shape(shape);
  {
    const Shape wrong{want[0] + 1, 5};
    cpu::Tensor out = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::F32, wrong);
    CHECK_THROWS_AS(mpi::Backend::all_gather_into(arena, mpi_world(), in, out), Error);  // at once
    auto f = engine::async_all_gather_into<mpi::Backend>(arena, mpi_world(), in, out, asio::use_future);
    const std::string message = refusal(f);
    CHECK_THAT(message, Catch::Contains(in_text));
    CHECK_THAT(message, Catch::Contains("F32 " + format_shape(wrong)));
    CHECK_THAT(message, Catch::Contains("F32 " + format_shape(want)));
  }
  {
    // Not even the input's own shape passes for a gather of more than one rank.
    cpu::Tensor out = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::F32, {15});
    auto f = engine::async_all_gather_into<mpi::Backend>(arena, mpi_world(), in, out, asio::use_future);
    CHECK_THAT(refusal(f), Catch::Contains("F32 [15]"));
  }
  {
    // Same bytes per rank, another dtype: still refused (the result's elements would differ).
    cpu::Tensor out = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::I32, want);
    auto f = engine::async_all_gather_into<mpi::Backend>(arena, mpi_world(), in, out, asio::use_future);
    const std::string message = refusal(f);
    CHECK_THAT(message, Catch::Contains(in_text));
    CHECK_THAT(message, Catch::Contains("I32 " + format_shape(want)));
  }
  {
    // An empty output is a wrong shape too.
    auto f = engine::async_all_gather_into<mpi::Backend>(arena, mpi_world(), in, cpu::Tensor{}, asio::use_future);
    CHECK_THAT(refusal(f), Catch::Contains(in_text));
  }
  if (size > 1) {
    // The input as its own output: the gather would overwrite what other ranks still read.
    cpu::Tensor shared = gather_input(DType::F32, want, rank, 0);
    auto f = engine::async_all_gather_into<mpi::Backend>(arena, mpi_world(), shared, shared, asio::use_future);
    const std::string message = refusal(f);
    CHECK_THAT(message, Catch::Contains("shares storage"));
    CHECK_THAT(message, Catch::Contains("F32 " + format_shape(want)));
  }
  // Refusals start nothing: the group still gathers, and every rank is still in step.
  CHECK(mpi_world().usable());
  cpu::Tensor out = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::F32, want);
  auto f = engine::async_all_gather_into<mpi::Backend>(arena, mpi_world(), in, out, asio::use_future);
  CHECK_NOTHROW(get_within(f));
}

TEST_CASE("mpi – all_gather_into takes the input as this rank's block of the output (in place)", "[mpi]") {
  // A cpu::Tensor is its whole storage, so the input can be its rank's block of the output only
  // in a group of one (rank 0's block is the whole output): one such group per rank.
  cpu::Executor arena(2);
  const int rank = mpi_world().rank();
  mpi::Communicator solo = mpi_world().split(rank, 0, "solo");
  REQUIRE(solo.size() == 1);
  cpu::Tensor t = gather_input(DType::U16, {4, 3}, rank, 0);
  const std::vector<std::byte> before = bytes_of(t);
  auto f = engine::async_all_gather_into<mpi::Backend>(arena, solo, t, t, asio::use_future);
  const cpu::Tensor got = get_within(f);
  CHECK(got.shares_storage_with(t));
  CHECK(bytes_of(got) == before);
  // A scalar's block is the output seen as [1].
  cpu::Tensor scalar = gather_input(DType::F32, {}, rank, 1);
  auto g = engine::async_all_gather_into<mpi::Backend>(arena, solo, scalar, scalar.reshaped({1}), asio::use_future);
  CHECK(get_within(g).shape() == Shape{1});
  CHECK(solo.usable());
}

TEST_CASE("mpi – all_to_all sends block j to rank j and returns the received blocks in rank order", "[mpi]") {
  cpu::Executor arena(2);
  const int size = mpi_world().size();
  const int rank = mpi_world().rank();
  const std::uint64_t rows = 2 * static_cast<std::uint64_t>(size);
  cpu::Tensor in = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::I32, {rows, 3});
  auto* p = reinterpret_cast<std::int32_t*>(in.mutable_bytes().data());
  for (std::uint64_t row = 0; row < rows; ++row)
    for (std::uint64_t c = 0; c < 3; ++c) p[row * 3 + c] = static_cast<std::int32_t>(rank * 1000 + row * 10 + c);
  auto f = engine::async_all_to_all<mpi::Backend>(arena, mpi_world(), in, asio::use_future);
  const cpu::Tensor out = get_within(f);
  REQUIRE(out.shape() == in.shape());
  const auto got = out.as<std::int32_t>();
  // Block j of the result is block `rank` of rank j: rows 2*rank, 2*rank+1 of j's input.
  for (int j = 0; j < size; ++j)
    for (std::uint64_t k = 0; k < 2; ++k)
      for (std::uint64_t c = 0; c < 3; ++c) {
        const std::uint64_t src_row = 2 * static_cast<std::uint64_t>(rank) + k;
        CHECK(got[(2 * static_cast<std::uint64_t>(j) + k) * 3 + c] ==
              static_cast<std::int32_t>(j * 1000 + src_row * 10 + c));
      }
  // dim 0 not a multiple of the group: a typed error.
  cpu::Tensor odd = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::I32, {rows + 1, 3});
  auto g = engine::async_all_to_all<mpi::Backend>(arena, mpi_world(), odd, asio::use_future);
  if (size > 1) {
    try {
      get_within(g);
      FAIL("expected invalid_argument");
    } catch (const Error& e) {
      CHECK(e.kind() == errc::invalid_argument);
    }
  } else {
    CHECK_NOTHROW(get_within(g));
  }
}

TEST_CASE("mpi – split groups reduce over their own ranks only", "[mpi]") {
  cpu::Executor arena(2);
  const int size = mpi_world().size();
  const int rank = mpi_world().rank();
  const int tp_size = size >= 2 ? 2 : 1;
  mpi::Communicator tp = mpi_world().split(rank / tp_size, rank, "tp");
  mpi::Communicator dp = mpi_world().split(rank % tp_size, rank, "dp");
  REQUIRE(tp.size() == tp_size);
  CHECK(tp.rank() == rank % tp_size);
  CHECK(dp.size() == size / tp_size);
  CHECK(dp.rank() == rank / tp_size);
  CHECK(tp.name() == "tp");
  REQUIRE(tp.peers().size() == static_cast<std::size_t>(tp_size));
  CHECK(tp.peers()[static_cast<std::size_t>(tp.rank())].world_rank == eredu::test::mpi_environment().world_rank());

  // Sum of world ranks over each group.
  cpu::Tensor t = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::I64, {4});
  for (auto& v : std::span(reinterpret_cast<std::int64_t*>(t.mutable_bytes().data()), 4)) v = rank;
  auto f = engine::async_all_reduce<mpi::Backend>(arena, tp, t, ReduceOp::sum, asio::use_future);
  const cpu::Tensor tsum = get_within(f);
  std::int64_t want = 0;
  for (int r = (rank / tp_size) * tp_size; r < (rank / tp_size + 1) * tp_size; ++r) want += r;
  for (std::int64_t v : tsum.as<std::int64_t>()) CHECK(v == want);

  // A negative color joins no group.
  mpi::Communicator none = mpi_world().split(rank == 0 ? -1 : 1, rank, "rest");
  CHECK(none.valid() == (rank != 0));
  if (rank != 0) CHECK(none.size() == size - 1);
}

TEST_CASE("mpi – collectives run in submission order after the arena's work, results in order", "[mpi]") {
  cpu::Executor arena(2);
  const int size = mpi_world().size();
  std::vector<std::future<cpu::Tensor>> pending;
  for (int k = 0; k < 16; ++k) {
    cpu::Tensor t = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::I32, {257});
    auto* p = reinterpret_cast<std::int32_t*>(t.mutable_bytes().data());
    // Written by the arena, before the collective (ordered after the arena's fence).
    arena.submit([p, k] {
      for (int i = 0; i < 257; ++i) p[i] = k + i;
    });
    pending.push_back(engine::async_all_reduce<mpi::Backend>(arena, mpi_world(), t, ReduceOp::sum, asio::use_future));
  }
  for (int k = 0; k < 16; ++k) {
    const cpu::Tensor out = get_within(pending[static_cast<std::size_t>(k)]);
    const auto got = out.as<std::int32_t>();
    for (int i = 0; i < 257; ++i) REQUIRE(got[static_cast<std::size_t>(i)] == (k + i) * size);
  }
}

TEST_CASE("mpi – a coroutine resumes on its own executor after a collective", "[mpi]") {
  cpu::Executor arena(2);
  asio::io_context ctx;
  bool on_loop = false;
  std::int32_t got = 0;
  auto done = asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        cpu::Tensor t = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::I32, {1});
        *reinterpret_cast<std::int32_t*>(t.mutable_bytes().data()) = mpi_world().rank() + 1;
        cpu::Tensor y =
            co_await engine::async_all_reduce<mpi::Backend>(arena, mpi_world(), t, ReduceOp::max, asio::use_awaitable);
        on_loop = ctx.get_executor().running_in_this_thread();
        got = y.as<std::int32_t>()[0];
        co_await mpi_world().async_barrier(asio::use_awaitable);
      },
      asio::use_future);
  ctx.run();
  get_within(done);
  CHECK(on_loop);
  CHECK(got == mpi_world().size());
}

TEST_CASE("mpi – a collective a peer never joins fails within the timeout, typed, and the group is unusable", "[mpi]") {
  const int size = mpi_world().size();
  const int rank = mpi_world().rank();
  if (size < 2) {
    WARN("needs 2 ranks");
    return;
  }
  cpu::Executor arena(2);
  mpi::Communicator lonely = mpi_world().split(0, rank, "lonely");
  lonely.set_timeout(std::chrono::milliseconds(300));
  cpu::Tensor t = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::F32, {8});
  if (rank == 0) {
    const auto start = std::chrono::steady_clock::now();
    auto f = engine::async_all_reduce<mpi::Backend>(arena, lonely, t, ReduceOp::sum, asio::use_future);
    try {
      get_within(f, std::chrono::seconds(20));
      FAIL("expected a timeout");
    } catch (const CollectiveError& e) {
      const auto waited = std::chrono::steady_clock::now() - start;
      CHECK(e.kind() == errc::collective_error);
      CHECK(e.family() == error_family::collective);
      CHECK(e.operation() == "all_reduce");
      CHECK(e.group() == "lonely");
      CHECK(e.rank() == 0);
      CHECK(e.size() == size);
      CHECK(e.ranks().size() == static_cast<std::size_t>(size - 1));  // everyone it waited for
      CHECK_THAT(e.what(), Catch::Contains("300 ms"));
      CHECK(waited >= std::chrono::milliseconds(300));
      CHECK(waited < std::chrono::seconds(10));
    }
    CHECK_FALSE(lonely.usable());
    // Later collectives fail at once, naming the earlier failure.
    auto g = engine::async_all_reduce<mpi::Backend>(arena, lonely, t, ReduceOp::sum, asio::use_future);
    try {
      get_within(g, std::chrono::seconds(5));
      FAIL("expected an unusable group");
    } catch (const CollectiveError& e) {
      CHECK_THAT(e.what(), Catch::Contains("unusable"));
    }
  }
  // The others join late, so the timed-out request completes inside MPI and the job can
  // finalize; the world stays usable.
  auto b = mpi_world().async_barrier(asio::use_future);
  get_within(b);
  if (rank != 0) {
    auto f = engine::async_all_reduce<mpi::Backend>(arena, lonely, t, ReduceOp::sum, asio::use_future);
    CHECK_NOTHROW(get_within(f));
  }
  if (rank == 0) {
    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (test::mpi_environment().has_stuck_collectives() && std::chrono::steady_clock::now() < limit)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK_FALSE(test::mpi_environment().has_stuck_collectives());
  }
  CHECK(mpi_world().usable());
}
