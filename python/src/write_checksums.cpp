#include "write_checksums.hpp"

#include <string>

#include "eredu/app/checksum_sidecar.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "text.hpp"

namespace eredu::python {

namespace py = pybind11;

namespace {

/// Thrown through the hashing when Python has a signal's exception (KeyboardInterrupt) to raise.
struct PythonSignal {};

}  // namespace

void bind_write_checksums(py::module_& m) {
  m.def(
      "write_checksums",
      [](const py::object& path_object, const std::string& digest) {
        const std::string path = path_bytes(path_object, "path");
        const std::vector<io::DigestKind> kinds = app::digest_kinds(digest);
        app::HashProgress progress;
        // Checked once per 4 MiB buffer, as `eredu checksum` checks for a signal.
        progress.check = [](const std::string&) {
          py::gil_scoped_acquire gil;
          if (PyErr_CheckSignals() != 0) throw PythonSignal{};
        };
        app::WrittenChecksums written;
        try {
          py::gil_scoped_release nogil;
          const io::Catalog catalog = io::open_catalog(path);
          written = app::write_checksums(path, catalog, kinds, {}, progress);
        } catch (const PythonSignal&) {
          throw py::error_already_set();  // the GIL is back: raise what the signal handler set
        }
        std::uint64_t digests = 0;  // whole-tensor digests written, each kind counted
        for (const auto& [tensor, d] : written.checksums.digests())
          digests += (d.get(io::DigestKind::sha256) ? 1 : 0) + (d.get(io::DigestKind::xxh3_128) ? 1 : 0);
        py::dict out;
        out["sidecar"] = path_str(written.sidecar.string());
        out["tensors"] = written.stats.tensors;
        out["bytes"] = written.stats.bytes;
        out["digests"] = digests;
        out["verified"] = written.stats.verified;
        out["shard_verified"] = written.stats.verified_shards;
        return out;
      },
      py::arg("path"), py::arg("digest"),
      "Writes the checkpoint's checksum sidecar (app::write_checksums); returns what was written and checked.");
}

}  // namespace eredu::python
