// eredu._native: the pybind11 extension under the `eredu` package. Each binding lives in the
// file of its concept; this one registers them, the operation type, the dtype helpers and the
// runtime's knobs. The public API is the pure-Python package (python/eredu/).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>

#include "checkpoint.hpp"
#include "dlpack_tensor.hpp"
#include "eredu/app/option_presets.hpp"
#include "eredu/core/dtype.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/float_formats.hpp"
#include "error_translation.hpp"
#include "in_place_slot.hpp"
#include "log_forwarding.hpp"
#include "model_slot.hpp"
#include "operation.hpp"
#include "prefetch.hpp"
#include "read_gate.hpp"
#include "read_into.hpp"
#include "runtime.hpp"
#include "write_checksums.hpp"
#ifdef EREDU_PYTHON_LIVE
#include "live.hpp"
#endif

namespace py = pybind11;
using namespace eredu;
using namespace eredu::python;

namespace {

DType dtype_arg(const std::string& name) {
  auto d = dtype_from_any_name(name);
  if (!d) throw Error(errc::invalid_argument, {}, "unknown dtype '" + name + "'");
  return *d;
}

py::dict pool_stats(const cpu::StoragePool& pool) {
  const cpu::StoragePoolStats s = pool.stats();
  py::dict d;
  d["live_bytes"] = s.live_bytes;
  d["retained_bytes"] = s.retained_bytes;
  d["fresh_allocations"] = s.fresh_allocations;
  d["recycled_allocations"] = s.recycled_allocations;
  return d;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "eredu's native core: the event loop, checkpoints, loads, pipelines and slots (see the eredu package)";
  m.attr("__version__") = EREDU_VERSION;
  register_error_translation();
  m.def("_set_error_factory", &set_error_factory, "Sets the callable that builds eredu exceptions.");

  py::class_<Operation, std::shared_ptr<Operation>>(m, "Operation", "An eredu operation in flight.")
      .def("wait", &Operation::wait, py::arg("progress") = py::none(),
           "Blocks (GIL released, Ctrl-C cancels) and returns the result; calls progress(done, total, 'read') "
           "every 50 ms at most while bytes land, and once with done == total at the end.")
      .def("bytes", &Operation::bytes, "(bytes done, bytes total) of a load so far.")
      .def("bind", &Operation::bind, py::arg("loop"), py::arg("on_done"), py::arg("on_jobs"),
           "Delivers completion to an asyncio loop through call_soon_threadsafe.")
      .def("run_jobs", &Operation::run_jobs, "Runs Python work the operation asked for.")
      .def("cancel", &Operation::cancel, "Asks the operation to stop (terminal cancellation).")
      .def("done", &Operation::done)
      .def("result", &Operation::result, "The result, or raises the operation's error.")
      .def_property_readonly("what", &Operation::what);

  bind_dlpack_tensor(m);
  bind_checkpoint(m);
  bind_prefetch(m);
  bind_model_slot(m);
  bind_in_place_slot(m);
  bind_read_gate(m);
  bind_read_into(m);
  bind_write_checksums(m);
  bind_log_forwarding(m);
#ifdef EREDU_PYTHON_LIVE
  bind_live(m);
#endif
  m.attr("live_updates") = py::bool_(
#ifdef EREDU_PYTHON_LIVE
      true
#else
      false
#endif
  );

  m.def("dtype_names", [] {
    py::list out;
    for (std::size_t i = 0; i < dtype_count; ++i) out.append(std::string(dtype_name(static_cast<DType>(i))));
    return out;
  });
  m.def(
      "cast_choices",
      [] {
        py::list out;
        for (const auto& c : app::cast_choices)
          out.append(py::make_tuple(std::string(c.name), c.value
                                                             ? py::object(py::str(std::string(dtype_name(*c.value))))
                                                             : py::object(py::none())));
        return out;
      },
      "Every name dtype= accepts (lower case) and the dtype it casts to (None: keep), as the CLI's --dtype.");
  m.def(
      "dtype_bits", [](const std::string& name) { return dtype_bits(dtype_arg(name)); },
      "Bits one element of the named dtype occupies.");
  m.def(
      "has_dlpack_type", [](const std::string& name) { return has_dlpack_type(dtype_arg(name)); },
      "True when the dtype has a DLPack type of its own.");
  m.def(
      "supported_cast",
      [](const std::string& from, const std::string& to) { return is_supported_cast(dtype_arg(from), dtype_arg(to)); },
      "True when eredu converts `from` to `to` on load.");
  m.def("default_threads", &Runtime::default_threads);
  m.def(
      "option_ranges",
      [] {
        py::dict out;
        for (const app::NamedRange& r : app::option_ranges())
          out[py::str(std::string(r.name))] = py::make_tuple(r.range.min, r.range.max);
        return out;
      },
      "{option: (min, max)}: the ranges the `eredu` command accepts too (eredu/app/option_presets.hpp).");
  m.def(
      "storage_stats", [] { return pool_stats(Runtime::get().storage()); },
      "Counters of the default tensor storage pool.");
  m.def(
      "set_storage_retention", [](std::uint64_t bytes) { Runtime::get().set_retention(bytes); },
      "Keep up to `bytes` of freed tensor storage for reuse by later loads.");
  m.def(
      "trim_storage", [](std::uint64_t keep) { Runtime::get().storage().trim(keep); }, py::arg("keep") = 0,
      "Returns retained storage to the system.");
  m.def(
      "_shutdown",
      [] {
        // A runtime that never started has nothing to stop (and starting one here could fail).
        if (Runtime* runtime = Runtime::if_started()) runtime->stop_delivery();
        uninstall_log_forwarding();
      },
      "atexit hook: stops delivering completions to Python.");
}
