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

/// `error` again with its parameter qualified by `prefix` (a unit or model name), so a
/// parameter named relative to its unit ("attn.qkv.weight") reads "layers.3.attn.qkv.weight";
/// with no parameter yet, `prefix` becomes the parameter. Same kind and subclass; any other
/// exception is returned unchanged.
std::exception_ptr qualify_parameter(std::exception_ptr error, std::string_view prefix);

}  // namespace eredu::engine
