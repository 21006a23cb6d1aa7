#pragma once
/// \file
/// eredu::engine::ModelVersion: what ModelSlot publishes and DistributedModelSlot commits — a
/// bound model, its generation and where it came from.

#include <cstdint>
#include <string>

namespace eredu::engine {

/// What one published version is: the bound model and where it came from.
template <class Model>
struct ModelVersion {
  Model model{};                 ///< every parameter bound
  std::uint64_t generation = 0;  ///< 1 for the first version, +1 per successful swap
  std::string origin{};          ///< what the caller said it was loaded from
};

}  // namespace eredu::engine
