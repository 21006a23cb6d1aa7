#pragma once
/// \file
/// The ReservingBackend concept: a ParameterBackend that, told how many bytes a unit's owners
/// hold before any of them starts, sets its allocator up for all of them at once. The CPU
/// backend maps their address space in one call: an mmap or munmap during the unit's reads
/// takes the process's mmap lock, which the reads' page faults into fresh storage wait on
/// (measured: a hot first load 15% slower, docs/performance.md). Optional: without it each
/// realization allocates as it starts.

#include <concepts>
#include <cstdint>

#include "eredu/engine/backend/parameter_backend.hpp"

namespace eredu::engine {

/// A backend that can prepare for `bytes` of weights about to be materialized:
/// `B::reserve_storage(context, bytes)`, which must not throw (a reservation that fails
/// leaves the allocations to happen one by one).
template <class B>
concept ReservingBackend = ParameterBackend<B> &&
    requires(typename B::MaterializationContext& context, std::uint64_t bytes) {
  { B::reserve_storage(context, bytes) }
  noexcept->std::same_as<void>;
};

}  // namespace eredu::engine
