#pragma once
// Dispatch on a tensor element's width (private to eredu::mpi): the per-element loops of deltas
// (the publisher's comparison, the subscriber's scatter of changed values, the XOR's planes) run
// with the width known at compile time for the usual widths, so that each element's compare or
// copy is one load and store rather than a call of run-time size.

#include <cstddef>
#include <type_traits>

namespace eredu::mpi::detail {

/// Calls `f(std::integral_constant<std::size_t, W>{})` with W = `element` when it is 1, 2, 4 or
/// 8 bytes, else with W = 0: the loop then uses `element`, known only at run time.
template <class F>
void with_element_width(std::size_t element, F&& f) {
  switch (element) {
    case 1:
      f(std::integral_constant<std::size_t, 1>{});
      return;
    case 2:
      f(std::integral_constant<std::size_t, 2>{});
      return;
    case 4:
      f(std::integral_constant<std::size_t, 4>{});
      return;
    case 8:
      f(std::integral_constant<std::size_t, 8>{});
      return;
    default:
      f(std::integral_constant<std::size_t, 0>{});
  }
}

}  // namespace eredu::mpi::detail
