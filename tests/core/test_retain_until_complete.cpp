// retain_until_complete: a value lives exactly until its completion finishes — successfully
// or not — and is dropped on the completing thread; move-only values are accepted.

#include "eredu/core/retain_until_complete.hpp"

#include <catch2/catch.hpp>
#include <memory>
#include <stdexcept>
#include <thread>
#include <utility>

#include "eredu/core/completion.hpp"

using namespace eredu;

namespace {

// Move-only; counts the live instances that still own the token.
struct Probe {
  explicit Probe(std::shared_ptr<int> alive) : alive_(std::move(alive)) { ++*alive_; }
  Probe(Probe&& other) noexcept = default;
  Probe& operator=(Probe&&) = delete;
  Probe(const Probe&) = delete;
  ~Probe() {
    if (alive_) --*alive_;
  }
  std::shared_ptr<int> alive_;
};

}  // namespace

TEST_CASE("retain_until_complete – keeps a value until the completion succeeds or fails, then drops it",
          "[core][completion]") {
  auto alive = std::make_shared<int>(0);
  CompletionSource ok, failed;
  retain_until_complete(ok.completion(), Probe(alive));
  retain_until_complete(failed.completion(), Probe(alive));
  CHECK(*alive == 2);
  ok.complete();
  CHECK(*alive == 1);
  failed.fail(std::make_exception_ptr(std::runtime_error("the work failed")));
  CHECK(*alive == 0);
}

TEST_CASE("retain_until_complete – a completion already finished drops the value at once", "[core][completion]") {
  auto alive = std::make_shared<int>(0);
  retain_until_complete(Completion::ready_now(), Probe(alive));
  CHECK(*alive == 0);
}

TEST_CASE("retain_until_complete – the value is dropped on the thread that completes the work", "[core][completion]") {
  struct OnDrop {
    std::thread::id* where;
    OnDrop(OnDrop&& other) noexcept : where(std::exchange(other.where, nullptr)) {}
    explicit OnDrop(std::thread::id* w) : where(w) {}
    ~OnDrop() {
      if (where) *where = std::this_thread::get_id();
    }
  };
  std::thread::id dropped_on;
  CompletionSource source;
  retain_until_complete(source.completion(), OnDrop(&dropped_on));
  std::thread worker([&] { source.complete(); });
  const std::thread::id worker_id = worker.get_id();
  worker.join();
  CHECK(dropped_on == worker_id);
}
