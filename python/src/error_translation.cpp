#include "error_translation.hpp"

#include <cerrno>
#include <exception>
#include <new>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <utility>

#include "eredu/core/error.hpp"
#include "eredu/core/printable.hpp"
#include "text.hpp"

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
  // The message is printable UTF-8 already; the context is the raw bytes of paths and names,
  // decoded so that they round-trip (e.file opens the file); the detail is free text that may
  // quote raw bytes, so it is made printable as the message is.
  py::object exc = py::reinterpret_borrow<py::object>(factory_object)(
      errc_name(e.kind()), family_name(e.family()), text_str(e.what()), text_str(printable(e.detail())),
      path_str(c.file), text_str(c.tensor), text_str(c.parameter), offset, os_errno);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
}

/// True for the errno values with which the system refuses a thread, a descriptor or memory
/// for one (pthread_create's EAGAIN, a file table's EMFILE/ENFILE, ENOMEM for a stack).
bool refused_resource(const std::error_code& code) noexcept {
  // Asio throws std::system_error with a system category of its own ("asio.system"), of errno values.
  const std::string_view category = code.category().name();
  if (code.category() != std::generic_category() && code.category() != std::system_category() &&
      category != "asio.system")
    return false;
  switch (code.value()) {
    case EAGAIN:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return true;
    default:
      return false;
  }
}

/// An eredu::Error for what the library (or a library it uses) threw without one: the library
/// reports its failures as eredu::Error, and a bridge here keeps anything else typed too.
Error typed(errc kind, std::string_view what, std::error_code os_error = {}) {
  return Error(kind, {.os_error = os_error}, printable(what));
}

}  // namespace

void register_error_translation() {
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      try {
        std::rethrow_exception(p);
      } catch (const Error&) {
        throw;
      } catch (const py::cast_error& e) {
        // A value the extension could not convert: the Python layer validates what it passes,
        // so only a caller of eredu._native gets here, with a bad argument.
        throw typed(errc::invalid_argument, e.what());
      } catch (const py::builtin_exception&) {
        throw;  // pybind11's own Python exceptions (StopIteration, IndexError, ...): theirs to raise
      } catch (const py::error_already_set&) {
        throw;  // a Python exception raised under C++: raised as it is
      } catch (const std::bad_alloc&) {
        throw typed(errc::out_of_memory, "out of memory (std::bad_alloc)");
      } catch (const std::system_error& e) {
        // std::thread's EAGAIN under RLIMIT_NPROC or RLIMIT_AS; Asio's EMFILE for its eventfd.
        if (refused_resource(e.code()))
          throw typed(errc::resource_exhausted,
                      std::string("the system refused a thread, descriptor or memory: ") + e.what(), e.code());
        throw typed(errc::backend_failure, std::string("unexpected system error: ") + e.what(), e.code());
      } catch (const std::runtime_error& e) {
        // oneTBB reports a worker it could not start as "pthread_create has failed" (from any of
        // the pthread_* calls that start one); the library translates it, this is the backstop.
        const std::string what = e.what();
        if (what.starts_with("pthread_")) throw typed(errc::resource_exhausted, "the system refused a thread: " + what);
        throw typed(errc::backend_failure, "unexpected error: " + what);
      } catch (const std::exception& e) {
        throw typed(errc::backend_failure, std::string("unexpected error: ") + e.what());
      } catch (...) {
        throw typed(errc::backend_failure, "unexpected error: an exception of unknown type");
      }
    } catch (const Error& e) {
      try {
        raise(e);
      } catch (py::error_already_set& failed) {
        failed.restore();  // the factory itself failed (no memory for the exception): raise that
      } catch (const std::bad_alloc&) {
        PyErr_NoMemory();
      }
    }
  });
}

void set_error_factory(const py::object& f) {
  Py_XINCREF(f.ptr());
  Py_XDECREF(std::exchange(factory_object, f.ptr()));
}

}  // namespace eredu::python
