#include "eredu/io/reading/lease_pool.hpp"

#include <sys/mman.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "eredu/core/errc.hpp"
#include "eredu/core/error.hpp"
#include "support/byte_units.hpp"
#include "support/error_kind.hpp"

using namespace eredu;
using namespace eredu::io;

namespace {
using eredu::test::KiB;
LeasePoolOptions small_pool(std::size_t bytes) { return {.budget = bytes, .huge_pages = false, .prefault = false}; }

/// The errc kind of a completion's error; errc{} for none.
using eredu::test::kind_of;
}  // namespace

TEST_CASE("lease pool – staging never exceeds the budget under many concurrent requests", "[io][pool]") {
  // A multi-threaded loop, so acquisitions and releases really race.
  asio::thread_pool threads(2);
  LeasePool pool(threads.get_executor(), small_pool(256 * KiB));
  std::atomic<int> finished{0};
  constexpr int n = 400;
  for (int i = 0; i < n; ++i) {
    asio::co_spawn(
        threads,
        // Parameters, unlike a lambda's captures, live in the coroutine frame.
        [](LeasePool& p, std::atomic<int>& count, int seed) -> asio::awaitable<void> {
          std::mt19937 rng(static_cast<unsigned>(seed));
          std::size_t bytes = 1 + rng() % (96 * KiB);
          StagingBuffer b = co_await p.async_acquire(bytes, asio::use_awaitable);
          // Catch2 assertions are not thread-safe: count bad blocks, check after join.
          if (b.size() < bytes || reinterpret_cast<std::uintptr_t>(b.data()) % LeasePool::alignment != 0) co_return;
          std::memset(b.data(), seed & 0xff, bytes);  // ASan would see a block outside the pool
          asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::microseconds(rng() % 200));
          co_await t.async_wait(asio::use_awaitable);
          ++count;
        }(pool, finished, i),
        asio::detached);
  }
  threads.join();
  CHECK(finished == n);
  CHECK(pool.in_use() == 0);
  CHECK(pool.high_water() <= pool.budget());
  CHECK(pool.high_water() > pool.budget() / 2);  // the test did fill the pool
}

TEST_CASE("lease pool – waiters are served in arrival order", "[io][pool]") {
  asio::io_context ctx;
  LeasePool pool(ctx.get_executor(), small_pool(64 * KiB));
  std::vector<int> order;
  auto hog = pool.try_acquire(64 * KiB);
  REQUIRE(hog);
  auto want = [&](int tag, std::size_t bytes) {
    pool.async_acquire(bytes, [&, tag](std::exception_ptr ec, StagingBuffer b) {
      REQUIRE_FALSE(ec);
      order.push_back(tag);
      b.reset();
    });
  };
  want(1, 60 * KiB);  // large: must not be overtaken by the small ones behind it
  want(2, 4 * KiB);
  want(3, 4 * KiB);
  ctx.poll();
  CHECK(order.empty());
  CHECK(pool.waiting() == 3);
  CHECK_FALSE(pool.try_acquire(4 * KiB));  // queued waiters come first
  hog.reset();
  ctx.run();
  CHECK(order == std::vector<int>{1, 2, 3});
  CHECK(pool.in_use() == 0);
}

TEST_CASE("lease pool – a request larger than the pool fails at once", "[io][pool]") {
  asio::io_context ctx;
  LeasePool pool(ctx.get_executor(), small_pool(64 * KiB));
  std::exception_ptr got;
  pool.async_acquire(64 * KiB + 1, [&](std::exception_ptr ec, StagingBuffer) { got = ec; });
  ctx.run();
  CHECK(kind_of(got) == errc::exceeds_budget);
  CHECK(pool.waiting() == 0);
}

TEST_CASE("lease pool – a buffer dropped on an error path returns its memory", "[io][pool]") {
  asio::io_context ctx;
  LeasePool pool(ctx.get_executor(), small_pool(64 * KiB));
  bool caught = false;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        StagingBuffer b = co_await pool.async_acquire(32 * KiB, asio::use_awaitable);
        CHECK(pool.in_use() == 32 * KiB);
        throw std::runtime_error("consumer failed");
      },
      [&](std::exception_ptr e) { caught = e != nullptr; });
  ctx.run();
  CHECK(caught);
  CHECK(pool.in_use() == 0);
}

TEST_CASE("lease pool – cancelling a waiter completes it with errc::cancelled", "[io][pool]") {
  asio::io_context ctx;
  LeasePool pool(ctx.get_executor(), small_pool(16 * KiB));
  auto hog = pool.try_acquire(16 * KiB);
  asio::cancellation_signal signal;
  std::exception_ptr first, second;
  pool.async_acquire(
      16 * KiB, asio::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr ec, StagingBuffer) { first = ec; }));
  pool.async_acquire(4 * KiB, [&](std::exception_ptr ec, StagingBuffer) { second = ec; });
  ctx.poll();
  signal.emit(asio::cancellation_type::terminal);
  ctx.poll();
  CHECK(kind_of(first) == errc::cancelled);
  hog.reset();
  ctx.run();
  CHECK_FALSE(second);
  CHECK(pool.in_use() == 0);
}

TEST_CASE("lease pool – use_future and plain callbacks both complete", "[io][pool]") {
  asio::io_context ctx;
  LeasePool pool(ctx.get_executor(), small_pool(8 * KiB));
  std::future<StagingBuffer> f = pool.async_acquire(4 * KiB, asio::use_future);
  std::size_t callback_size = 0;
  pool.async_acquire(4 * KiB, [&](std::exception_ptr ec, StagingBuffer b) {
    REQUIRE_FALSE(ec);
    callback_size = b.size();
  });
  ctx.run();
  StagingBuffer b = f.get();
  CHECK(b.size() == 4 * KiB);
  CHECK(callback_size == 4 * KiB);
  b.reset();
  CHECK(pool.in_use() == 0);
}

namespace {

/// Pages of `memory` resident now (mincore).
std::size_t resident_pages(std::span<const std::byte> memory) {
  std::vector<unsigned char> v(memory.size() / 4096);
  if (::mincore(const_cast<std::byte*>(memory.data()), memory.size(), v.data()) != 0) return SIZE_MAX;
  std::size_t n = 0;
  for (unsigned char c : v) n += c & 1u;
  return n;
}

/// Runs `ctx` until `done()` or 20 s.
template <class Pred>
void run_until(asio::io_context& ctx, Pred done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    ctx.restart();
    ctx.run_one_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

TEST_CASE("lease pool – pages appear on first use and go back after the pool has been idle", "[io][pool]") {
  asio::io_context ctx;
  LeasePool pool(ctx.get_executor(), {.budget = 4 << 20, .release_after = std::chrono::milliseconds(20)});
  CHECK_FALSE(pool.populated());
  CHECK(resident_pages(pool.memory()) == 0);  // reserved, not populated, at construction
  {
    auto b = pool.try_acquire(1 << 20);
    REQUIRE(b);
    std::memset(b->data(), 7, b->size());
    CHECK(pool.populated());
    CHECK(resident_pages(pool.memory()) >= 256);
  }
  run_until(ctx, [&] { return pool.releases() == 1; });
  CHECK(pool.releases() == 1);
  CHECK_FALSE(pool.populated());
  CHECK(resident_pages(pool.memory()) == 0);
  // Used again: fresh zero pages, then released again.
  {
    auto b = pool.try_acquire(8192);
    REQUIRE(b);
    CHECK(std::to_integer<int>(b->data()[0]) == 0);
    b->data()[0] = std::byte{1};
  }
  run_until(ctx, [&] { return pool.releases() == 2; });
  CHECK(pool.releases() == 2);
}

TEST_CASE("lease pool – KeepResident holds the pages, a busy pool keeps them, release_after 0 never releases",
          "[io][pool]") {
  asio::io_context ctx;
  LeasePool pool(ctx.get_executor(), {.budget = 1 << 20, .release_after = std::chrono::milliseconds(10)});
  {
    auto keep = pool.keep_resident();
    pool.try_acquire(4096)->data()[0] = std::byte{1};
    auto later = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    run_until(ctx, [&] { return std::chrono::steady_clock::now() > later; });
    CHECK(pool.releases() == 0);
    CHECK_FALSE(pool.release_if_idle());
    auto held = pool.try_acquire(4096);
    LeasePool::KeepResident moved = std::move(keep);  // the token moves; the pool still stays
    CHECK_FALSE(pool.release_if_idle());
  }
  // The token is gone and nothing is handed out: the timer armed by its release fires.
  run_until(ctx, [&] { return pool.releases() == 1; });
  CHECK(pool.releases() == 1);

  LeasePool never(ctx.get_executor(), {.budget = 1 << 20, .release_after = std::chrono::milliseconds(0)});
  never.try_acquire(4096)->data()[0] = std::byte{1};
  auto later = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  run_until(ctx, [&] { return std::chrono::steady_clock::now() > later; });
  CHECK(never.releases() == 0);
  CHECK(never.populated());
  CHECK(never.release_if_idle());  // on request it still can
}

TEST_CASE("lease pool – destroyed with its idle timer pending, nothing runs against it afterwards", "[io][pool]") {
  asio::io_context ctx;
  {
    LeasePool pool(ctx.get_executor(), {.budget = 1 << 20, .release_after = std::chrono::milliseconds(5)});
    pool.try_acquire(4096)->data()[0] = std::byte{1};
    ctx.restart();
    ctx.poll();  // the timer is armed
  }
  // The cancelled wait runs to its end against no pool (ASan checks the memory), and the
  // loop then runs out of work: no timer keeps it alive.
  ctx.restart();
  ctx.run_for(std::chrono::seconds(5));
  CHECK(ctx.stopped());
}
