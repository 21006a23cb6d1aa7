#pragma once
// The kind of the failure an exception_ptr carries, for tests that check which error a
// completion delivered.

#include <concepts>
#include <exception>

#include "eredu/core/error.hpp"

namespace eredu::test {

/// The errc of the eredu::Error `e` holds; errc{} for no exception; invalid_argument for any
/// other exception (which no test expects, so a check on the kind fails).
inline errc kind_of(const std::exception_ptr& e) {
  if (!e) return errc{};
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err.kind();
  } catch (...) {
    return errc::invalid_argument;
  }
}

/// The errc of what `f()` throws (see above); errc{} when it returns.
template <std::invocable F>
errc kind_of(F&& f) {
  try {
    f();
    return errc{};
  } catch (...) {
    return kind_of(std::current_exception());
  }
}

/// The eredu::Error `f()` throws; when it returns, an Error of kind errc{} ("no error"), which
/// no check on a kind expects. Any other exception passes through.
template <std::invocable F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  return Error(errc{}, {}, "no eredu::Error was thrown");
}

}  // namespace eredu::test
