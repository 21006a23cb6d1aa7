#include "error_translation.hpp"

#include <exception>
#include <utility>

#include "eredu/core/error.hpp"

namespace eredu::python {

namespace py = pybind11;

namespace {

// Set at import and read with the GIL held, so no lock is needed. A plain strong reference
// that is never dropped: a static with a destructor would decref after the interpreter is gone.
PyObject* factory_object = nullptr;

const char* family_name(error_family f) noexcept {
  switch (f) {
    case error_family::format:
      return "format";
    case error_family::store:
      return "store";
    case error_family::recipe:
      return "recipe";
    case error_family::declaration:
      return "declaration";
    case error_family::orchestration:
      return "orchestration";
    case error_family::backend:
      return "backend";
    case error_family::collective:
      return "collective";
  }
  return "unknown";
}

void raise(const Error& e) {
  const ErrorContext& c = e.context();
  py::object offset = c.offset ? py::object(py::int_(*c.offset)) : py::object(py::none());
  py::object os_errno = c.os_error ? py::object(py::int_(c.os_error.value())) : py::object(py::none());
  if (!factory_object) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return;
  }
  py::object exc =
      py::reinterpret_borrow<py::object>(factory_object)(errc_name(e.kind()), family_name(e.family()), e.what(),
                                                         e.detail(), c.file, c.tensor, c.parameter, offset, os_errno);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
}

}  // namespace

void register_error_translation() {
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      try {
        raise(e);
      } catch (py::error_already_set& failed) {
        failed.restore();  // the factory itself failed: raise that
      }
    }
  });
}

void set_error_factory(const py::object& f) {
  Py_XINCREF(f.ptr());
  Py_XDECREF(std::exchange(factory_object, f.ptr()));
}

}  // namespace eredu::python
