#include "live.hpp"

#include <asio/co_spawn.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <future>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <pybind11/stl.h>

#include "checkpoint.hpp"
#include "eredu/core/dtype.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/printable.hpp"
#include "eredu/core/selection.hpp"
#include "eredu/mpi/environment.hpp"
#include "eredu/mpi/publisher.hpp"
#include "runtime.hpp"
#include "text.hpp"

namespace eredu::python {

namespace py = pybind11;

namespace {

/// MPI in this process: started by the first LiveGroup, ended by live_finalize().
struct LiveWorld {
  std::unique_ptr<mpi::Environment> environment;
  std::unique_ptr<mpi::Communicator> world;
};

std::mutex world_mutex;
LiveWorld& live_world() {
  static LiveWorld world;  // live_finalize() ends MPI; destruction does it otherwise
  return world;
}

/// The group of every process of the job (MPI_COMM_WORLD, duplicated), named "live"; or, with
/// `accept` / `connect`, that and the processes of another job started separately.
class LiveGroup {
 public:
  LiveGroup(double timeout_s, const std::string& transport, const py::object& accept, const py::object& connect) {
    if (!accept.is_none() && !connect.is_none())
      throw Error(errc::invalid_argument, {}, "a live group either accepts or connects, not both");
    const bool joining = !accept.is_none() || !connect.is_none();
    const std::string service = joining ? text_bytes(accept.is_none() ? connect : accept, "service") : std::string();
    if (transport == "one_sided")
      transport_ = mpi::LiveTransport::one_sided;  // OpenMPI 4.1's windows do not reach another job
    else if (transport == "two_sided")
      transport_ = mpi::LiveTransport::two_sided;
    else
      throw Error(errc::invalid_argument, {},
                  fmt::format("transport '{}': one of 'two_sided', 'one_sided'", printable(transport)));
    const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
    std::lock_guard lock(world_mutex);
    LiveWorld& w = live_world();
    if (!w.environment) {
      py::gil_scoped_release nogil;
      // Joining another job needs MPI_THREAD_MULTIPLE (see mpi::Communicator::accept).
      mpi::EnvironmentOptions options;
      if (joining) options.required = mpi::ThreadLevel::multiple;
      w.environment = std::make_unique<mpi::Environment>(options);
      w.world = std::make_unique<mpi::Communicator>(mpi::Communicator::world(*w.environment));
    }
    if (!w.world) throw Error(errc::invalid_argument, {}, "MPI was finalized in this process: no new live group");
    if (joining && w.environment->provided() < mpi::ThreadLevel::multiple)
      throw Error(errc::invalid_argument, {},
                  "joining another job needs MPI_THREAD_MULTIPLE, and MPI started without it: make the process's "
                  "first LiveGroup the one that accepts or connects");
    py::gil_scoped_release nogil;
    const mpi::RendezvousOptions joining_options{.timeout = timeout, .name = "live"};
    if (!accept.is_none())
      group_ = std::make_shared<mpi::Communicator>(
          mpi::Communicator::accept(*w.environment, *w.world, service, joining_options));
    else if (!connect.is_none())
      group_ = std::make_shared<mpi::Communicator>(
          mpi::Communicator::connect(*w.environment, *w.world, service, joining_options));
    else
      group_ = std::make_shared<mpi::Communicator>(w.world->split(0, w.world->rank(), "live"));
    group_->set_timeout(timeout);
  }
  int rank() const { return group_->rank(); }
  int size() const { return group_->size(); }
  mpi::LiveTransport transport() const { return transport_; }
  const std::shared_ptr<mpi::Communicator>& group() const { return group_; }

 private:
  std::shared_ptr<mpi::Communicator> group_;
  mpi::LiveTransport transport_ = mpi::LiveTransport::two_sided;
};

/// The copy_out of a staged tensor: calls the package's copier `copy` (a borrowed reference,
/// which the publication keeps alive in PyPublication's `keep` until its withdrawal has waited
/// for every read) with the GIL, from the publisher's hashing threads and its request thread.
/// `publish`, `withdraw` and `close` release the GIL while they wait, so a copy never waits on
/// the thread that waits for it. A Python exception becomes a BackendError, which reaches the
/// subscriber naming the tensor and the offset (mpi::CopyOut).
mpi::CopyOut staged_copier(PyObject* copy) {
  return [copy](std::span<const ByteRun> runs, std::span<std::byte> out) {
    py::gil_scoped_acquire gil;
    std::string failure;
    try {
      py::list asked(runs.size());
      for (std::size_t i = 0; i < runs.size(); ++i)
        asked[i] = py::make_tuple(runs[i].source_offset, runs[i].dest_offset, runs[i].length);
      py::memoryview view = py::memoryview::from_memory(out.data(), static_cast<py::ssize_t>(out.size()), false);
      py::reinterpret_borrow<py::object>(copy)(asked, view);
      view.attr("release")();  // fails while the copier still holds `out`: then it is refused
      return;
    } catch (py::error_already_set& e) {  // handled here, where the GIL is held
      failure = e.what();
    }
    throw BackendError(errc::backend_failure, {}, std::move(failure));
  };
}

/// A publication and the Python objects whose memory it offers.
class PyPublication {
 public:
  PyPublication(mpi::Publication p, std::vector<py::object> keep)
      : publication_(std::move(p)), keep_(std::move(keep)) {}
  ~PyPublication() {
    py::gil_scoped_release nogil;
    publication_.withdraw();
  }
  std::string version() const { return publication_.version(); }
  int served() const { return publication_.served(); }
  int failed() const { return publication_.failed(); }
  bool wait_served(int subscribers, double timeout_s) {
    py::gil_scoped_release nogil;
    return publication_.wait_served(subscribers,
                                    std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000)));
  }
  void withdraw() {
    {
      py::gil_scoped_release nogil;
      publication_.withdraw();
    }
    keep_.clear();  // the memory is the caller's again
  }

 private:
  mpi::Publication publication_;
  std::vector<py::object> keep_;
};

class PyPublisher {
 public:
  PyPublisher(const LiveGroup& group, double linger_s, bool xor_deltas) : group_(group.group()) {
    py::gil_scoped_release nogil;
    publisher_ = std::make_unique<mpi::Publisher>(
        *group_, mpi::PublisherOptions{.linger = std::chrono::milliseconds(static_cast<std::int64_t>(linger_s * 1000)),
                                       .transport = group.transport(),
                                       .xor_deltas = xor_deltas});
  }
  /// tensors: (name bytes, dtype name, shape, buffer or copier) tuples. A buffer is the
  /// tensor's C-contiguous bytes (the package makes them from numpy arrays and host torch
  /// tensors without a copy), offered as they are. A copier, `copy(runs, out)`, makes the
  /// tensor staged (mpi::PublishedTensor::copy_out): each read, and each hashing piece, calls it
  /// with the GIL to copy the runs ((source offset, destination offset, length) tuples) into the
  /// writable memoryview `out` (a device tensor's bytes, which the host cannot address).
  std::shared_ptr<PyPublication> publish(const py::object& version, const py::object& base, const py::list& tensors) {
    if (!publisher_) throw Error(errc::invalid_argument, {}, "the publisher is closed");
    std::vector<mpi::PublishedTensor> offered;
    std::vector<py::object> keep;
    for (const py::handle& item : tensors) {
      const py::tuple t = py::reinterpret_borrow<py::tuple>(item);
      const std::string name = text_bytes(t[0], "tensor name");
      const std::string dtype_text = py::cast<std::string>(t[1]);
      const std::optional<DType> dtype = dtype_from_name(dtype_text);
      if (!dtype) throw Error(errc::unknown_dtype, {.tensor = name}, fmt::format("dtype '{}'", dtype_text));
      Shape shape;
      for (const py::handle& d : py::reinterpret_borrow<py::sequence>(t[2]))
        shape.push_back(py::cast<std::uint64_t>(d));
      keep.push_back(py::reinterpret_borrow<py::object>(t[3]));
      if (PyCallable_Check(t[3].ptr())) {
        offered.push_back({name, *dtype, std::move(shape), {}, staged_copier(t[3].ptr())});
        continue;
      }
      const py::buffer buffer = py::reinterpret_borrow<py::buffer>(t[3]);
      const py::buffer_info info = buffer.request();
      std::int64_t expected_stride = info.itemsize;
      for (std::size_t d = info.ndim; d-- > 0;) {
        if (info.shape[d] > 1 && info.strides[d] != expected_stride)
          throw Error(errc::invalid_argument, {.tensor = name}, "the tensor's memory is not C-contiguous");
        expected_stride *= info.shape[d];
      }
      offered.push_back({name, *dtype, std::move(shape),
                         std::span<const std::byte>(static_cast<const std::byte*>(info.ptr),
                                                    static_cast<std::size_t>(info.size * info.itemsize))});
    }
    const std::string v = text_bytes(version, "version");
    const std::string b = base.is_none() ? std::string() : text_bytes(base, "base");
    std::optional<mpi::Publication> p;
    {
      py::gil_scoped_release nogil;
      p.emplace(publisher_->publish(v, b, std::move(offered)));
    }
    return std::make_shared<PyPublication>(std::move(*p), std::move(keep));
  }
  PyPublisher(const PyPublisher&) = delete;
  PyPublisher& operator=(const PyPublisher&) = delete;
  /// Withdraws what it still offers without the GIL: a staged tensor's read may be waiting for it.
  ~PyPublisher() { close(); }
  bool offered(const py::object& version) const {
    return publisher_ && publisher_->offered(text_bytes(version, "version"));
  }
  void close() {
    if (!publisher_) return;  // closed: the destructor at interpreter exit touches no GIL
    py::gil_scoped_release nogil;
    publisher_.reset();
  }

 private:
  std::shared_ptr<mpi::Communicator> group_;
  std::unique_ptr<mpi::Publisher> publisher_;
};

class PySubscriber {
 public:
  PySubscriber(const LiveGroup& group, int publisher, double timeout_s) : group_(group.group()) {
    py::gil_scoped_release nogil;
    subscriber_ = std::make_shared<mpi::Subscriber>(
        *group_, publisher, Runtime::get().executor(),
        mpi::SubscriberOptions{.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000)),
                               .transport = group.transport()});
  }
  std::shared_ptr<PublishedVersion> open(const py::object& version) {
    if (!subscriber_) throw Error(errc::invalid_argument, {}, "the subscriber is closed");
    const std::string v = version.is_none() ? std::string() : text_bytes(version, "version");
    std::shared_ptr<mpi::Subscriber> s = subscriber_;
    // Shared: set_value may still be returning on the loop thread when the waiter wakes.
    auto opened = std::make_shared<std::promise<std::unique_ptr<mpi::PublishedSource>>>();
    std::future<std::unique_ptr<mpi::PublishedSource>> result = opened->get_future();
    Runtime::get().post([s, v, opened] {
      asio::co_spawn(Runtime::get().executor(), s->async_open(v, asio::use_awaitable),
                     [opened](std::exception_ptr e, std::unique_ptr<mpi::PublishedSource> source) {
                       if (e)
                         opened->set_exception(e);
                       else
                         opened->set_value(std::move(source));
                     });
    });
    std::unique_ptr<mpi::PublishedSource> source;
    {
      py::gil_scoped_release nogil;
      source = result.get();
    }
    return std::make_shared<PublishedVersion>(std::shared_ptr<void>(s, s.get()), std::move(source));
  }
  /// Frees the window, collectively: refused while a version it opened is still referenced
  /// (the window must outlive its reads).
  void close() {
    if (!subscriber_) return;
    {
      // Versions and swaps release it on the loop thread, some just after their Python side has
      // returned: give them a moment.
      py::gil_scoped_release nogil;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (subscriber_.use_count() > 1 && std::chrono::steady_clock::now() < deadline) {
        Runtime::get().run_on_loop([] {});
        if (subscriber_.use_count() > 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    if (subscriber_.use_count() > 1)
      throw Error(errc::invalid_argument, {},
                  "the subscriber cannot close while a version it opened is referenced (or a swap to one runs): "
                  "release them first");
    py::gil_scoped_release nogil;
    subscriber_.reset();
  }

 private:
  std::shared_ptr<mpi::Communicator> group_;
  std::shared_ptr<mpi::Subscriber> subscriber_;
};

}  // namespace

PublishedVersion::~PublishedVersion() {
  // The source (which tells the publisher this rank is done, if no swap did) goes on the loop
  // thread, where it lives.
  if (Runtime* r = Runtime::if_started())
    r->post([source = std::move(source_), subscriber = subscriber_]() mutable { source.reset(); });
}

void bind_live(py::module_& m) {
  py::class_<LiveGroup>(m, "LiveGroup", "Every process of this MPI job, for live updates.")
      .def(py::init<double, const std::string&, const py::object&, const py::object&>(), py::arg("timeout"),
           py::arg("transport"), py::arg("accept"), py::arg("connect"))
      .def_property_readonly("transport",
                             [](const LiveGroup& g) { return std::string(mpi::live_transport_name(g.transport())); })
      .def_property_readonly("rank", &LiveGroup::rank)
      .def_property_readonly("size", &LiveGroup::size);
  py::class_<PyPublication, std::shared_ptr<PyPublication>>(m, "Publication", "A version a Publisher offers.")
      .def_property_readonly("version", &PyPublication::version)
      .def_property_readonly("served", &PyPublication::served)
      .def_property_readonly("failed", &PyPublication::failed)
      .def("wait_served", &PyPublication::wait_served, py::arg("subscribers"), py::arg("timeout"))
      .def("withdraw", &PyPublication::withdraw);
  py::class_<PyPublisher>(m, "Publisher", "The trainer's side of live updates.")
      .def(py::init<const LiveGroup&, double, bool>(), py::arg("group"), py::arg("linger"), py::arg("xor_deltas"))
      .def("publish", &PyPublisher::publish, py::arg("version"), py::arg("base"), py::arg("tensors"))
      .def("offered", &PyPublisher::offered, py::arg("version"))
      .def("close", &PyPublisher::close);
  py::class_<PublishedVersion, std::shared_ptr<PublishedVersion>>(m, "PublishedVersion",
                                                                  "One published version, open on a subscriber.")
      .def_property_readonly("version", [](const PublishedVersion& v) { return text_str(v.source().version()); })
      .def_property_readonly("base", [](const PublishedVersion& v) { return text_str(v.source().base()); })
      .def_property_readonly("path", [](const PublishedVersion& v) { return text_str(v.source().location()); })
      .def_property_readonly(
          "transferred_bytes", [](const PublishedVersion& v) { return v.source().transferred_bytes(); },
          "Bytes read from the publisher so far: whole selections, or only a delta's changed blocks.")
      .def("files",
           [](const PublishedVersion& v) {
             py::list out;
             py::dict d;
             d["path"] = text_str(v.source().location());
             d["format"] = "published";
             d["size"] = v.source().catalog().total_bytes();
             d["data_offset"] = 0;
             d["metadata"] = py::dict();
             out.append(d);
             return out;
           })
      .def("tensors", [](const PublishedVersion& v) { return tensor_tuples(v.source().catalog()); })
      .def("close", [](PublishedVersion&) {})
      .def(
          "corrupt_next_read",
          [](PublishedVersion& v, std::uint64_t byte) {
            Runtime::get().run_on_loop([&v, byte] { v.source().corrupt_next_read(byte); });
          },
          py::arg("byte"), "Test hook: flips a bit of the next read's bytes, as a transfer fault would.");
  py::class_<PySubscriber>(m, "Subscriber", "The server's side of live updates.")
      .def(py::init<const LiveGroup&, int, double>(), py::arg("group"), py::arg("publisher"), py::arg("timeout"))
      .def("open", &PySubscriber::open, py::arg("version"))
      .def("close", &PySubscriber::close);
  m.def(
      "live_finalize",
      [] {
        std::lock_guard lock(world_mutex);
        LiveWorld& w = live_world();
        py::gil_scoped_release nogil;
        w.world.reset();
        w.environment.reset();
      },
      "Ends MPI in this process (after every publisher and subscriber is closed).");
}

}  // namespace eredu::python
