// spawn_operation, the helper behind every multi-step eredu operation: results and errors
// reach every kind of token, cancellation is always eredu::Error(cancelled), the handler runs
// on its own executor, and a deferred operation outlives the call that made it.

#include "eredu/core/detail/spawn_operation.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/experimental/deferred.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <string>
#include <type_traits>

#include "eredu/core/error.hpp"
#include "support/error_kind.hpp"

using namespace eredu;

namespace {

using eredu::test::kind_of;

asio::awaitable<std::string> greet(std::string name) { co_return "hello " + name; }

/// Waits on a long timer: a terminal cancellation makes Asio throw operation_aborted.
asio::awaitable<void> sleep_long() {
  asio::steady_timer timer(co_await asio::this_coro::executor, std::chrono::hours(1));
  co_await timer.async_wait(asio::use_awaitable);
}

/// An initiating function built on spawn_operation, as the library's are.
template <asio::completion_token_for<void(std::exception_ptr, std::string)> Token>
auto async_greet(asio::io_context& ctx, std::string name, Token&& token) {
  return detail::spawn_operation(ctx.get_executor(), greet(std::move(name)), std::forward<Token>(token));
}

static_assert(std::is_same_v<detail::operation_signature_t<void>, void(std::exception_ptr)>);
static_assert(std::is_same_v<detail::operation_signature_t<int>, void(std::exception_ptr, int)>);

}  // namespace

TEST_CASE("spawn operation – the result reaches a callback, a future, a coroutine and a deferred launch",
          "[core][spawn]") {
  asio::io_context ctx;
  std::string by_callback;
  async_greet(ctx, "callback", [&](std::exception_ptr e, std::string s) {
    if (!e) by_callback = std::move(s);
  });
  std::future<std::string> by_future = async_greet(ctx, "future", asio::use_future);
  auto by_coroutine = asio::co_spawn(
      ctx,
      [](asio::io_context& c) -> asio::awaitable<std::string> {
        co_return co_await async_greet(c, "coroutine", asio::use_awaitable);
      }(ctx),
      asio::use_future);
  auto deferred = [&] {
    std::string temporary = "deferred";
    return async_greet(ctx, temporary, asio::experimental::deferred);
  }();  // the call's arguments are gone; the operation holds its own
  std::string by_deferred;
  std::move(deferred)([&](std::exception_ptr e, std::string s) {
    if (!e) by_deferred = std::move(s);
  });
  ctx.run();
  CHECK(by_callback == "hello callback");
  CHECK(by_future.get() == "hello future");
  CHECK(by_coroutine.get() == "hello coroutine");
  CHECK(by_deferred == "hello deferred");
}

TEST_CASE("spawn operation – a cancellation before the first step fails with errc::cancelled",
          "[core][spawn][cancel]") {
  asio::io_context ctx;
  asio::cancellation_signal signal;
  std::exception_ptr error;
  bool done = false;
  detail::spawn_operation(ctx.get_executor(), sleep_long(),
                          asio::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr e) {
                            error = e;
                            done = true;
                          }));
  signal.emit(asio::cancellation_type::terminal);  // before the coroutine has run at all
  ctx.run();
  REQUIRE(done);
  CHECK(kind_of(error) == errc::cancelled);
}

TEST_CASE("spawn operation – a cancellation Asio reports as operation_aborted mid-way is typed too",
          "[core][spawn][cancel]") {
  asio::io_context ctx;
  asio::cancellation_signal signal;
  std::exception_ptr error;
  bool done = false;
  detail::spawn_operation(ctx.get_executor(), sleep_long(),
                          asio::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr e) {
                            error = e;
                            done = true;
                          }));
  ctx.poll();  // the coroutine now waits on its timer
  REQUIRE_FALSE(done);
  signal.emit(asio::cancellation_type::terminal);
  ctx.run();
  REQUIRE(done);
  CHECK(kind_of(error) == errc::cancelled);
}

TEST_CASE("spawn operation – the handler runs on its own executor, not the operation's", "[core][spawn]") {
  asio::io_context work, caller;
  bool delivered = false;
  async_greet(work, "x", asio::bind_executor(caller, [&](std::exception_ptr, std::string) { delivered = true; }));
  work.run();
  CHECK_FALSE(delivered);  // finished on `work`, but the handler belongs to `caller`
  caller.run();
  CHECK(delivered);
}
