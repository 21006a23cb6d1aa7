#pragma once
/// \file
/// Naming the parameter in an error that a lower layer raised without knowing it.

#include <exception>
#include <string_view>

namespace eredu::engine {

/// `error` again, with `parameter` added to its eredu::ErrorContext (same errc kind and
/// same eredu::Error subclass) when it is an eredu::Error that names no parameter yet;
/// any other exception is returned unchanged.
std::exception_ptr attach_parameter(std::exception_ptr error, std::string_view parameter);

}  // namespace eredu::engine
