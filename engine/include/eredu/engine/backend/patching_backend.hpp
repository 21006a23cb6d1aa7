#pragma once
/// \file
/// The PatchingBackend concept: an InPlaceBackend whose bound weights the host can read and
/// write where they lie — what InPlaceModelSlot::async_patch needs to compare a new version
/// with the serving one and write only the bytes that changed, with no staged copy.

#include <concepts>
#include <span>

#include "eredu/core/completion.hpp"
#include "eredu/core/unique_function.hpp"
#include "eredu/engine/backend/in_place_backend.hpp"

namespace eredu::engine {

/// A backend whose bound weights are host memory, writable in place. `writable_bytes`
/// throws BackendError when the slot is unbound or its storage cannot be written (a
/// read-only file mapping); `submit_host_work` runs host work (comparing and hashing a
/// chunk) on the executor, off the event loop.
template <class B>
concept PatchingBackend = InPlaceBackend<B> && requires(typename B::Parameter& slot, typename B::Executor& executor) {
  { B::writable_bytes(slot) } -> std::same_as<std::span<std::byte>>;
  { B::submit_host_work(executor, UniqueFunction<void()>{}) } -> std::same_as<Completion>;
};

}  // namespace eredu::engine
