#pragma once
/// \file
/// InPlaceGate: InPlaceModelSlot's serving model and the reader/writer gate around it. Readers
/// enter while the gate is open; a swap closes it, waits until the readers in a request have
/// left (an AsyncEvent the last one sets), copies, and reopens it, admitting the reads that
/// arrived meanwhile in order.

#include <asio/awaitable.hpp>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "eredu/core/async_event.hpp"
#include "eredu/core/detail/ignore_cancellation.hpp"
#include "eredu/core/unique_function.hpp"

namespace eredu::engine::detail {

/// The gate of an in-place slot (see file comment). `Reader` is the slot's read handle: built
/// from (shared_ptr<InPlaceGate>, generation), it calls leave() when released.
template <class Model, class Reader>
struct InPlaceGate {
  /// Delivers the outcome of one read request to its handler (posted, never inline).
  using Deliver = UniqueFunction<void(std::exception_ptr, Reader)>;

  /// A gate around `m`, open, with no version bound yet.
  explicit InPlaceGate(Model m) : model(std::move(m)) {}

  Model model;  ///< the serving model, whose storage swaps overwrite
  std::mutex mutex;
  std::size_t readers = 0;       ///< readers in a request
  bool writing = false;          ///< a swap is draining readers or copying
  std::uint64_t generation = 0;  ///< the version the weights hold
  std::exception_ptr torn;       ///< a failed copy: reads fail until a swap succeeds
  std::vector<Deliver> waiting;  ///< reads that arrived while writing, in order
  /// Set by the last reader to leave while a swap is writing; the swap resets it under the
  /// mutex before it waits.
  AsyncEvent drained;

  /// Admits a read now, queues it while a swap writes, or fails it on a torn gate.
  static void enter(const std::shared_ptr<InPlaceGate>& g, Deliver deliver) {
    std::unique_lock lock(g->mutex);
    if (g->torn) {
      std::exception_ptr e = g->torn;
      lock.unlock();
      deliver(e, Reader());
    } else if (g->writing) {
      g->waiting.push_back(std::move(deliver));
    } else {
      ++g->readers;
      const std::uint64_t generation = g->generation;
      lock.unlock();
      deliver(nullptr, Reader(g, generation));
    }
  }

  /// A read now, or nullopt while a swap writes; rethrows a torn gate's error.
  static std::optional<Reader> try_enter(const std::shared_ptr<InPlaceGate>& g) {
    std::lock_guard lock(g->mutex);
    if (g->torn) std::rethrow_exception(g->torn);
    if (g->writing) return std::nullopt;
    ++g->readers;
    return Reader(g, g->generation);
  }

  /// Ends one read; the last one to leave while a swap writes lets the swap go on.
  static void leave(const std::shared_ptr<InPlaceGate>& g) {
    std::lock_guard lock(g->mutex);
    if (--g->readers == 0 && g->writing) g->drained.set();
  }

  /// Closes the gate to new readers, then waits until every reader in a request has left.
  /// The wait ignores the swap's cancellation: the swap always reopens the gate afterwards.
  static asio::awaitable<void> close_and_drain(std::shared_ptr<InPlaceGate> g) {
    bool wait = false;
    {
      std::lock_guard lock(g->mutex);
      g->writing = true;
      if (g->readers > 0) {
        g->drained.reset();
        wait = true;
      }
    }
    if (!wait) co_return;
    try {
      co_await g->drained.async_wait(eredu::detail::use_awaitable_ignoring_cancellation());
    } catch (...) {
      // Only a destroyed event fails a wait, and the gate (its owner) is alive here.
    }
  }

  /// Records the copy's outcome (a torn gate, or one more generation), reopens the gate and
  /// admits the reads that waited.
  static void open(const std::shared_ptr<InPlaceGate>& g, std::exception_ptr torn) { reopen(g, true, std::move(torn)); }

  /// Reopens the gate after a write that was undone: the weights hold the version they held
  /// (a torn gate stays torn). Admits the reads that waited.
  static void reopen_unchanged(const std::shared_ptr<InPlaceGate>& g) { reopen(g, false, nullptr); }

  /// The version the weights hold.
  static std::uint64_t current_generation(const std::shared_ptr<InPlaceGate>& g) {
    std::lock_guard lock(g->mutex);
    return g->generation;
  }

 private:
  /// Reopens the gate; `wrote`: records the write's outcome `torn` first (see open).
  static void reopen(const std::shared_ptr<InPlaceGate>& g, bool wrote, std::exception_ptr torn) {
    std::vector<Deliver> admitted;
    std::uint64_t generation = 0;
    {
      std::lock_guard lock(g->mutex);
      if (wrote) {
        g->torn = std::move(torn);
        if (!g->torn) ++g->generation;
      }
      g->writing = false;
      admitted.swap(g->waiting);
      torn = g->torn;
      generation = g->generation;
      if (!torn) g->readers += admitted.size();
    }
    for (Deliver& d : admitted) torn ? d(torn, Reader()) : d(nullptr, Reader(g, generation));
  }
};

}  // namespace eredu::engine::detail
