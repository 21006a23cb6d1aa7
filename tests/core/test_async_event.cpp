#include "eredu/core/async_event.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/experimental/deferred.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <catch2/catch.hpp>
#include <future>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "eredu/core/error.hpp"
#include "support/error_kind.hpp"

using namespace eredu;

namespace {

using eredu::test::kind_of;

/// A callback that records its error and counts its calls.
struct Recorder {
  int calls = 0;
  std::exception_ptr error;
  auto handler() {
    return [this](std::exception_ptr e) {
      ++calls;
      error = std::move(e);
    };
  }
};

// Compiled, never run: async_wait is an initiating function for every kind of token.
namespace compile {
[[maybe_unused]] void every_token(AsyncEvent& event) {
  using Signature = void(std::exception_ptr);
  static_assert(asio::completion_token_for<decltype(asio::use_awaitable), Signature>);
  static_assert(std::is_same_v<decltype(event.async_wait(asio::use_awaitable)), asio::awaitable<void>>);
  static_assert(std::is_same_v<decltype(event.async_wait(asio::use_future)), std::future<void>>);
  event.async_wait([](std::exception_ptr) {});
  auto deferred = event.async_wait(asio::experimental::deferred);
  std::move(deferred)([](std::exception_ptr) {});
}
}  // namespace compile

}  // namespace

TEST_CASE("async event – a wait on a set event completes, posted and never inline", "[core][event]") {
  asio::io_context ctx;
  AsyncEvent event(true);
  CHECK(event.is_set());
  Recorder r;
  event.async_wait(asio::bind_executor(ctx, r.handler()));
  CHECK(r.calls == 0);  // posted to the handler's executor, not run here
  ctx.run();
  CHECK(r.calls == 1);
  CHECK_FALSE(r.error);
}

TEST_CASE("async event – reset makes waits pend, set completes every pending wait once", "[core][event]") {
  asio::io_context ctx;
  AsyncEvent event;
  Recorder a, b;
  event.async_wait(asio::bind_executor(ctx, a.handler()));
  event.async_wait(asio::bind_executor(ctx, b.handler()));
  ctx.poll();
  CHECK(a.calls == 0);
  CHECK(event.waiting() == 2);
  event.set();
  event.set();  // no pending wait left: nothing more to complete
  ctx.restart();
  ctx.poll();
  CHECK(a.calls == 1);
  CHECK(b.calls == 1);
  CHECK(event.waiting() == 0);

  event.reset();
  CHECK_FALSE(event.is_set());
  Recorder c;
  event.async_wait(asio::bind_executor(ctx, c.handler()));
  ctx.restart();
  ctx.poll();
  CHECK(c.calls == 0);
  event.set();
  ctx.restart();
  ctx.poll();
  CHECK(c.calls == 1);
}

TEST_CASE("async event – a wait set from another thread resumes the coroutine on its own executor", "[core][event]") {
  asio::io_context ctx;
  AsyncEvent event;
  std::thread::id resumed_on;
  auto done = asio::co_spawn(
      ctx,
      [](AsyncEvent& e, std::thread::id& where) -> asio::awaitable<void> {
        co_await e.async_wait(asio::use_awaitable);
        where = std::this_thread::get_id();
      }(event, resumed_on),
      asio::use_future);
  ctx.poll();  // the coroutine is now waiting
  REQUIRE(event.waiting() == 1);
  std::thread setter([&] { event.set(); });
  setter.join();
  CHECK(resumed_on == std::thread::id());  // not resumed inline on the setter
  ctx.restart();
  ctx.run();
  done.get();
  CHECK(resumed_on == std::this_thread::get_id());
}

TEST_CASE("async event – every cancellation type fails only that wait, as errc::cancelled", "[core][event][cancel]") {
  const auto type =
      GENERATE(asio::cancellation_type::terminal, asio::cancellation_type::partial, asio::cancellation_type::total);
  asio::io_context ctx;
  AsyncEvent event;
  asio::cancellation_signal signal;
  Recorder cancelled, other;
  event.async_wait(asio::bind_cancellation_slot(signal.slot(), asio::bind_executor(ctx, cancelled.handler())));
  event.async_wait(asio::bind_executor(ctx, other.handler()));
  signal.emit(type);
  ctx.poll();
  REQUIRE(cancelled.calls == 1);
  CHECK(kind_of(cancelled.error) == errc::cancelled);
  CHECK(other.calls == 0);
  CHECK(event.waiting() == 1);
  CHECK_FALSE(event.is_set());  // the event is as it was
  event.set();
  ctx.restart();
  ctx.poll();
  CHECK(other.calls == 1);
  CHECK_FALSE(other.error);
  CHECK(cancelled.calls == 1);
  signal.emit(type);  // after completion: nothing happens
  ctx.restart();
  ctx.poll();
  CHECK(cancelled.calls == 1);
}

TEST_CASE("async event – destroying the event fails its pending waits as cancelled", "[core][event]") {
  asio::io_context ctx;
  Recorder r;
  auto deferred = [&] {
    AsyncEvent event;
    event.async_wait(asio::bind_executor(ctx, r.handler()));
    return event.async_wait(asio::experimental::deferred);
  }();
  ctx.poll();
  REQUIRE(r.calls == 1);
  CHECK(kind_of(r.error) == errc::cancelled);
  // A deferred wait launched after the event is gone fails the same way, touching nothing freed.
  Recorder late;
  std::move(deferred)(asio::bind_executor(ctx, late.handler()));
  ctx.restart();
  ctx.poll();
  REQUIRE(late.calls == 1);
  CHECK(kind_of(late.error) == errc::cancelled);
}

TEST_CASE("async event – as a condition variable with a mutex it loses no wake-up across threads",
          "[core][event][stress]") {
  // A consumer coroutine waits for a counter that two producer threads raise; each increment
  // sets the event under the mutex, the consumer resets it under the mutex before waiting.
  asio::io_context ctx;
  std::mutex mutex;
  int produced = 0;
  AsyncEvent changed;
  constexpr int per_thread = 2000;
  auto consumer = asio::co_spawn(
      ctx,
      [](std::mutex& m, int& count, AsyncEvent& ev) -> asio::awaitable<int> {
        int wakes = 0;
        for (;;) {
          {
            std::lock_guard lock(m);
            if (count == 2 * per_thread) co_return wakes;
            ev.reset();
          }
          co_await ev.async_wait(asio::use_awaitable);
          ++wakes;
        }
      }(mutex, produced, changed),
      asio::use_future);
  ctx.poll();  // the consumer has seen 0 and waits: it needs at least one wake-up
  REQUIRE(changed.waiting() == 1);
  ctx.restart();
  std::thread loop([&] { ctx.run(); });
  std::vector<std::thread> producers;
  for (int t = 0; t < 2; ++t)
    producers.emplace_back([&] {
      for (int i = 0; i < per_thread; ++i) {
        std::lock_guard lock(mutex);
        ++produced;
        changed.set();
      }
    });
  for (auto& p : producers) p.join();
  loop.join();
  const int wakes = consumer.get();
  CHECK(wakes >= 1);               // it finished: no wake-up was lost
  CHECK(wakes <= 2 * per_thread);  // at most one per change: none spurious
}
