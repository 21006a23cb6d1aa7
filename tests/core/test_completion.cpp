#include "eredu/core/completion.hpp"

#include <asio/bind_allocator.hpp>
#include <asio/bind_executor.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <thread>

#include "eredu/core/error.hpp"
#include "support/error_kind.hpp"

// Allocation failure on demand, per thread: this executable's operator new throws
// std::bad_alloc on a thread that set `refuse_allocations`, as it does when the address space
// is exhausted (RLIMIT_AS). Replaced with the matching deletes, so that sanitizers see
// malloc/free pairs.
namespace {
thread_local bool refuse_allocations = false;
}  // namespace

#if defined(__GNUC__) && !defined(__clang__)
// g++ pairs the inlined replacement new (malloc) with the replacement delete (free) across
// call sites and calls them mismatched: they are the matching pair.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace {
void* allocate(std::size_t n) noexcept { return refuse_allocations ? nullptr : std::malloc(n ? n : 1); }
}  // namespace

// Every unaligned form, so that none pairs with a sanitizer's own (ASan checks the pairs).
void* operator new(std::size_t n) {
  if (void* p = allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

using namespace eredu;

namespace {

/// Refuses every allocation of the calling thread while alive.
struct RefuseAllocations {
  RefuseAllocations() { refuse_allocations = true; }
  ~RefuseAllocations() { refuse_allocations = false; }
  RefuseAllocations(const RefuseAllocations&) = delete;
  RefuseAllocations& operator=(const RefuseAllocations&) = delete;
};

using eredu::test::kind_of;
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

TEST_CASE("completion – a callback that throws is dropped, the others run and the process goes on",
          "[core][completion][limits]") {
  CompletionSource source;
  Completion c = source.completion();
  int ran = 0;
  CompletionSource downstream;  // held by the failing callback: it fails when that is dropped
  Completion chained = downstream.completion();
  c.on_complete([held = std::move(downstream)](std::exception_ptr) mutable {
    throw std::bad_alloc();  // what an allocation inside a callback throws under RLIMIT_AS
  });
  c.on_complete([&](std::exception_ptr) { ++ran; });
  source.complete();  // noexcept: std::terminate if the exception escaped
  CHECK(c.ready());
  CHECK(ran == 1);
  REQUIRE(chained.ready());
  CHECK(kind_of(chained.error()) == errc::cancelled);
}

TEST_CASE("completion – typed_failure: std::bad_alloc becomes out_of_memory, other errors pass unchanged",
          "[core][completion][limits]") {
  CHECK_FALSE(typed_failure(nullptr));
  const std::exception_ptr oom = typed_failure(std::make_exception_ptr(std::bad_alloc()));
  CHECK(kind_of(oom) == errc::out_of_memory);
  CHECK(kind_of(out_of_memory_error()) == errc::out_of_memory);
  const std::exception_ptr other = std::make_exception_ptr(std::runtime_error("x"));
  CHECK(typed_failure(other) == other);
}

TEST_CASE("completion – a source destroyed on a thread that cannot allocate still fails its completion",
          "[core][completion][limits]") {
  Completion c;
  {
    auto source = std::make_unique<CompletionSource>();
    c = source->completion();
    RefuseAllocations refuse;
    source.reset();  // the destructor builds no error: a prebuilt one is used
  }
  REQUIRE(c.ready());
  CHECK(kind_of(c.error()) == errc::cancelled);
}

TEST_CASE("completion – async_wait's delivery allocates nothing on the completing thread",
          "[core][completion][limits]") {
  // The memory for the post is reserved when the coroutine starts waiting: a TBB worker that
  // completes the work while memory has run out still resumes it (before, the post's
  // std::bad_alloc escaped the noexcept completion and aborted the process).
  asio::io_context ctx;
  CompletionSource source;
  Completion c = source.completion();
  bool resumed = false;
  asio::co_spawn(
      ctx,
      [](Completion done, bool& flag) -> asio::awaitable<void> {
        co_await done.async_wait(asio::use_awaitable);
        flag = true;
      }(c, resumed),
      [](std::exception_ptr) {});
  ctx.poll();  // waiting now
  std::thread producer([s = std::move(source)]() mutable {
    RefuseAllocations refuse;
    s.complete();
  });
  producer.join();
  ctx.run();
  CHECK(resumed);
}

namespace {

/// Counts what is allocated through it (every copy shares the counts).
struct AllocationCounts {
  std::atomic<long> allocations{0};
  std::atomic<long> live_bytes{0};
};
template <class T>
struct CountingAllocator {
  using value_type = T;
  AllocationCounts* counts;
  explicit CountingAllocator(AllocationCounts* c) noexcept : counts(c) {}
  template <class U>
  CountingAllocator(const CountingAllocator<U>& other) noexcept : counts(other.counts) {}
  T* allocate(std::size_t n) {
    ++counts->allocations;
    counts->live_bytes += static_cast<long>(n * sizeof(T));
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    counts->live_bytes -= static_cast<long>(n * sizeof(T));
    std::allocator<T>().deallocate(p, n);
  }
  friend bool operator==(const CountingAllocator& a, const CountingAllocator& b) noexcept {
    return a.counts == b.counts;
  }
};

}  // namespace

TEST_CASE("completion – async_wait takes its memory from the handler's associated allocator", "[core][completion]") {
  // The wrapper that carries the handler to the completing thread, and the reserve for the
  // post back to its executor, are the operation's memory: Asio's model says they come from
  // the handler's associated allocator.
  asio::io_context ctx;
  AllocationCounts counts;
  CompletionSource source;
  Completion c = source.completion();
  bool called = false;
  // Bound to the loop too: a handler with no executor of its own would run on Asio's system
  // executor's thread, after this test looked.
  c.async_wait(
      asio::bind_executor(ctx, asio::bind_allocator(CountingAllocator<void>(&counts), [&](std::exception_ptr e) {
                            CHECK_FALSE(e);
                            called = true;
                          })));
  ctx.poll();
  CHECK(counts.allocations.load() >= 2);  // the wrapper and the reserve
  CHECK(counts.live_bytes.load() > 0);
  std::thread producer([s = std::move(source)]() mutable { s.complete(); });
  producer.join();
  ctx.run();
  CHECK(called);
  CHECK(counts.live_bytes.load() == 0);  // everything given back, to the same allocator
}
