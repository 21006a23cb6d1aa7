#pragma once
/// \file
/// How eredu::Error becomes a Python exception: pybind11 translates every eredu::Error that
/// leaves a bound function (thrown, or rethrown from an operation's exception_ptr) by calling
/// the factory eredu/_errors.py registers, which picks the class from the hierarchy by kind
/// and family and sets .kind, .family, .file, .tensor, .parameter, .offset, .errno and
/// .detail; the message is the C++ library's what(), unchanged.

#include <pybind11/pybind11.h>

namespace eredu::python {

/// Registers the translator with pybind11 (once, at import).
void register_error_translation();
/// Sets the Python callable that builds exceptions (eredu._errors._from_native).
void set_error_factory(const pybind11::object& factory);

}  // namespace eredu::python
