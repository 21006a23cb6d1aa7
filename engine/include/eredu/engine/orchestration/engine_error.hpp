#pragma once
/// \file
/// The engine's error types: eredu::Error subclasses for the failures only the engine
/// detects (recipes, binding declarations, binding a materialized unit). The io layer and
/// the backends report plain eredu::Error or BackendError (core/error.hpp).

#include "eredu/core/error.hpp"

namespace eredu::engine {

/// A recipe rejected by metadata inference (the seed's RecipeError); family() == recipe.
class RecipeError : public Error {
 public:
  using Error::Error;
};

/// Invalid binding declarations (the seed's ResidencyDeclarationError); family() == declaration.
class DeclarationError : public Error {
 public:
  using Error::Error;
};

/// A materialized unit that does not fit its module (ParameterOrchestrationError's
/// MissingBinding / UnexpectedBindings / ByteMismatch).
class OrchestrationError : public Error {
 public:
  using Error::Error;
};

}  // namespace eredu::engine
