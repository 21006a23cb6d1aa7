#include "eredu/engine/description/parameter_error.hpp"

#include <string>

#include "eredu/core/error.hpp"
#include "eredu/engine/description/parameterized.hpp"
#include "eredu/engine/orchestration/engine_error.hpp"

namespace eredu::engine {
namespace {

template <class E>
std::exception_ptr rebuild(const E& e, std::string_view parameter) {
  ErrorContext context = e.context();
  context.parameter = std::string(parameter);
  return std::make_exception_ptr(E(e.kind(), std::move(context), e.detail()));
}

/// `error` rebuilt with the parameter `name(old parameter)`, keeping its most derived type.
template <class Name>
std::exception_ptr with_parameter(std::exception_ptr error, Name&& name) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    std::string parameter = name(e.context().parameter);
    if (parameter == e.context().parameter) return error;
    // Most derived first, so the caller can still catch the specific type.
    if (auto* r = dynamic_cast<const RecipeError*>(&e)) return rebuild(*r, parameter);
    if (auto* d = dynamic_cast<const DeclarationError*>(&e)) return rebuild(*d, parameter);
    if (auto* o = dynamic_cast<const OrchestrationError*>(&e)) return rebuild(*o, parameter);
    if (auto* b = dynamic_cast<const BackendError*>(&e)) return rebuild(*b, parameter);
    return rebuild(e, parameter);
  } catch (...) {
    return error;
  }
}

}  // namespace

std::exception_ptr attach_parameter(std::exception_ptr error, std::string_view parameter) {
  return with_parameter(error, [&](const std::string& old) { return old.empty() ? std::string(parameter) : old; });
}

std::exception_ptr qualify_parameter(std::exception_ptr error, std::string_view prefix) {
  return with_parameter(error, [&](const std::string& old) {
    return old.empty() ? std::string(prefix) : join_name(std::string(prefix), old);
  });
}

}  // namespace eredu::engine
