#pragma once
/// \file
/// How eredu::Error becomes a Python exception: pybind11 translates every eredu::Error that
/// leaves a bound function (thrown, or rethrown from an operation's exception_ptr) by calling
/// the factory eredu/_errors.py registers, which picks the class from the hierarchy by kind
/// and family and sets .kind, .family, .file, .tensor, .parameter, .offset, .errno and
/// .detail; the message is the C++ library's what(), unchanged.
///
/// Nothing else leaves untyped either: what the library or the libraries under it throw
/// without an eredu::Error becomes one first — std::bad_alloc out_of_memory; a thread, descriptor
/// or memory the system refused (std::system_error with EAGAIN, ENOMEM, EMFILE or ENFILE; oneTBB's
/// "pthread_create has failed") resource_exhausted; pybind11's cast_error invalid_argument; any
/// other exception backend_failure with its what(). pybind11's own Python exceptions and Python
/// errors raised under C++ keep their types.

#include <pybind11/pybind11.h>

namespace eredu::python {

/// Registers the translator with pybind11 (once, at import).
void register_error_translation();
/// Sets the Python callable that builds exceptions (eredu._errors._from_native).
void set_error_factory(const pybind11::object& factory);

}  // namespace eredu::python
