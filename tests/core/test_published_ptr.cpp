// PublishedPtr: readers always get a whole published value, never a freed one, while
// writers replace it concurrently; replaced values are freed once their last reader drops them.
#include "eredu/core/published_ptr.hpp"

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>
#include <utility>
#include <vector>

namespace {

/// A value whose two halves must agree; a reader seeing them differ saw a torn or freed value.
struct Pair {
  explicit Pair(std::uint64_t v) : a(v), b(v) { live.fetch_add(1); }
  ~Pair() {
    a = b + 1;  // a freed-and-reused value would fail the check
    live.fetch_sub(1);
  }
  std::uint64_t a, b;
  static inline std::atomic<int> live{0};
};

}  // namespace

TEST_CASE("published pointer – readers see whole values while writers replace them", "[core][published]") {
  {
    eredu::PublishedPtr<Pair> cell;
    CHECK(cell.load() == nullptr);
    CHECK(cell.exchange(std::make_shared<const Pair>(1)) == nullptr);
    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> reads{0}, torn{0}, backwards{0};
    std::atomic<int> running{0};
    std::vector<std::thread> readers;
    for (int r = 0; r < 3; ++r)
      readers.emplace_back([&] {
        std::uint64_t last = 0;
        bool counted = false;  // this reader has read once: writes may start
        while (!stop.load(std::memory_order_relaxed)) {
          auto p = cell.load();
          if (p->a != p->b) torn.fetch_add(1);
          if (p->a < last) backwards.fetch_add(1);  // one writer: values only grow
          last = p->a;
          reads.fetch_add(1, std::memory_order_relaxed);
          if (!std::exchange(counted, true)) running.fetch_add(1);
        }
      });
    // Writes start once every reader is reading (a loaded machine may start threads late).
    while (running.load() < 3) std::this_thread::yield();
    std::uint64_t replaced = 0;
    for (std::uint64_t v = 2; v <= 3000; ++v) {
      auto old = cell.exchange(std::make_shared<const Pair>(v));
      replaced += old->a == v - 1 ? 1 : 0;
    }
    stop = true;
    for (auto& t : readers) t.join();
    CHECK(torn.load() == 0);
    CHECK(backwards.load() == 0);
    CHECK(replaced == 2999);  // each exchange returned exactly its predecessor
    CHECK(reads.load() > 0);
    CHECK(cell.load()->a == 3000);
    CHECK(Pair::live.load() == 1);  // every replaced value was freed
  }
  CHECK(Pair::live.load() == 0);
}

TEST_CASE("published pointer – publish is immediate, retirement hands back the predecessor once", "[core][published]") {
  eredu::PublishedPtr<int> cell;
  auto nothing = cell.try_retire();
  REQUIRE(nothing.has_value());
  CHECK(*nothing == nullptr);  // nothing was pending
  cell.publish(std::make_shared<const int>(1));
  cell.publish(std::make_shared<const int>(2));  // finishes the first publication's retirement itself
  CHECK(*cell.load() == 2);
  auto first_retired = cell.try_retire();  // no reader: retires at once
  REQUIRE(first_retired.has_value());
  REQUIRE(*first_retired != nullptr);
  CHECK(**first_retired == 1);
  auto again = cell.try_retire();
  REQUIRE(again.has_value());
  CHECK(*again == nullptr);
  std::shared_ptr<const int> held = cell.load();  // a reader keeps its copy after retirement
  auto old = cell.exchange(std::make_shared<const int>(3));
  CHECK(old == held);
  CHECK(*held == 2);
  CHECK(*cell.load() == 3);
}
