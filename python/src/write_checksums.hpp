#pragma once
/// \file
/// eredu._native.write_checksums: app::write_checksums for Python (`eredu.write_checksums`, what
/// `eredu checksum` does), hashing with the GIL released and stopped by Ctrl-C.

#include <pybind11/pybind11.h>

namespace eredu::python {

/// Registers eredu._native.write_checksums.
void bind_write_checksums(pybind11::module_& m);

}  // namespace eredu::python
