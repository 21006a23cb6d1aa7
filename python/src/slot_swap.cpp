#include "slot_swap.hpp"

#include <stdexcept>

#include "eredu/core/completion.hpp"

namespace eredu::python {

namespace py = pybind11;

namespace {

/// A rejection's message as UTF-8 whatever it holds: a surrogate that escapes no byte is spelled
/// out, so that reporting a verdict cannot fail (and leave the swap waiting for one).
std::string verdict_text(const py::object& rejection) {
  const py::str text(rejection);
  py::object encoded =
      py::reinterpret_steal<py::object>(PyUnicode_AsEncodedString(text.ptr(), "utf-8", "backslashreplace"));
  if (!encoded) throw py::error_already_set();
  return std::string(PyBytes_AS_STRING(encoded.ptr()), static_cast<std::size_t>(PyBytes_GET_SIZE(encoded.ptr())));
}

}  // namespace

/// The verdict comes as `finish(None)` (accept) or `finish(message)` (reject). The loop is free
/// meanwhile. A verdict that can never come (the job dropped unrun) fails the wait with
/// cancelled, which rejects the version.
asio::awaitable<void> python_canary(std::shared_ptr<Operation> op, std::shared_ptr<PyHandle> job, bool blocking,
                                    std::vector<cpu::Tensor> tensors,
                                    std::shared_ptr<const std::vector<ReadSpec>> specs) {
  auto verdict = std::make_shared<CompletionSource>();
  Completion decided = verdict->completion();
  op->run_in_python([job, blocking, tensors = std::move(tensors), specs, verdict]() {
    py::cpp_function finish([verdict](const py::object& rejection) {
      if (rejection.is_none())
        verdict->complete();
      else
        verdict->fail(std::make_exception_ptr(std::runtime_error(verdict_text(rejection))));
    });
    try {
      job->get()(export_tensors(tensors, *specs), finish, blocking);
    } catch (py::error_already_set& e) {
      verdict->fail(std::make_exception_ptr(std::runtime_error(e.what())));
    }
  });
  co_await decided.async_wait(asio::use_awaitable);
}

py::dict report_dict(const engine::SwapReport& r) {
  py::dict d;
  d["generation"] = r.generation;
  d["bytes"] = r.bytes;
  d["verified_bytes"] = r.verified_bytes;
  d["load_s"] = r.load_s;
  d["verify_s"] = r.verify_s;
  d["canary_s"] = r.canary_s;
  d["publish_pause_ns"] = r.publish_pause.count();
  d["readers_drained_ns"] = r.readers_drained.count();
  d["written_bytes"] = r.written_bytes;
  d["hashed_bytes"] = r.hashed_bytes;
  return d;
}

py::dict storage_dict(const cpu::StoragePoolStats& stats) {
  py::dict d;
  d["live_bytes"] = stats.live_bytes;
  d["retained_bytes"] = stats.retained_bytes;
  d["fresh_allocations"] = stats.fresh_allocations;
  d["recycled_allocations"] = stats.recycled_allocations;
  return d;
}

std::function<SwapInput<io::CheckpointSource>()> checkpoint_input(std::shared_ptr<Checkpoint> checkpoint, int verify) {
  io::Checksums checksums = checkpoint->checksums_to_verify(verify);
  return [checkpoint, checksums = std::move(checksums)]() mutable {
    auto use = std::make_shared<Checkpoint::Use>(checkpoint->use());
    SwapInput<io::CheckpointSource> in;
    in.source = &use->source();
    in.name = checkpoint->path();
    in.checksums = std::move(checksums);
    in.keep = use;
    return in;
  };
}

#ifdef EREDU_PYTHON_LIVE
std::function<SwapInput<mpi::PublishedSource>()> published_input(std::shared_ptr<PublishedVersion> version) {
  return [version] {
    SwapInput<mpi::PublishedSource> in;
    in.source = &version->source();
    in.name = version->source().location();
    in.keep = version;
    mpi::PublishedSource* source = in.source;
    in.confirm = [source]() -> asio::awaitable<void> { co_await source->async_confirm(asio::use_awaitable); };
    in.finished = [source](bool ok) {
      source->finish(ok);
      source->use_base({}, {});  // lets the serving version it copied from go
    };
    in.location = source->location();
    in.use_base = [source](const std::string& serving_location, const engine::WeightBindingPlan& plan,
                           std::function<std::span<const std::byte>(const std::string&)> parameter_bytes) {
      if (!source->base().empty() && serving_location == source->base_location())
        source->use_base(source->base(), mpi::base_from_parameters(plan, std::move(parameter_bytes)));
    };
    in.digests = [source](const engine::WeightBindingPlan& plan) -> asio::awaitable<io::Checksums> {
      co_return co_await source->async_checksums(plan, asio::use_awaitable);
    };
    return in;
  };
}
#endif

}  // namespace eredu::python
