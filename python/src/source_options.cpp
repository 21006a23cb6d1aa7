#include "source_options.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>

#include "eredu/app/option_presets.hpp"
#include "eredu/core/error.hpp"
#include "runtime.hpp"

namespace eredu::python {

namespace py = pybind11;

namespace {

Error bad(const std::string& key, const std::string& why) {
  return Error(errc::invalid_argument, {}, fmt::format("option {}: {}", key, why));
}

// _options.py holds the documented ranges; this only keeps what reaches C++ within its type,
// so that no value Python can spell is cut down to another one (or fails as pybind11's cast).
template <class T>
T positive(const std::string& key, const py::handle& value) {
  constexpr auto max = static_cast<unsigned long long>(std::numeric_limits<T>::max());
  if (PyLong_Check(value.ptr()) && !PyBool_Check(value.ptr())) {
    const unsigned long long v = PyLong_AsUnsignedLongLong(value.ptr());
    if (!PyErr_Occurred() && v >= 1 && v <= max) return static_cast<T>(v);
    PyErr_Clear();  // negative, or beyond 64 bits
  }
  throw bad(key, fmt::format("must be an integer from 1 to {}, not {}", max, std::string(py::repr(value))));
}

bool flag(const std::string& key, const py::handle& value) {
  if (!PyBool_Check(value.ptr()))
    throw bad(key, fmt::format("must be True or False, not {}", std::string(py::repr(value))));
  return value.ptr() == Py_True;
}

// The value `value` names among `choices` (app's table, the CLI's too).
template <class T, std::size_t N>
T choice(const std::string& key, const py::handle& value, const std::array<app::Choice<T>, N>& choices) {
  const std::string v = py::str(value);
  if (auto selected = app::parse_choice(choices, v)) return *selected;
  throw bad(key, fmt::format("must be {}, not '{}'", app::choice_list(choices), v));
}

}  // namespace

OpenOptions open_options(const py::dict& options) {
  OpenOptions o;
  // A Python process loads with `eredu load`'s preset: many requests in flight, and large
  // ones, so both cores copy. The staging budget comes from _options.py (64 MiB, less for
  // small checkpoints): loads that keep dtypes read straight into tensors.
  o.source.reader.depth = app::LoadPreset::depth;
  o.source.reader.max_request = app::LoadPreset::request;
  o.source.pool.budget = std::size_t{64} << 20;
  o.threads = Runtime::default_threads();
  for (auto [k, value] : options) {
    const std::string key = py::str(k);
    if (value.is_none()) continue;
    if (key == "budget") {
      o.source.pool.budget = positive<std::size_t>(key, value);
    } else if (key == "depth") {
      o.source.reader.depth = positive<unsigned>(key, value);
    } else if (key == "request") {
      o.source.reader.max_request = positive<std::size_t>(key, value);
    } else if (key == "chunk") {
      o.source.chunk_bytes = positive<std::size_t>(key, value);
    } else if (key == "threads") {
      o.threads = positive<int>(key, value);
    } else if (key == "reader") {
      o.source.reader.kind = choice(key, value, app::reader_choices);
    } else if (key == "direct") {
      o.source.reader.direct = choice(key, value, app::direct_choices);
    } else if (key == "map_resident") {
      o.source.map_resident = flag(key, value);
    } else if (key == "register_buffers") {
      o.source.reader.register_buffers = flag(key, value);
    } else if (key == "copy_resident") {
      o.copy_resident = flag(key, value);
    } else if (key == "weights") {
      // "map-private" is Python's alone (the eredu command's --weights has no use for writable
      // weights): copy-on-write mappings, what torch's mapped weights are made of.
      if (py::isinstance<py::str>(value) && value.cast<std::string>() == "map-private")
        o.weights = cpu::WeightStorage::mapped_private;
      else
        o.weights = choice(key, value, app::weight_choices);
    } else if (key == "cache") {
      o.source.remote.cache_dir = std::filesystem::path(value.cast<std::string>());
    } else if (key == "cache_max") {
      o.source.remote.cache_max_bytes = value.cast<std::uint64_t>();
    } else if (key == "ca_file") {
      o.source.remote.http.ca_file = std::filesystem::path(value.cast<std::string>());
    } else if (key == "s3_endpoint") {
      o.source.remote.s3.endpoint = value.cast<std::string>();
    } else if (key == "s3_region") {
      o.source.remote.s3.region = value.cast<std::string>();
    } else if (key == "s3_addressing") {
      const std::string v = value.cast<std::string>();
      o.source.remote.s3.addressing = v == "path"      ? io::S3Options::Addressing::path
                                      : v == "virtual" ? io::S3Options::Addressing::virtual_host
                                                       : io::S3Options::Addressing::automatic;
    } else if (key == "anonymous") {
      o.source.remote.s3.anonymous = flag(key, value);
    } else if (key == "part_size") {
      o.source.remote.part_bytes = positive<std::size_t>(key, value);
    } else if (key == "connections") {
      o.source.remote.concurrency = positive<unsigned>(key, value);
      o.source.remote.http.max_transfers = std::max(o.source.remote.http.max_transfers, o.source.remote.concurrency);
    } else if (key == "_faults") {
      if (!py::isinstance<ReadGate>(value)) throw bad(key, "must be an eredu._native._ReadGate");
      o.faults = value.cast<std::shared_ptr<ReadGate>>();
    } else {
      throw bad(key, "unknown option");
    }
  }
  if (o.faults) {
    o.source.reader.faults = o.faults.get();
    o.source.reader.kind = io::ReaderKind::pread;  // the gate blocks reader threads, never the loop
  }
  return o;
}

}  // namespace eredu::python
