#include "py_handle.hpp"

#include <utility>

#include "runtime.hpp"

namespace eredu::python {

namespace py = pybind11;

PyHandle::PyHandle(const py::handle& object) noexcept : object_(object.ptr()) { Py_XINCREF(object_); }

PyHandle& PyHandle::operator=(PyHandle&& other) noexcept {
  if (this != &other) {
    reset();
    object_ = std::exchange(other.object_, nullptr);
  }
  return *this;
}

py::object PyHandle::get() const {
  if (!object_) return py::none();
  return py::reinterpret_borrow<py::object>(object_);
}

void PyHandle::reset() noexcept {
  PyObject* object = std::exchange(object_, nullptr);
  if (!object) return;
  if (PyGILState_Check()) {
    Py_DECREF(object);
    return;
  }
  // No GIL here (the loop thread, a TBB worker): taking it could stall the loop behind a
  // Python thread, so the delivery thread drops the reference instead.
  try {
    Runtime::get().defer_decref(object);
  } catch (...) {
    // A forked child has no runtime: the reference is leaked rather than dropped without the GIL.
  }
}

}  // namespace eredu::python
