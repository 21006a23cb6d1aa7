#pragma once
/// \file
/// Paths and names between Python and eredu: they cross as the bytes the OS and the files hold,
/// never as text that pybind11 would encode or decode strictly (and fail on).
///
/// A Linux path is any bytes but NUL. Python spells one that is not UTF-8 as bytes, or as a str
/// with surrogate escapes (os.fsdecode). eredu takes paths as std::string of bytes, so the Python
/// layer hands over os.fsencode(path), and paths come back decoded as os.fsdecode decodes them:
/// the round trip names the same file. Tensor names and metadata (a GGUF file's may be any bytes)
/// cross as UTF-8 with surrogate escapes, for the same reason.

#include <pybind11/pybind11.h>

#include <string>
#include <string_view>

namespace eredu::python {

/// The bytes of a path: bytes as they are, a str (or os.PathLike) as os.fsencode encodes it.
/// Throws Error(invalid_argument) naming `what` for another type, a str that does not encode, or
/// a NUL byte (which no file name holds).
std::string path_bytes(const pybind11::handle& object, const char* what);
/// `bytes` as os.fsdecode decodes them (surrogate escapes for what is not UTF-8).
pybind11::str path_str(std::string_view bytes);

/// The bytes of a name: bytes as they are, a str as UTF-8 with surrogate escapes. Throws
/// Error(invalid_argument) naming `what` for another type or a str that does not encode.
std::string text_bytes(const pybind11::handle& object, const char* what);
/// `bytes` as UTF-8 with surrogate escapes: any bytes give a str, and text_bytes gives them back.
pybind11::str text_str(std::string_view bytes);

}  // namespace eredu::python
