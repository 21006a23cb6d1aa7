#pragma once
/// \file
/// eredu::PublishedPtr<T>: a std::shared_ptr<const T> that writers replace and any number of
/// readers take without ever waiting — wait-free reads by the Left-Right technique
/// (Ramalhete and Correia).
///
/// Why not std::atomic<std::shared_ptr>: libstdc++ 12 implements it with a lock bit that
/// readers take too (a reader spins while a writer holds it), and its load() releases that
/// bit with memory_order_relaxed, so the reader's copy of the pointer is not ordered before
/// the next writer's store (ThreadSanitizer reports it, rightly, as a race).
///
/// How: the pointer is kept in two slots. A reader announces itself on one of two
/// read-indicators, copies the slot readers are directed to, and leaves — a few atomic
/// increments and a reference-count increment, with no loop. A writer stores the new pointer
/// into the slot no reader is directed to, redirects readers to it, waits until no reader
/// can still be copying the old slot (readers stay in it for nanoseconds, never for their
/// request: they hold their own copy), then updates the old slot too. Writers are
/// serialized by a mutex; readers never touch it.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

namespace eredu {

/// A shared pointer published by writers and read wait-free (see file comment).
template <class T>
class PublishedPtr {
 public:
  /// Holds nothing: load() returns null until the first store().
  PublishedPtr() = default;
  PublishedPtr(const PublishedPtr&) = delete;
  PublishedPtr& operator=(const PublishedPtr&) = delete;

  /// The current pointer; wait-free.
  std::shared_ptr<const T> load() const noexcept {
    const int vi = version_.load(std::memory_order_seq_cst);
    readers_[vi].fetch_add(1, std::memory_order_seq_cst);
    std::shared_ptr<const T> copy = slots_[side_.load(std::memory_order_seq_cst)];
    readers_[vi].fetch_sub(1, std::memory_order_seq_cst);
    return copy;
  }

  /// Publishes `next` and returns the pointer it replaces (drop it outside any latency-
  /// critical section: it may be the last reference). Waits only for readers in load().
  std::shared_ptr<const T> exchange(std::shared_ptr<const T> next) {
    std::lock_guard lock(writer_);
    const int side = side_.load(std::memory_order_seq_cst);
    slots_[1 - side] = next;
    side_.store(1 - side, std::memory_order_seq_cst);
    // Two toggles of the read-indicator version make sure that no reader that could have
    // seen the old side is still copying it.
    const int vi = version_.load(std::memory_order_seq_cst);
    wait_empty(1 - vi);
    version_.store(1 - vi, std::memory_order_seq_cst);
    wait_empty(vi);
    std::shared_ptr<const T> old = std::exchange(slots_[side], std::move(next));
    return old;
  }

 private:
  void wait_empty(int vi) const noexcept {
    while (readers_[vi].load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
  }

  std::shared_ptr<const T> slots_[2];
  std::atomic<int> side_{0};         // the slot readers copy
  std::atomic<int> version_{0};      // the read-indicator readers announce themselves on
  mutable std::atomic<std::int64_t> readers_[2] = {0, 0};
  std::mutex writer_;
};

}  // namespace eredu
