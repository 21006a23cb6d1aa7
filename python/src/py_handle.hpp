#pragma once
/// \file
/// eredu::python::PyHandle: an owning reference to a Python object that may be destroyed on
/// any thread — the loop thread included, which never takes the GIL.
///
/// State that the loop thread owns (an operation's asyncio loop and callbacks, a hot-swap's
/// canary) holds its Python objects through PyHandle: destroyed with the GIL held, it drops the
/// reference at once; without it, it hands the reference to the runtime's delivery thread,
/// which drops it with the GIL (or leaks it once the interpreter has begun to exit).

#include <pybind11/pybind11.h>

namespace eredu::python {

/// A move-only strong reference to a Python object (see file comment).
class PyHandle {
 public:
  /// No object.
  PyHandle() noexcept = default;
  /// Takes a new reference to `object`. Call with the GIL held.
  explicit PyHandle(const pybind11::handle& object) noexcept;
  PyHandle(PyHandle&& other) noexcept : object_(other.object_) { other.object_ = nullptr; }
  PyHandle& operator=(PyHandle&& other) noexcept;
  PyHandle(const PyHandle&) = delete;
  PyHandle& operator=(const PyHandle&) = delete;
  /// Drops the reference, on this thread if it holds the GIL, else on the delivery thread.
  ~PyHandle() { reset(); }

  /// A new reference to the object (None when empty). Call with the GIL held.
  pybind11::object get() const;
  /// True when it holds an object.
  explicit operator bool() const noexcept { return object_ != nullptr; }
  /// Drops the reference now (see the destructor).
  void reset() noexcept;

 private:
  PyObject* object_ = nullptr;
};

}  // namespace eredu::python
