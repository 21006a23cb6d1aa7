#include "checkpoint.hpp"

#include <pybind11/stl.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/post.hpp>
#include <utility>

#include <fmt/format.h>

#include "eredu/app/unit_grouping.hpp"
#include "eredu/core/error.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/engine/orchestration/materialize.hpp"
#include "runtime.hpp"
#include "text.hpp"

namespace eredu::python {

namespace py = pybind11;

namespace {

py::dict metadata_dict(const io::Metadata& metadata) {
  py::dict d;
  for (const auto& [k, v] : metadata) d[text_str(k)] = text_str(v);
  return d;
}

/// Lets `source` go on the loop thread, after the handler running now: a source is never
/// destroyed inside a completion handler of one of its own operations.
void destroy_on_loop(std::unique_ptr<io::CheckpointSource> source) noexcept {
  if (!source) return;
  try {
    Runtime& runtime = Runtime::get();
    if (runtime.on_loop_thread()) {
      runtime.post([s = std::move(source)]() mutable { s.reset(); });
      return;
    }
    runtime.run_on_loop([&source] { source.reset(); });
  } catch (...) {
    // No memory to post it, or a forked child without a loop: the source is leaked, as
    // destroying it off the loop could race with its own handlers.
    if (source) (void)source.release();
  }
}

}  // namespace

Checkpoint::Use::Use(std::shared_ptr<Checkpoint> checkpoint) : checkpoint_(std::move(checkpoint)) {
  ++checkpoint_->uses_;
}

Checkpoint::Use::~Use() {
  if (!checkpoint_) return;  // moved from
  if (--checkpoint_->uses_ == 0 && checkpoint_->closed()) destroy_on_loop(checkpoint_->take_source());
}

Checkpoint::Checkpoint(Passkey, std::string path, OpenOptions options, std::unique_ptr<io::CheckpointSource> source)
    : path_(std::move(path)),
      options_(std::move(options)),
      catalog_(source->catalog()),
      executor_(std::make_unique<cpu::Executor>(options_.threads)),
      storage_(Runtime::get().storage()),
      source_(std::move(source)) {}

Checkpoint::~Checkpoint() { destroy_on_loop(take_source()); }

std::unique_ptr<io::CheckpointSource> Checkpoint::take_source() {
  std::lock_guard lock(source_mutex_);
  return std::move(source_);
}

std::shared_ptr<Operation> Checkpoint::open(std::string path, OpenOptions options) {
  auto op = Operation::create(fmt::format("opening {}", path));
  Runtime& runtime = Runtime::get();
  runtime.post([op, path = std::move(path), options = std::move(options), &runtime]() mutable {
    op->settle([&] {
      io::SourceOptions source_options = options.source;
      io::async_open_checkpoint(
          runtime.executor(), path, std::move(source_options),
          [op, path, options](std::exception_ptr error, std::unique_ptr<io::CheckpointSource> source) mutable {
            if (error) {
              op->finish(std::move(error));
              return;
            }
            op->settle([&] {
              auto checkpoint =
                  std::make_shared<Checkpoint>(Passkey{}, std::move(path), std::move(options), std::move(source));
              op->finish(nullptr, [checkpoint] { return py::cast(checkpoint); });
            });
          });
    });
  });
  return op;
}

Checkpoint::Use Checkpoint::use() {
  if (closed() || !source_) throw Error(errc::invalid_argument, {.file = path_}, "the checkpoint is closed");
  return Use(shared_from_this());
}

std::shared_ptr<const io::Checksums> Checkpoint::checksums() const {
  std::lock_guard lock(checksums_mutex_);
  if (!checksums_) checksums_ = std::make_shared<const io::Checksums>(io::Checksums::discover(path_, catalog_));
  return checksums_;
}

io::Checksums Checkpoint::checksums_to_verify(int verify) const {
  if (verify <= 0) return {};
  io::Checksums recorded = *checksums();
  if (verify > 1 && recorded.empty())
    throw Error(errc::invalid_argument, {.file = path_},
                fmt::format("verify=True, but the checkpoint records no checksums (no 'sha256:<tensor>' metadata, no "
                            "sidecar {})",
                            io::Checksums::sidecar_path(path_).string()));
  return recorded;
}

engine::VerifyOptions Checkpoint::verify_options(int verify) const {
  engine::VerifyOptions options;
  options.checksums = checksums_to_verify(verify);
  // verify=None verifies only what is recorded, silently when nothing is; verify=True fails
  // before any read unless every tensor read has a digest.
  options.mode = verify > 1                  ? engine::VerifyMode::require
                 : options.checksums.empty() ? engine::VerifyMode::off
                                             : engine::VerifyMode::on;
  return options;
}

std::shared_ptr<Operation> Checkpoint::read(std::vector<ReadSpec> specs, int verify) {
  engine::MaterializeOptions options;
  options.verify = verify_options(verify);
  auto op = Operation::create(fmt::format("load from {}", path_));
  // The operation outlives the load (its handler holds it), so its counters may be the load's.
  options.progress = &op->progress();
  Runtime::get().post(
      [self = shared_from_this(), op, specs = std::move(specs), options = std::move(options)]() mutable {
        try {
          Use use = self->use();
          auto set = std::make_shared<const TensorSet>(TensorSet::build(self->catalog_, specs));
          if (specs.empty()) {
            op->finish(nullptr, [] { return py::object(py::list()); });
            return;
          }
          // The context must outlive the load: the handler keeps it.
          auto context = std::make_shared<cpu::MaterializationContext>(cpu::MaterializationContext{
              *self->executor_, self->storage_, self->options_.copy_resident, self->options_.weights});
          io::CheckpointSource& source = use.source();
          engine::async_materialize<cpu::Backend>(
              source, set->plan(), *context, std::move(options),
              asio::bind_cancellation_slot(
                  op->cancellation_slot(),
                  [use = std::make_shared<Use>(std::move(use)), op, set, context, specs = std::move(specs)](
                      std::exception_ptr error, engine::MaterializedUnit<cpu::Backend> unit) mutable {
                    if (error) {
                      op->finish(std::move(error));
                      return;
                    }
                    op->settle([&] {
                      std::vector<cpu::Tensor> tensors;
                      tensors.reserve(specs.size());
                      for (const engine::WeightBinding& b : set->plan().bindings())
                        tensors.push_back(*unit.find(b.id()));
                      op->finish(nullptr, [tensors = std::move(tensors), specs = std::move(specs)] {
                        return py::object(export_tensors(tensors, specs));
                      });
                    });
                  }));
        } catch (...) {
          op->finish(std::current_exception());
        }
      });
  return op;
}

py::dict Checkpoint::staging() {
  std::size_t budget = 0, in_use = 0, high_water = 0, waiting = 0;
  {
    // Not on the loop: the pool's counters are thread-safe, and the loop may be held up.
    py::gil_scoped_release nogil;
    std::lock_guard lock(source_mutex_);
    if (source_) {
      io::LeasePool& pool = source_->pool();
      budget = pool.budget();
      in_use = pool.in_use();
      high_water = pool.high_water();
      waiting = pool.waiting();
    }
  }
  py::dict d;
  d["budget"] = budget;
  d["in_use"] = in_use;
  d["high_water"] = high_water;
  d["waiting"] = waiting;
  return d;
}

void Checkpoint::close() {
  // On the loop thread, in order: an operation posted before close() (a read, a swap) still gets
  // its use of the source; one posted after is refused.
  Runtime::get().run_on_loop([this] {
    if (closed_.exchange(true, std::memory_order_acq_rel)) return;
    if (uses_ == 0) {
      std::unique_ptr<io::CheckpointSource> source = take_source();
      source.reset();
    }
  });
}

py::list tensor_tuples(const io::Catalog& catalog) {
  py::list out;
  for (const io::TensorInfo& t : catalog.tensors())
    out.append(py::make_tuple(text_str(t.name), std::string(dtype_name(t.dtype)), py::tuple(py::cast(t.shape)),
                              t.nbytes, t.file, t.offset));
  return out;
}

void bind_checkpoint(py::module_& m) {
  py::class_<Checkpoint, std::shared_ptr<Checkpoint>>(m, "Checkpoint", "An open checkpoint (eredu._native.open).")
      .def_property_readonly(
          "path", [](const Checkpoint& c) { return path_str(c.path()); },
          "The path as opened (as os.fsdecode gives it).")
      .def(
          "tensors", [](const Checkpoint& c) { return tensor_tuples(c.catalog()); },
          "(name, dtype, shape, nbytes, file index, offset) of every tensor, in file order.")
      .def(
          "units",
          [](const Checkpoint& c, const std::string& preset) {
            const app::UnitGrouping g = app::group_units(c.catalog(), app::parse_unit_preset(preset));
            py::list units;
            for (const app::UnitGroup& u : g.units) {
              py::list members;
              for (const app::TensorRequest& r : u.requests)
                members.append(py::make_tuple(text_str(r.key), text_str(r.name)));
              units.append(py::make_tuple(text_str(u.name), members));
            }
            py::list skipped;
            for (const std::string& name : g.skipped) skipped.append(text_str(name));
            return py::make_tuple(units, skipped);
          },
          py::arg("preset"),
          "A unit grouping preset by name (\"layers\" or \"experts\", app::group_units, as `eredu pipeline "
          "--units` groups): ([(unit name, [(tensor name, slot name)])], [tensor names in no unit]).")
      .def(
          "metadata", [](const Checkpoint& c) { return metadata_dict(c.catalog().metadata()); },
          "The checkpoint's metadata (a single file's __metadata__, or the index's).")
      .def(
          "files",
          [](const Checkpoint& c) {
            py::list out;
            for (const io::CheckpointFile& f : c.catalog().files()) {
              py::dict d;
              d["path"] = path_str(f.path);
              d["format"] = f.format;
              d["size"] = f.size;
              d["data_offset"] = f.data_offset;
              d["metadata"] = metadata_dict(f.metadata);
              out.append(d);
            }
            return out;
          },
          "Every file of the checkpoint.")
      .def(
          "read",
          [](Checkpoint& c, const py::object& specs, int verify) { return c.read(read_specs_from(specs), verify); },
          py::arg("specs"), py::arg("verify") = 0,
          "Starts loading `specs` as one unit (verify: 0 off, 1 what has a digest, 2 everything); the Operation's "
          "result is a list of Tensor.")
      .def("staging", &Checkpoint::staging, "The staging pool's budget, in_use, high_water and waiting.")
      .def(
          "checksums",
          [](const Checkpoint& c) {
            py::dict out;
            for (const auto& [tensor, digests] : c.checksums()->digests()) {
              py::dict d;
              for (io::DigestKind kind : io::digest_kinds)
                if (const std::string* digest = digests.get(kind))
                  d[py::str(std::string(io::digest_name(kind)))] = *digest;
              out[text_str(tensor)] = d;
            }
            return out;
          },
          "Tensor -> {'sha256': hex, 'xxh3-128': hex, 'xxh3-128-blocks': hex} (those recorded) in the metadata or the "
          "sidecar file.")
      .def(
          "close",
          [](Checkpoint& c) {
            py::gil_scoped_release nogil;
            c.close();
          },
          "Refuses new reads; the files close once the reads in flight have ended.")
      .def_property_readonly("closed", &Checkpoint::closed, "True after close().");

  m.def(
      "open",
      [](const py::object& path, const py::dict& options) {
        return Checkpoint::open(path_bytes(path, "path"), open_options(options));
      },
      py::arg("path"), py::arg("options"),
      "Starts opening the checkpoint at `path` (the OS's bytes, or a str os.fsencode encodes); the Operation's "
      "result is a Checkpoint.");
}

}  // namespace eredu::python
