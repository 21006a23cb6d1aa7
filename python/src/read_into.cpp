#include "read_into.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <asio/cancellation_type.hpp>
#include <cstddef>
#include <exception>
#include <span>
#include <utility>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/io/reading/tensor_read_request.hpp"
#include "runtime.hpp"
#include "text.hpp"

namespace eredu::python {

namespace py = pybind11;

namespace {

/// Tensors in flight at once: enough to keep the reader's queue full across small tensors,
/// few enough that a cancellation waits for little (a read in flight runs to its end).
constexpr std::size_t max_in_flight = 8;

/// One read_into, on the loop thread only: the next destination to start, the reads in
/// flight, and the first failure.
struct ReadIntoRun : std::enable_shared_from_this<ReadIntoRun> {
  std::shared_ptr<Operation> op;
  Checkpoint::Use use;
  std::vector<ReadIntoDestination> destinations;
  std::vector<io::TensorReadRequest> requests;
  std::size_t next = 0;
  std::size_t in_flight = 0;
  std::exception_ptr error;
  bool cancelled = false;

  ReadIntoRun(std::shared_ptr<Operation> o, Checkpoint::Use u, std::vector<ReadIntoDestination> d)
      : op(std::move(o)), use(std::move(u)), destinations(std::move(d)) {
    requests.reserve(destinations.size());
    for (const ReadIntoDestination& dest : destinations) requests.push_back(io::TensorReadRequest{dest.key});
  }

  /// Starts reads up to max_in_flight, or finishes the operation once nothing is in flight and
  /// nothing more will start.
  void pump() {
    const bool stopping = error || cancelled;
    while (!stopping && in_flight < max_in_flight && next < destinations.size()) {
      const std::size_t i = next++;
      const ReadIntoDestination& dest = destinations[i];
      ++in_flight;
      // NOLINTNEXTLINE(performance-no-int-to-ptr): the caller's memory, passed as an address
      std::span<std::byte> memory(reinterpret_cast<std::byte*>(dest.address), static_cast<std::size_t>(dest.bytes));
      use.source().async_read_into(requests[i], memory, [self = shared_from_this()](std::exception_ptr e) {
        --self->in_flight;
        if (e && !self->error) self->error = std::move(e);
        self->pump();
      });
    }
    if (in_flight != 0 || (!stopping && next < destinations.size())) return;
    op->cancellation_slot().clear();  // drops the handler, which holds this run
    if (error) {
      op->finish(error);
    } else if (cancelled) {
      op->finish(std::make_exception_ptr(Error(errc::cancelled, {.file = use.checkpoint().path()},
                                               fmt::format("the load into existing tensors was cancelled after {} "
                                                           "of {} tensors",
                                                           next, destinations.size()))));
    } else {
      op->finish(nullptr, [] { return py::object(py::none()); });
    }
  }
};

}  // namespace

std::shared_ptr<Operation> read_into(const std::shared_ptr<Checkpoint>& checkpoint,
                                     std::vector<ReadIntoDestination> destinations) {
  auto op = Operation::create(fmt::format("load into existing tensors from {}", checkpoint->path()));
  Runtime::get().post([checkpoint, op, destinations = std::move(destinations)]() mutable {
    op->settle([&] {
      auto run = std::make_shared<ReadIntoRun>(op, checkpoint->use(), std::move(destinations));
      op->cancellation_slot().assign([run](asio::cancellation_type type) {
        if (type != asio::cancellation_type::none) run->cancelled = true;
      });
      run->pump();
    });
  });
  return op;
}

void bind_read_into(py::module_& m) {
  m.def(
      "read_into",
      [](const std::shared_ptr<Checkpoint>& checkpoint, const py::list& destinations) {
        std::vector<ReadIntoDestination> out;
        out.reserve(destinations.size());
        for (const py::handle item : destinations) {
          const py::tuple t = py::reinterpret_borrow<py::object>(item).cast<py::tuple>();
          if (t.size() != 3)
            throw Error(errc::invalid_argument, {.file = checkpoint->path()},
                        "read_into takes (tensor name, address, bytes) tuples");
          out.push_back({text_bytes(t[0], "a tensor name"), t[1].cast<std::uintptr_t>(), t[2].cast<std::uint64_t>()});
        }
        return read_into(checkpoint, std::move(out));
      },
      py::arg("checkpoint"), py::arg("destinations"),
      "Starts reading each (tensor name, address, bytes) whole into the memory at address (its stored bytes, "
      "exactly); the Operation's result is None. The memory must stay valid until it has finished.");
}

}  // namespace eredu::python
