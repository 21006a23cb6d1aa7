#pragma once
/// \file
/// Every requirement the engine places on a backend, in one table, marked required or
/// optional (as ggml's `ggml_backend_i` marks its members), with what the engine does when an
/// optional one is missing. Each requirement is a concept in its own header; this one gathers
/// them and answers, for a backend type, which it meets (BackendFeatures).
///
/// Each row: status, concept (header under eredu/engine/), what it provides; then what the
/// engine does for a backend without an optional one.
///
///  - required: ParameterBackend (backend/parameter_backend.hpp): slots, materialize, bind.
///  - optional: `B::buffer_traits`, a BufferTraits (orchestration/placement.hpp): where
///    weights land. Without: host memory a source only streams into (buffer_traits_of).
///  - optional: SubmissionBackend (backend/submission_backend.hpp): executors ordered by
///    completions. Without: none of the rows below that refine it (transfer, in place,
///    collectives).
///  - optional: VerifyingBackend (backend/verifying_backend.hpp): hash a weight in place.
///    Without: verification re-reads the checked bytes from the source.
///  - optional: ReservingBackend (backend/reserving_backend.hpp): prepare the allocator for
///    a unit's bytes before its first realization. Without: each realization allocates as it
///    starts.
///  - optional: TransferBackend (backend/transfer_backend.hpp): park a weight in host memory
///    and restore it. Without: a prefetch pipeline reads a unit again instead of parking it.
///  - optional: InPlaceBackend (backend/in_place_backend.hpp): overwrite a bound weight.
///    Without: InPlaceModelSlot is unavailable.
///  - optional: PatchingBackend (backend/patching_backend.hpp): host-writable bound weights.
///    Without: InPlaceModelSlot::async_patch is unavailable (async_swap stages a copy).
///  - optional: CollectiveBackend (backend/collective_backend.hpp): all_reduce, all_gather,
///    all_to_all over a group. Without: no tensor parallelism over its devices.
///  - optional: GatherIntoBackend (backend/collective_backend.hpp): gather into a tensor the
///    caller owns. Without: every all_gather allocates its output.
///  - optional: VotingBackend (parallel/group_vote.hpp): a group's vote on a swap. Without:
///    DistributedModelSlot is unavailable.
///
/// Of the source, a backend's steps ask only what io::ByteSource declares
/// (io/reading/byte_source.hpp); ParameterBackend<B, Source> says B reads from Source (an
/// io::CheckpointSource unless named: the CPU backend takes any ByteSource, the CUDA backend
/// a CheckpointSource still). How bytes land is the placement planner's decision
/// (orchestration/placement.hpp), which the backend executes.

#include <concepts>

#include "eredu/engine/backend/collective_backend.hpp"
#include "eredu/engine/backend/in_place_backend.hpp"
#include "eredu/engine/backend/parameter_backend.hpp"
#include "eredu/engine/backend/patching_backend.hpp"
#include "eredu/engine/backend/reserving_backend.hpp"
#include "eredu/engine/backend/submission_backend.hpp"
#include "eredu/engine/backend/transfer_backend.hpp"
#include "eredu/engine/backend/verifying_backend.hpp"
#include "eredu/engine/orchestration/placement.hpp"
#include "eredu/engine/parallel/group_vote.hpp"

namespace eredu::engine {

/// Which rows of the table (see file comment) a backend meets.
struct BackendFeatures {
  bool parameters = false;     ///< ParameterBackend: required
  bool buffer_traits = false;  ///< declares `B::buffer_traits` for the placement planner
  bool submission = false;     ///< SubmissionBackend
  bool verifying = false;      ///< VerifyingBackend
  bool reserving = false;      ///< ReservingBackend
  bool transfer = false;       ///< TransferBackend
  bool in_place = false;       ///< InPlaceBackend
  bool patching = false;       ///< PatchingBackend
  bool collective = false;     ///< CollectiveBackend
  bool gather_into = false;    ///< GatherIntoBackend
  bool voting = false;         ///< VotingBackend
  friend bool operator==(const BackendFeatures&, const BackendFeatures&) = default;
};

/// The features `B` has, computed from the concepts at compile time.
template <class B>
constexpr BackendFeatures backend_features() noexcept {
  return {.parameters = ParameterBackend<B>,
          .buffer_traits = requires {{B::buffer_traits} -> std::convertible_to<const BufferTraits&>;
}
, .submission = SubmissionBackend<B>, .verifying = VerifyingBackend<B>, .reserving = ReservingBackend<B>,
  .transfer = TransferBackend<B>, .in_place = InPlaceBackend<B>, .patching = PatchingBackend<B>,
  .collective = CollectiveBackend<B>, .gather_into = GatherIntoBackend<B>, .voting = VotingBackend<B>
};  // namespace eredu::engine
}

/// What `B`'s buffers declare to the placement planner: `B::buffer_traits`, or, for a backend
/// that declares none, host memory that a source only streams into (no mapping adopted, no
/// direct reads, no windows): the landing every source can serve.
template <class B>
constexpr BufferTraits buffer_traits_of() noexcept {
  if constexpr (requires {
                  { B::buffer_traits } -> std::convertible_to<const BufferTraits&>;
                })
    return B::buffer_traits;
  else
    return BufferTraits{};
}

}  // namespace eredu::engine
