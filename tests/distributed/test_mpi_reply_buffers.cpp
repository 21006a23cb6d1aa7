// The memory two-sided replies are received into (backends/mpi/src/live/reply_buffers.hpp,
// private to eredu::mpi): buffers within the budget, a request that does not fit waiting until
// one comes back, buffers kept for the next replies, and a buffer lost to MPI counted for good,
// so that a request it leaves no room for fails at once instead of waiting. It runs on every
// rank of the MPI launches, each alone.
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <catch2/catch.hpp>
#include <cstddef>
#include <exception>
#include <optional>

#include "eredu/core/error.hpp"
#include "live/reply_buffers.hpp"
#include "support/error_kind.hpp"

using namespace eredu;
using eredu::mpi::detail::MessageBuffer;
using eredu::mpi::detail::ReplyBuffers;

namespace {

/// Spawns an acquisition of `size` bytes from `replies` on `ctx`: `out` holds the buffer once
/// it has one, `error` the failure.
void spawn_acquire(asio::io_context& ctx, ReplyBuffers& replies, std::size_t size, std::optional<MessageBuffer>& out,
                   std::exception_ptr& error) {
  asio::co_spawn(
      ctx, [&replies, size, &out]() -> asio::awaitable<void> { out = co_await replies.acquire(size); },
      [&error](std::exception_ptr e) { error = e; });
}

}  // namespace

TEST_CASE("reply buffers – within the budget, waited for when in use, kept, and lost ones counted", "[mpi][wire]") {
  asio::io_context ctx;
  ReplyBuffers replies(4096);
  std::optional<MessageBuffer> a, b, c;
  std::exception_ptr ea, eb, ec;
  spawn_acquire(ctx, replies, 3000, a, ea);
  ctx.run();
  ctx.restart();
  REQUIRE(a);
  CHECK(a->capacity() >= 3000);
  CHECK(replies.high_water() == 3000);

  // 3000 + 2000 > 4096: the second waits while the first is out.
  spawn_acquire(ctx, replies, 2000, b, eb);
  ctx.poll();
  CHECK_FALSE(b);
  CHECK_FALSE(eb);
  std::byte* first = a->data();
  replies.release(std::move(*a));
  ctx.run();
  ctx.restart();
  REQUIRE(b);
  CHECK_FALSE(eb);
  CHECK(b->data() == first);  // the kept buffer, not a new one
  CHECK(replies.high_water() <= replies.budget());

  // Lost to MPI: its 3000 bytes never come back, so 2000 more can never fit.
  replies.lose(b->capacity());
  b.reset();
  spawn_acquire(ctx, replies, 2000, c, ec);
  ctx.run();
  CHECK_FALSE(c);
  CHECK(kind_of(ec) == errc::exceeds_budget);
  CHECK(replies.high_water() <= replies.budget());
}

TEST_CASE("reply buffers – a waiting request fails at once when a lost buffer leaves it no room", "[mpi][wire]") {
  asio::io_context ctx;
  ReplyBuffers replies(4096);
  std::optional<MessageBuffer> a, b;
  std::exception_ptr ea, eb;
  spawn_acquire(ctx, replies, 3000, a, ea);
  ctx.run();
  ctx.restart();
  REQUIRE(a);
  spawn_acquire(ctx, replies, 2000, b, eb);
  ctx.poll();
  CHECK_FALSE(b);
  replies.lose(a->capacity());  // the one it waited for stays with MPI
  ctx.run();
  CHECK_FALSE(b);
  CHECK(kind_of(eb) == errc::exceeds_budget);
}
