#pragma once
// The model slot conformance suite: what every hot-swap slot (ModelSlot, InPlaceModelSlot,
// DistributedModelSlot) does alike, because all three run the one swap core
// (engine/detail/swap_core.hpp), written once as Catch2 TEMPLATE_TEST_CASEs over slot adapters.
// A slot's test .cpp defines its adapter, then
//
//   #define EREDU_SLOT_ADAPTERS eredu::test::DoubleBufferedSlot, eredu::test::InPlaceSlot
//   #include "conformance/slot_conformance.hpp"
//
// What every slot is checked for:
//  * a swap publishes the whole new version with the next generation, and swapping back
//    serves the first version again, bit for bit;
//  * a checksum mismatch, a canary's rejection and a cancellation each fail the swap with
//    their own kind and leave the serving version as it was, bit for bit, and the next swap
//    commits;
//  * matching checksums let the version through and count the bytes they verified, and the
//    canary sees the new version before anyone can read it;
//  * a second swap while one runs is refused (swap_in_progress), and the first still commits;
//  * what a swap allocates for itself (its copy of the plan, its cancellation flag) comes from
//    its handler's associated allocator.
// (Rollback is DistributedModelSlot's alone: tests/distributed/test_mpi_swap.cpp.)
//
// An adapter `S` gives, over one slot and two versions of one checkpoint (A and B, of the same
// tensors and sizes):
//  * `S::Model`, `S::Report`, `S::name`;
//  * `source_a()`, `source_b()`: open sources of A and B (any io::ByteSource the slot reads:
//    a CheckpointSource, or test::VectorSource to run the cases from memory);
//    `checkpoint_a()`, `checkpoint_b()`: their CpuCheckpoints; `tensors()`: the tensor names a
//    checksum set covers (from a source other than a checkpoint, only tensors the backend
//    hashes where they land: the others need a re-read of the file);
//  * `async_swap(source, options, token)`, `run(future)` (runs the loop until it is ready)
//    and `poll_one()` (runs one handler);
//  * `generation()`, `swapping()`, `tag()` (a digest of every byte the serving version holds,
//    empty before the first swap) and `static tag_of(model)`;
//  * `static cause(const Error&)`: the kind of this process's own failure in a failed swap's
//    error (for the distributed slot, the kind its rank voted with).

#ifndef EREDU_SLOT_ADAPTERS
#error "define EREDU_SLOT_ADAPTERS (the adapter types) before including slot_conformance.hpp"
#endif

#include <asio/awaitable.hpp>
#include <asio/bind_allocator.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "eredu/core/error.hpp"
#include "eredu/engine/serving/swap_options.hpp"
#include "eredu/io/integrity/checksums.hpp"
#include "eredu/io/integrity/sha256.hpp"

namespace eredu::test::slot_conformance {

/// The digests of every tensor of `ckpt` that `S` names.
template <class S, class Checkpoint>
io::Checksums checksums_of(const Checkpoint& ckpt) {
  io::Checksums sums;
  for (const std::string& t : S::tensors()) sums.add(t, io::sha256_hex(ckpt.bytes(t)));
  return sums;
}

/// Allocations made through a CountingAllocator.
inline std::atomic<int> counted_allocations{0};

/// std::allocator, counting what it allocates: a handler's associated allocator.
template <class T>
struct CountingAllocator {
  using value_type = T;  ///< what it allocates
  CountingAllocator() = default;
  /// From the allocator of another type.
  template <class U>
  CountingAllocator(const CountingAllocator<U>&) noexcept {}
  /// Counts, then allocates.
  T* allocate(std::size_t n) {
    counted_allocations.fetch_add(1);
    return std::allocator<T>().allocate(n);
  }
  /// Frees.
  void deallocate(T* p, std::size_t n) noexcept { std::allocator<T>().deallocate(p, n); }
  /// Every CountingAllocator frees what another allocated.
  friend bool operator==(const CountingAllocator&, const CountingAllocator&) noexcept { return true; }
};

/// Runs a swap of `slot` to `source` that must fail; returns its error's cause (S::cause).
template <class S, class Source>
errc failed_swap(S& slot, Source& source, engine::SwapOptions<typename S::Model> options = {}) {
  try {
    auto f = slot.async_swap(source, std::move(options), asio::use_future);
    slot.run(f);
  } catch (const Error& e) {
    INFO(e.what());
    return S::cause(e);
  }
  FAIL("the swap succeeded");
  return errc::backend_failure;
}

/// Runs a swap of `slot` to `source` that must succeed.
template <class S, class Source>
typename S::Report swap(S& slot, Source& source, engine::SwapOptions<typename S::Model> options = {}) {
  auto f = slot.async_swap(source, std::move(options), asio::use_future);
  return slot.run(f);
}

}  // namespace eredu::test::slot_conformance

TEMPLATE_TEST_CASE("slot conformance – a swap publishes the whole new version, with the next generation",
                   "[slot_conformance][swap]", EREDU_SLOT_ADAPTERS) {
  using namespace eredu::test::slot_conformance;
  TestType slot;
  INFO(TestType::name);
  CHECK(slot.generation() == 0);
  CHECK(slot.tag().empty());
  const auto r1 = swap(slot, slot.source_a());
  CHECK(r1.generation == 1);
  CHECK(r1.bytes > 0);
  CHECK(slot.generation() == 1);
  const std::string tag_a = slot.tag();
  REQUIRE_FALSE(tag_a.empty());

  const auto r2 = swap(slot, slot.source_b());
  CHECK(r2.generation == 2);
  CHECK(r2.bytes == r1.bytes);
  const std::string tag_b = slot.tag();
  CHECK(tag_b != tag_a);

  // Back to A: every byte of A again, none of B.
  CHECK(swap(slot, slot.source_a()).generation == 3);
  CHECK(slot.tag() == tag_a);
  CHECK_FALSE(slot.swapping());
}

TEMPLATE_TEST_CASE("slot conformance – a failed verify, canary or cancellation keeps the old version, bit for bit",
                   "[slot_conformance][swap]", EREDU_SLOT_ADAPTERS) {
  using namespace eredu;
  using namespace eredu::test::slot_conformance;
  TestType slot;
  INFO(TestType::name);
  swap(slot, slot.source_a());
  const std::string before = slot.tag();
  REQUIRE_FALSE(before.empty());

  SECTION("a checksum does not match") {
    // A's digests, B's bytes.
    CHECK(failed_swap(slot, slot.source_b(), {.checksums = checksums_of<TestType>(slot.checkpoint_a())}) ==
          errc::checksum_mismatch);
  }
  SECTION("the canary rejects the new version it sees") {
    std::string probed;
    CHECK(
        failed_swap(slot, slot.source_b(), {.canary = [&](const typename TestType::Model& m) -> asio::awaitable<void> {
                      probed = TestType::tag_of(m);
                      throw std::runtime_error("probe output is NaN");
                      co_return;
                    }}) == errc::canary_failed);
    CHECK_FALSE(probed.empty());
    CHECK(probed != before);  // the canary saw B, which never served
  }
  SECTION("the swap is cancelled") {
    asio::cancellation_signal cancel;
    auto f = slot.async_swap(slot.source_b(), {}, asio::bind_cancellation_slot(cancel.slot(), asio::use_future));
    cancel.emit(asio::cancellation_type::terminal);
    errc kind = errc::backend_failure;
    try {
      slot.run(f);
      FAIL("a cancelled swap succeeded");
    } catch (const Error& e) {
      INFO(e.what());
      kind = TestType::cause(e);
    }
    CHECK(kind == errc::cancelled);
  }

  CHECK(slot.generation() == 1);
  CHECK(slot.tag() == before);
  CHECK_FALSE(slot.swapping());
  // The next good swap commits.
  CHECK(swap(slot, slot.source_b()).generation == 2);
  CHECK(slot.tag() != before);
}

TEMPLATE_TEST_CASE("slot conformance – matching checksums and a passing canary let the version through",
                   "[slot_conformance][swap]", EREDU_SLOT_ADAPTERS) {
  using namespace eredu::test::slot_conformance;
  TestType slot;
  INFO(TestType::name);
  const auto r = swap(slot, slot.source_a(), {.checksums = checksums_of<TestType>(slot.checkpoint_a())});
  CHECK(r.generation == 1);
  CHECK(r.verified_bytes > 0);
  std::string probed;
  swap(slot, slot.source_b(), {.canary = [&](const typename TestType::Model& m) -> asio::awaitable<void> {
         probed = TestType::tag_of(m);
         co_return;
       }});
  CHECK(slot.generation() == 2);
  CHECK(probed == slot.tag());  // the canary saw exactly what now serves
}

TEMPLATE_TEST_CASE("slot conformance – a second swap while one runs is refused, and the first commits",
                   "[slot_conformance][swap]", EREDU_SLOT_ADAPTERS) {
  using namespace eredu;
  using namespace eredu::test::slot_conformance;
  TestType slot;
  INFO(TestType::name);
  swap(slot, slot.source_a());
  const std::string tag_a = slot.tag();
  auto first = slot.async_swap(slot.source_b(), {}, asio::use_future);
  slot.poll_one();  // the first swap has claimed the slot
  CHECK(slot.swapping());
  CHECK(failed_swap(slot, slot.source_a()) == errc::swap_in_progress);
  CHECK(slot.run(first).generation == 2);
  CHECK(slot.tag() != tag_a);
  CHECK_FALSE(slot.swapping());
}

TEMPLATE_TEST_CASE("slot conformance – a swap allocates its own state with the handler's associated allocator",
                   "[slot_conformance][swap]", EREDU_SLOT_ADAPTERS) {
  using namespace eredu::test::slot_conformance;
  TestType slot;
  INFO(TestType::name);
  std::promise<typename TestType::Report> done;
  std::future<typename TestType::Report> result = done.get_future();
  const int before = counted_allocations.load();
  slot.async_swap(
      slot.source_a(), {},
      asio::bind_allocator(CountingAllocator<void>(), [&done](std::exception_ptr e, typename TestType::Report r) {
        if (e)
          done.set_exception(e);
        else
          done.set_value(std::move(r));
      }));
  CHECK(slot.run(result).generation == 1);
  CHECK(counted_allocations.load() > before);
}
