#include "eredu/core/completion.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <catch2/catch.hpp>
#include <stdexcept>
#include <thread>

#include "eredu/core/error.hpp"

using namespace eredu;

namespace {
errc kind_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err.kind();
  } catch (...) {
    return errc::invalid_argument;
  }
}
}  // namespace

TEST_CASE("completion – pending, then complete, and callbacks run once", "[core][completion]") {
  CompletionSource source;
  Completion c = source.completion();
  CHECK_FALSE(c.ready());
  int calls = 0;
  c.on_complete([&](std::exception_ptr e) { calls += e ? 100 : 1; });
  CHECK(calls == 0);
  source.complete();
  source.fail(std::make_exception_ptr(std::runtime_error("late")));  // ignored: already complete
  CHECK(c.ready());
  CHECK_FALSE(c.error());
  CHECK(calls == 1);
  c.on_complete([&](std::exception_ptr) { calls += 10; });  // already complete: runs inline
  CHECK(calls == 11);
  c.get();
}

TEST_CASE("completion – a destroyed producer fails its completion as cancelled", "[core][completion]") {
  Completion c;
  {
    CompletionSource source;
    c = source.completion();
  }
  REQUIRE(c.ready());
  CHECK(kind_of(c.error()) == errc::cancelled);
  CHECK_THROWS_AS(c.get(), Error);
}

TEST_CASE("completion – wait() blocks until another thread completes", "[core][completion]") {
  CompletionSource source;
  Completion c = source.completion();
  std::thread t([s = std::move(source)]() mutable { s.fail(std::make_exception_ptr(std::runtime_error("boom"))); });
  c.wait();
  t.join();
  CHECK_THROWS_WITH(c.get(), "boom");
}

TEST_CASE("completion – async_wait resumes the coroutine on its own executor, not the completing thread",
          "[core][completion]") {
  asio::io_context ctx;
  CompletionSource source;
  Completion c = source.completion();
  std::thread::id resumed_on;
  bool threw = false;
  asio::co_spawn(
      ctx,
      [](Completion done, std::thread::id& where, bool& failed) -> asio::awaitable<void> {
        try {
          co_await done.async_wait(asio::use_awaitable);
        } catch (const std::runtime_error&) {
          failed = true;
        }
        where = std::this_thread::get_id();
      }(c, resumed_on, threw),
      [](std::exception_ptr) {});
  ctx.poll();  // the coroutine is now waiting
  std::thread producer([s = std::move(source)]() mutable { s.fail(std::make_exception_ptr(std::runtime_error("x"))); });
  producer.join();
  CHECK(resumed_on == std::thread::id());  // not resumed inline on the producer
  ctx.run();
  CHECK(resumed_on == std::this_thread::get_id());
  CHECK(threw);
}

TEST_CASE("completion – when_all waits for every input and reports the root cause", "[core][completion]") {
  CompletionSource a, b, c;
  std::vector<Completion> all{a.completion(), b.completion(), c.completion()};
  Completion joined = when_all(all);
  a.fail(std::make_exception_ptr(Error(errc::cancelled, {}, "stopped")));
  b.complete();
  CHECK_FALSE(joined.ready());  // c still pending
  c.fail(std::make_exception_ptr(Error(errc::io_error, {.file = "f"}, "EIO")));
  REQUIRE(joined.ready());
  CHECK(kind_of(joined.error()) == errc::io_error);  // the cause, not the cancellation it provoked

  CHECK(when_all({}).ready());
  std::vector<Completion> ok{Completion::ready_now(), Completion::ready_now()};
  CHECK_FALSE(when_all(ok).error());
}
