#include "text.hpp"

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/core/printable.hpp"

namespace eredu::python {

namespace py = pybind11;

namespace {

std::string bytes_of(PyObject* bytes) {
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(bytes, &data, &size) != 0) throw py::error_already_set();
  return std::string(data, static_cast<std::size_t>(size));
}

// The Python error set by the failed conversion is replaced by a typed one.
[[noreturn]] void wrong_type(const char* what, const py::handle& object, const char* expected) {
  PyErr_Clear();
  throw Error(errc::invalid_argument, {},
              fmt::format("{} must be {}, not {}", what, expected, Py_TYPE(object.ptr())->tp_name));
}

[[noreturn]] void unencodable(const char* what) {
  PyErr_Clear();
  throw Error(errc::invalid_argument, {},
              fmt::format("{} cannot be encoded: it holds a surrogate that escapes no byte", what));
}

}  // namespace

std::string path_bytes(const py::handle& object, const char* what) {
  std::string out;
  if (PyBytes_Check(object.ptr())) {
    out = bytes_of(object.ptr());
  } else {
    py::object path = py::reinterpret_steal<py::object>(PyOS_FSPath(object.ptr()));
    if (!path) wrong_type(what, object, "a str, bytes or os.PathLike");
    if (PyBytes_Check(path.ptr())) {
      out = bytes_of(path.ptr());
    } else {
      py::object encoded = py::reinterpret_steal<py::object>(PyUnicode_EncodeFSDefault(path.ptr()));
      if (!encoded) unencodable(what);
      out = bytes_of(encoded.ptr());
    }
  }
  if (out.find('\0') != std::string::npos)
    throw Error(errc::invalid_argument, {},
                fmt::format("{} '{}' contains a NUL byte, which no file name can", what, printable(out)));
  return out;
}

py::str path_str(std::string_view bytes) {
  PyObject* s = PyUnicode_DecodeFSDefaultAndSize(bytes.data(), static_cast<Py_ssize_t>(bytes.size()));
  if (!s) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(s);
}

std::string text_bytes(const py::handle& object, const char* what) {
  if (PyBytes_Check(object.ptr())) return bytes_of(object.ptr());
  if (!PyUnicode_Check(object.ptr())) wrong_type(what, object, "a str or bytes");
  py::object encoded =
      py::reinterpret_steal<py::object>(PyUnicode_AsEncodedString(object.ptr(), "utf-8", "surrogateescape"));
  if (!encoded) unencodable(what);
  return bytes_of(encoded.ptr());
}

py::str text_str(std::string_view bytes) {
  PyObject* s = PyUnicode_DecodeUTF8(bytes.data(), static_cast<Py_ssize_t>(bytes.size()), "surrogateescape");
  if (!s) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(s);
}

}  // namespace eredu::python
