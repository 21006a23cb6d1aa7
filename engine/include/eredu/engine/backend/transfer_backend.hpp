#pragma once
/// \file
/// The TransferBackend concept: move a materialized weight to backend-owned host storage
/// and back without changing its meaning (the seed's `TransferBackend`), so a unit can be
/// parked in host memory and promoted again without re-reading the checkpoint.

#include <concepts>
#include <utility>

#include "eredu/core/completion.hpp"
#include "eredu/engine/backend/parameter_backend.hpp"
#include "eredu/engine/backend/submission_backend.hpp"

namespace eredu::engine {

/// A backend with host residency. `promote` and `demote` return the destination at once
/// together with the Completion of the copy; the copy retains its source and destination
/// storage until it completes, and the destination must not be read before then.
template <class B>
concept TransferBackend = ParameterBackend<B> && SubmissionBackend<B> && requires {
  typename B::HostBuffer;
} && requires(typename B::Executor& executor, const typename B::HostBuffer& host,
              const typename B::MaterializedWeight& weight) {
  { B::promote(executor, host) } -> std::same_as<std::pair<typename B::MaterializedWeight, Completion>>;
  { B::demote(executor, weight) } -> std::same_as<std::pair<typename B::HostBuffer, Completion>>;
};

}  // namespace eredu::engine
