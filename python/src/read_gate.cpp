#include "read_gate.hpp"

#include <pybind11/stl.h>

#include <memory>

namespace eredu::python {

namespace py = pybind11;

io::ReadFault ReadGate::on_complete(std::uint32_t file, std::uint64_t offset, std::uint64_t length) {
  std::unique_lock lock(mutex_);
  ++arrivals_;
  reads_.emplace_back(file, offset, length);
  changed_.notify_all();
  changed_.wait(lock, [this] { return open_; });
  return {};
}

std::vector<ReadGate::Read> ReadGate::reads() const {
  std::lock_guard lock(mutex_);
  return reads_;
}

void ReadGate::open() {
  {
    std::lock_guard lock(mutex_);
    open_ = true;
  }
  changed_.notify_all();
}

bool ReadGate::wait_arrivals(std::uint64_t count, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] { return arrivals_ >= count; });
}

std::uint64_t ReadGate::arrivals() const {
  std::lock_guard lock(mutex_);
  return arrivals_;
}

void bind_read_gate(py::module_& m) {
  py::class_<ReadGate, std::shared_ptr<ReadGate>>(m, "_ReadGate", "Test hook: holds reads until opened.")
      .def(py::init<bool>(), py::arg("open") = false, "A gate that holds reads (open=False) or only records them.")
      .def("open", &ReadGate::open, "Lets every read through.")
      .def(
          "wait_arrivals",
          [](ReadGate& g, std::uint64_t count, double timeout_s) {
            py::gil_scoped_release nogil;
            return g.wait_arrivals(count, std::chrono::milliseconds(static_cast<long>(timeout_s * 1000)));
          },
          py::arg("count") = 1, py::arg("timeout") = 10.0, "Waits until `count` reads are held; True if they are.")
      .def_property_readonly("arrivals", &ReadGate::arrivals, "Reads that have arrived.")
      .def("reads", &ReadGate::reads, "Every read so far as (file, offset, length), in arrival order.");
}

}  // namespace eredu::python
