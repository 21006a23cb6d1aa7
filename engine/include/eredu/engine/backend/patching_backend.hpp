#pragma once
/// \file
/// The PatchingBackend concept: an InPlaceBackend whose bound weights the host can read and
/// write where they lie — what InPlaceModelSlot::async_patch needs to compare a new version
/// with the serving one and write only the bytes that changed, with no staged copy.

#include <concepts>
#include <span>

#include "eredu/engine/backend/in_place_backend.hpp"

namespace eredu::engine {

/// A backend whose bound weights are host memory, writable in place. `writable_bytes`
/// throws BackendError when the slot is unbound or its storage cannot be written (a
/// read-only file mapping).
template <class B>
concept PatchingBackend = InPlaceBackend<B> && requires(typename B::Parameter& slot) {
  { B::writable_bytes(slot) } -> std::same_as<std::span<std::byte>>;
};

}  // namespace eredu::engine
