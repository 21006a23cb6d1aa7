#include "write_checksums.hpp"

#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "eredu/app/checksum_sidecar.hpp"
#include "eredu/app/sharding_presets.hpp"
#include "eredu/core/error.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "text.hpp"

namespace eredu::python {

namespace py = pybind11;

namespace {

/// Thrown through the hashing when Python has a signal's exception (KeyboardInterrupt) to raise.
struct PythonSignal {};

/// tensor_parallel=, heads=, kv_heads=, head_dim=, family=, shard= (0: not given), as the Python
/// layer checked them.
struct TensorParallelRequest {
  int ranks = 0;
  app::HeadOptions heads{};
  std::string family;
  std::vector<std::string> shard;
};

/// The shard selections of every rank (app's sharding presets, as `eredu checksum
/// --tensor-parallel N` plans them), and the dims they were planned with.
std::pair<app::ShardSelections, app::LlamaDims> plan_shards(const io::Catalog& catalog, const std::string& path,
                                                            const TensorParallelRequest& tp) {
  const app::ShardingFamily family = app::parse_sharding_family(tp.family);
  for (const std::string& rule : tp.shard) {
    try {
      app::parse_shard_rule(rule);
    } catch (const Error& e) {
      throw Error(errc::invalid_argument, {}, "shard: " + e.detail());
    }
  }
  app::LlamaDims dims = app::llama_dims(catalog, tp.heads, path, app::python_head_option_names);
  const engine::ShardingRules rules = app::sharding_rules(tp.shard, family, dims.sharding);
  return {app::tensor_parallel_selections(catalog, rules, tp.ranks), std::move(dims)};
}

}  // namespace

void bind_write_checksums(py::module_& m) {
  m.def(
      "write_checksums",
      [](const py::object& path_object, const std::string& digest, int tensor_parallel, std::uint64_t heads,
         std::uint64_t kv_heads, std::uint64_t head_dim, const std::string& family,
         const std::vector<std::string>& shard) {
        const std::string path = path_bytes(path_object, "path");
        const std::vector<io::DigestKind> kinds = app::digest_kinds(digest);
        app::HashProgress progress;
        // Checked once per 4 MiB buffer, as `eredu checksum` checks for a signal.
        progress.check = [](const std::string&) {
          py::gil_scoped_acquire gil;
          if (PyErr_CheckSignals() != 0) throw PythonSignal{};
        };
        const TensorParallelRequest tp{tensor_parallel, {heads, kv_heads, head_dim}, family, shard};
        app::WrittenChecksums written;
        app::ShardSelections shards;
        std::optional<app::LlamaDims> dims;
        try {
          py::gil_scoped_release nogil;
          const io::Catalog catalog = io::open_catalog(path);
          if (tp.ranks > 0) std::tie(shards, dims) = plan_shards(catalog, path, tp);
          written = app::write_checksums(path, catalog, kinds, shards, progress);
        } catch (const PythonSignal&) {
          throw py::error_already_set();  // the GIL is back: raise what the signal handler set
        }
        std::uint64_t digests = 0;  // whole-tensor digests written, each kind counted
        for (const auto& [tensor, d] : written.checksums.digests())
          for (io::DigestKind kind : io::digest_kinds) digests += d.get(kind) ? 1 : 0;
        py::dict out;
        out["sidecar"] = path_str(written.sidecar.string());
        out["tensors"] = written.stats.tensors;
        out["bytes"] = written.stats.bytes;
        out["digests"] = digests;
        out["verified"] = written.stats.verified;
        out["shard_verified"] = written.stats.verified_shards;
        out["shards"] = written.checksums.shard_count();
        if (dims) {
          std::size_t asked = 0;
          for (const auto& [tensor, selections] : shards) asked += selections.size();
          py::dict t;
          t["ranks"] = tensor_parallel;
          t["head_dim"] = dims->sharding.head_dim;
          t["heads"] = dims->sharding.heads;
          t["kv_heads"] = dims->sharding.kv_heads;
          t["dims_from"] = dims->source;
          t["split_tensors"] = shards.size();
          t["shards"] = asked;
          out["tensor_parallel"] = t;
        } else {
          out["tensor_parallel"] = py::none();
        }
        return out;
      },
      py::arg("path"), py::arg("digest"), py::arg("tensor_parallel") = 0, py::arg("heads") = 0, py::arg("kv_heads") = 0,
      py::arg("head_dim") = 0, py::arg("family") = "llama", py::arg("shard") = std::vector<std::string>{},
      "Writes the checkpoint's checksum sidecar (app::write_checksums); returns what was written and checked.");
}

}  // namespace eredu::python
