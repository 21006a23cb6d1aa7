#pragma once
/// \file
/// The InPlaceBackend concept: a backend that can copy a realized weight into the storage
/// already bound to a parameter slot, keeping the slot's address — what InPlaceModelSlot
/// needs to swap a model's weights without a second resident copy of the model's slots.

#include <concepts>

#include "eredu/core/completion.hpp"
#include "eredu/engine/backend/parameter_backend.hpp"
#include "eredu/engine/backend/submission_backend.hpp"

namespace eredu::engine {

/// A backend whose bound weights can be overwritten in place. `overwrite` throws at once
/// when the slot is unbound or the shapes differ; otherwise it returns the copy's
/// Completion, retaining `weight` until then.
template <class B>
concept InPlaceBackend = ParameterBackend<B> && SubmissionBackend<B> &&
    requires(typename B::Executor& executor, typename B::Parameter& slot,
             const typename B::MaterializedWeight& weight) {
  { B::overwrite(executor, slot, weight) } -> std::same_as<Completion>;
};

}  // namespace eredu::engine
