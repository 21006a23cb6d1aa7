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
/// increments and a reference-count increment, with no loop. Publishing stores the new
/// pointer into the slot no reader is directed to and redirects readers to it: from that
/// instant every load returns it. Retiring the old pointer needs every reader that could
/// still be copying the old slot to have left (readers stay for nanoseconds, never for their
/// request: they hold their own copy) — but a reader thread preempted inside load() keeps
/// it for a scheduler time slice, so retirement is a separate, non-blocking step
/// (try_retire) that a coroutine can poll, rather than a wait inside the publication.
/// Writers are serialized by a mutex that readers never touch.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

namespace eredu {

/// A shared pointer published by writers and read wait-free (see file comment).
template <class T>
class PublishedPtr {
 public:
  /// Holds nothing: load() returns null until the first publish().
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

  /// Makes `next` what every later load() returns, at once and without waiting for
  /// readers. The replaced pointer is retired by try_retire(); a publication while the
  /// previous one is not yet retired first finishes that retirement (waiting for readers).
  void publish(std::shared_ptr<const T> next) {
    std::lock_guard lock(writer_);
    if (pending_)
      while (!retire_step()) std::this_thread::yield();
    const int side = side_.load(std::memory_order_seq_cst);
    slots_[1 - side] = std::move(next);
    side_.store(1 - side, std::memory_order_seq_cst);
    pending_ = true;
    toggled_ = false;
    old_side_ = side;
    start_version_ = version_.load(std::memory_order_seq_cst);
  }

  /// Retires the pointer the last publish() replaced, if no reader can still be copying it:
  /// then returns it (drop it outside any latency-critical section: it may be the last
  /// reference), else nullopt — try again later. Never waits. With nothing to retire,
  /// returns an empty pointer.
  std::optional<std::shared_ptr<const T>> try_retire() {
    std::lock_guard lock(writer_);
    if (!pending_) return std::shared_ptr<const T>();
    if (!retire_step()) return std::nullopt;
    return std::move(retired_);
  }

  /// publish(), then waits (yielding) until the replaced pointer is retired, and returns it.
  std::shared_ptr<const T> exchange(std::shared_ptr<const T> next) {
    publish(std::move(next));
    for (;;) {
      if (auto old = try_retire()) return std::move(*old);
      std::this_thread::yield();
    }
  }

 private:
  // One attempt at the Left-Right "toggle version and wait", without the waits: first no
  // reader may remain on the indicator readers are about to be moved to, then none on the
  // one they were on. Then the old slot takes the new pointer and the old one is kept in
  // retired_. Call with writer_ held.
  bool retire_step() {
    if (!toggled_) {
      if (readers_[1 - start_version_].load(std::memory_order_seq_cst) != 0) return false;
      version_.store(1 - start_version_, std::memory_order_seq_cst);
      toggled_ = true;
    }
    if (readers_[start_version_].load(std::memory_order_seq_cst) != 0) return false;
    retired_ = std::exchange(slots_[old_side_], slots_[1 - old_side_]);
    pending_ = false;
    return true;
  }

  std::shared_ptr<const T> slots_[2];
  std::atomic<int> side_{0};     // the slot readers copy
  std::atomic<int> version_{0};  // the read-indicator readers announce themselves on
  mutable std::atomic<std::int64_t> readers_[2] = {0, 0};
  std::mutex writer_;
  // Retirement in progress (writer_ held to touch these).
  bool pending_ = false;
  bool toggled_ = false;
  int old_side_ = 0;
  int start_version_ = 0;
  std::shared_ptr<const T> retired_;
};

}  // namespace eredu
