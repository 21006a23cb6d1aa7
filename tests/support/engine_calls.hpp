#pragma once
// The engine calls of the tests that pass per-call options (SwapOptions), in one place. Every
// other call in the engine and conformance tests is written without options, in the form
// `async_load<B>(module, source, plan, context, token)`, which compiles whether the completion
// token comes before the options (as today) or last (options before it, with an overload
// without them). Only these helpers spell where the token goes; when it moves last, swap the
// last two arguments of the two calls below and nothing else changes.

#include <utility>

#include "eredu/engine/in_place_model_slot.hpp"
#include "eredu/engine/model_slot.hpp"
#include "eredu/engine/weight_binding_plan.hpp"
#include "eredu/io/checkpoint_source.hpp"

namespace eredu::test {

/// `slot.async_swap(source, plan, context, options, token)`, whatever the engine's argument
/// order. Completion signature: that of ModelSlot::async_swap.
template <class B, class Model, class Token>
auto async_swap_with_options(engine::ModelSlot<B, Model>& slot, io::CheckpointSource& source,
                             const engine::WeightBindingPlan& plan, typename B::MaterializationContext& context,
                             engine::SwapOptions<Model> options, Token&& token) {
  return slot.async_swap(source, plan, context, std::forward<Token>(token), std::move(options));
}

/// `slot.async_swap(source, plan, context, executor, options, token)`, whatever the engine's
/// argument order. Completion signature: that of InPlaceModelSlot::async_swap.
template <class B, class Model, class Token>
auto async_swap_in_place_with_options(engine::InPlaceModelSlot<B, Model>& slot, io::CheckpointSource& source,
                                      const engine::WeightBindingPlan& plan,
                                      typename B::MaterializationContext& context, typename B::Executor& executor,
                                      engine::SwapOptions<Model> options, Token&& token) {
  return slot.async_swap(source, plan, context, executor, std::forward<Token>(token), std::move(options));
}

}  // namespace eredu::test
