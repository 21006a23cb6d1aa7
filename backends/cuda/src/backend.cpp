#include "eredu/cuda/backend.hpp"

#include <cuda_runtime_api.h>

#include <fmt/format.h>
#include <asio/co_spawn.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>

#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"
#include "eredu/cuda/cuda_error.hpp"
#include "eredu/cuda/kernels.hpp"
#include "eredu/engine/parameter_backend.hpp"
#include "eredu/engine/submission_backend.hpp"
#include "eredu/engine/transfer_backend.hpp"

namespace eredu::cuda {

static_assert(engine::ParameterBackend<Backend>);
static_assert(engine::SubmissionBackend<Backend>);
static_assert(engine::TransferBackend<Backend>);

namespace {

using engine::DerivedWeightRecipe;
using Kind = DerivedWeightRecipe::Kind;

/// Bytes per element of a whole-byte dtype (layout recipes were inferred: no sub-byte dtypes).
std::size_t element_bytes(DType t) { return dtype_bits(t) / 8; }

/// The error a realization ends with when the unit told it to stop.
Error stopped(const std::string& what) {
  return Error(errc::cancelled, {.tensor = what}, "stopped because another weight of the unit failed");
}

/// Awaits `c`, rethrowing its failure.
asio::awaitable<void> await(Completion c) { co_await c.async_wait(asio::use_awaitable); }

/// Awaits `c` and hands back its failure instead of throwing (for draining on error paths,
/// where a catch handler may not co_await).
asio::awaitable<std::exception_ptr> settle(Completion c) {
  try {
    co_await c.async_wait(asio::use_awaitable);
  } catch (...) {
    co_return std::current_exception();
  }
  co_return nullptr;
}

/// One warning per process: copies from pageable staging are correct but slower (the driver
/// stages them through its own pinned buffer, and the call blocks until it has).
void warn_pageable_once() {
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    log::warn(
        "CUDA backend: the staging memory is not page-locked (no pin_staging in the context): "
        "host-to-device copies go through the driver's bounce buffer");
}

/// What every step of one realization needs.
struct Job {
  io::CheckpointSource& source;
  Executor& executor;
  DeviceMemoryPool& memory;
  const PinnedRegistration* staging;
  std::stop_token stop;
};

/// A temporary device buffer on the executor's stream, freed (stream-ordered) with its last handle.
Tensor temporary(const Job& job, const engine::InferredWeight& w, const std::string& name) {
  return Tensor::allocate(job.memory, w.dtype, w.shape, job.executor.shared_stream(), name);
}

/// Reads `request` in bounded chunk leases and copies each to `dst + lease offset` on the
/// device while the next is read. Each lease is retained by the completion of its own copy.
/// On failure, waits for the copies already queued before reporting, so that no lease is
/// held and no copy still writes when the realization completes.
asio::awaitable<void> upload(const Job& job, const io::TensorReadRequest& whole, std::byte* dst) {
  io::TensorReadRequest request = whole;
  request.policy = io::ReadPolicy::chunked;
  io::ChunkStream stream = job.source.stream(request);
  Completion last = Completion::ready_now();
  for (;;) {
    std::exception_ptr failure;
    std::optional<io::Lease> lease;
    if (job.stop.stop_requested()) {
      failure = std::make_exception_ptr(stopped(request.key));
    } else if (last.ready() && last.error()) {
      failure = last.error();
    } else {
      try {
        lease = co_await stream.async_next(asio::use_awaitable);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    if (failure) {
      // Copies of earlier chunks may still be running: let them finish (and release) first.
      co_await settle(last);
      std::rethrow_exception(failure);
    }
    if (!lease) break;
    const std::span<const std::byte> bytes = lease->bytes();
    if (job.staging == nullptr || !job.staging->contains(bytes)) warn_pageable_once();
    Completion copied = job.executor.enqueue(
        [to = dst + lease->offset(), from = bytes.data(), n = bytes.size(), key = request.key](cudaStream_t s) {
          check(cudaMemcpyAsync(to, from, n, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync (host to device)", key);
        },
        request.key);
    Executor::retain_until_complete(copied, std::move(*lease));
    last = copied;
  }
  co_await await(last);
}

/// Queues a copy of `launch` (which returns a launch status) on the executor and awaits its
/// work. Takes the caller's named lambda by reference: g++ 12 mishandles class temporaries
/// in co_await expressions (see io.md).
template <class Launch>
asio::awaitable<void> run_kernel(const Job& job, const char* what, const std::string& name, const Launch& launch) {
  Completion done =
      job.executor.enqueue([launch, what, name](cudaStream_t s) mutable { check(launch(s), what, name); }, name);
  co_await await(done);
}

/// Writes the value of `node` into `out` (device memory of exactly the node's bytes).
asio::awaitable<void> eval_into(const Job& job, const DerivedWeightRecipe& node, std::byte* out) {
  const io::Catalog& catalog = job.source.catalog();
  const std::string name = node.to_string();
  if (job.stop.stop_requested()) throw stopped(name);
  switch (node.kind()) {
    case Kind::source: {
      io::TensorReadRequest request{node.key(), node.selection()};
      co_await upload(job, request, out);
      co_return;
    }
    case Kind::reshape:
      // Row-major bytes do not change under a reshape.
      co_await eval_into(job, node.inputs()[0], out);
      co_return;
    case Kind::cast: {
      const DerivedWeightRecipe& child = node.inputs()[0];
      engine::InferredWeight in = child.infer(catalog);
      if (in.dtype == node.dtype()) {
        co_await eval_into(job, child, out);
        co_return;
      }
      if (!convert_supported(in.dtype, node.dtype()))
        throw BackendError(
            errc::recipe_unsupported_cast, {.tensor = name},
            fmt::format("the CUDA backend cannot convert {} to {}", dtype_name(in.dtype), dtype_name(node.dtype())));
      // The whole input lands on the device first: one H2D stream of leases, then one kernel.
      Tensor tmp = temporary(job, in, name);
      co_await eval_into(job, child, tmp.data());
      const std::uint64_t count = tmp.elements();
      auto launch = [tmp, out, count, from = in.dtype, to = node.dtype()](cudaStream_t s) {
        return launch_convert(from, to, tmp.data(), out, count, s);
      };
      co_await run_kernel(job, "conversion kernel launch", name, launch);
      co_return;
    }
    case Kind::slice: {
      const DerivedWeightRecipe& child = node.inputs()[0];
      engine::InferredWeight in = child.infer(catalog);
      if (child.kind() == Kind::source) {
        // Fold the slice into the read's selection: only the sliced bytes are read.
        const io::TensorInfo& t = catalog.at(child.key());
        std::vector<Range> ranges = child.selection().ranges;
        if (ranges.empty())
          for (auto d : t.shape) ranges.push_back({0, d});
        Range& r = ranges[node.dim()];
        r = {r.start + node.range().start, r.start + node.range().stop};
        io::TensorReadRequest request{child.key(), Selection{std::move(ranges)}};
        co_await upload(job, request, out);
        co_return;
      }
      Tensor tmp = temporary(job, in, name);
      co_await eval_into(job, child, tmp.data());
      const std::size_t elem = element_bytes(in.dtype);
      std::size_t outer = 1, inner = elem;
      for (std::size_t d = 0; d < node.dim(); ++d) outer *= in.shape[d];
      for (std::size_t d = node.dim() + 1; d < in.shape.size(); ++d) inner *= in.shape[d];
      const std::size_t out_row = node.range().size() * inner, in_row = in.shape[node.dim()] * inner;
      const std::size_t start = node.range().start * inner;
      auto launch = [tmp, out, outer, out_row, in_row, start](cudaStream_t s) {
        return launch_copy_rows(out, out_row, tmp.data() + start, in_row, outer, out_row, s);
      };
      co_await run_kernel(job, "slice kernel launch", name, launch);
      co_return;
    }
    case Kind::concat: {
      engine::InferredWeight whole = node.infer(catalog);
      std::size_t outer = 1;
      for (std::size_t d = 0; d < node.dim(); ++d) outer *= whole.shape[d];
      if (outer == 1) {
        // Each input is one contiguous block of the output: evaluate it in place.
        std::size_t offset = 0;
        for (const DerivedWeightRecipe& child : node.inputs()) {
          const std::size_t bytes = child.infer(catalog).bytes;
          co_await eval_into(job, child, out + offset);
          offset += bytes;
        }
        co_return;
      }
      std::size_t inner = element_bytes(whole.dtype);
      for (std::size_t d = node.dim() + 1; d < whole.shape.size(); ++d) inner *= whole.shape[d];
      const std::size_t out_row = whole.shape[node.dim()] * inner;
      std::size_t offset = 0;
      for (const DerivedWeightRecipe& child : node.inputs()) {
        engine::InferredWeight part = child.infer(catalog);
        Tensor tmp = temporary(job, part, name);
        co_await eval_into(job, child, tmp.data());
        const std::size_t row = part.shape[node.dim()] * inner;
        auto launch = [tmp, out, offset, out_row, row, outer](cudaStream_t s) {
          return launch_copy_rows(out + offset, out_row, tmp.data(), row, outer, row, s);
        };
        co_await run_kernel(job, "concat kernel launch", name, launch);
        offset += row;
      }
      co_return;
    }
    case Kind::permute: {
      const DerivedWeightRecipe& child = node.inputs()[0];
      engine::InferredWeight in = child.infer(catalog);
      if (in.shape.size() > max_permute_rank)
        throw BackendError(
            errc::backend_failure, {.tensor = name},
            fmt::format("the CUDA backend permutes up to rank {}, not rank {}", max_permute_rank, in.shape.size()));
      Tensor tmp = temporary(job, in, name);
      co_await eval_into(job, child, tmp.data());
      // permutation() resolves a transpose of a rank only known from the catalog.
      std::vector<std::size_t> order = node.permutation(in.shape.size());
      std::vector<std::size_t> dims(in.shape.begin(), in.shape.end());
      auto launch = [tmp, out, dims, order, elem = element_bytes(in.dtype)](cudaStream_t s) {
        return launch_permute(tmp.data(), out, dims.data(), order.data(), dims.size(), elem, s);
      };
      co_await run_kernel(job, "permute kernel launch", name, launch);
      co_return;
    }
  }
}

/// The checkpoint dtype kept: upload the selected bytes into the tensor.
asio::awaitable<void> read_direct(Job job, std::unique_ptr<io::TensorReadRequest> request, Tensor tensor) {
  if (job.stop.stop_requested()) throw stopped(request->key);
  co_await upload(job, *request, tensor.data());
}

/// The whole recipe into its output tensor.
asio::awaitable<void> run_recipe(Job job, std::unique_ptr<DerivedWeightRecipe> recipe, Tensor out) {
  co_await eval_into(job, *recipe, out.data());
}

/// Runs `work` on the source's executor; its end completes the returned Materialization.
Materialization start(io::CheckpointSource& source, Tensor weight, asio::awaitable<void> work) {
  CompletionSource done;
  Completion completion = done.completion();
  asio::co_spawn(source.get_executor(), std::move(work),
                 [done = std::move(done)](std::exception_ptr e) mutable { done.finish(std::move(e)); });
  return Materialization{std::move(weight), std::move(completion)};
}

}  // namespace

Materialization Backend::materialize(io::CheckpointSource& source, const io::TensorReadRequest& request,
                                     MaterializationContext& context, std::stop_token stop) {
  const io::TensorInfo& info = source.catalog().at(request.key);
  source.selected_bytes(request);  // validates the selection before anything is allocated
  Shape shape = request.selection.is_all() ? info.shape : request.selection.selected_shape(info.shape);
  Tensor weight =
      Tensor::allocate(context.memory, info.dtype, std::move(shape), context.executor.shared_stream(), request.key);
  Job job{source, context.executor, context.memory, context.staging, std::move(stop)};
  return start(source, weight, read_direct(job, std::make_unique<io::TensorReadRequest>(request), weight));
}

Materialization Backend::materialize_recipe(io::CheckpointSource& source, const engine::DerivedWeightRecipe& recipe,
                                            MaterializationContext& context, std::stop_token stop) {
  engine::InferredWeight w = recipe.infer(source.catalog());
  Tensor weight =
      Tensor::allocate(context.memory, w.dtype, w.shape, context.executor.shared_stream(), recipe.to_string());
  Job job{source, context.executor, context.memory, context.staging, std::move(stop)};
  return start(source, weight, run_recipe(job, std::make_unique<DerivedWeightRecipe>(recipe), weight));
}

Tensor Backend::finish_materialization(Materialization&& m) {
  m.done.get();
  return std::move(m.weight);
}

void Backend::validate_bind(const Parameter& parameter, const Tensor& weight) {
  if (weight.dtype() != parameter.dtype)
    throw BackendError(errc::bind_dtype_mismatch, {},
                       fmt::format("the parameter holds {} but the weight is {}", dtype_name(parameter.dtype),
                                   dtype_name(weight.dtype())));
  if (weight.shape() != parameter.shape)
    throw BackendError(errc::bind_shape_mismatch, {},
                       fmt::format("the parameter has shape {} but the weight has shape {}",
                                   format_shape(parameter.shape), format_shape(weight.shape())));
}

std::pair<Tensor, Completion> Backend::promote(Executor& executor, const HostBuffer& host, DeviceMemoryPool& memory) {
  Tensor t = Tensor::allocate(memory, host.dtype(), host.shape(), executor.shared_stream());
  Completion c = executor.enqueue([to = t.data(), from = host.bytes().data(), n = host.bytes().size()](cudaStream_t s) {
    check(cudaMemcpyAsync(to, from, n, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync (promote)");
  });
  Executor::retain_until_complete(c, host.block());
  Executor::retain_until_complete(c, t.storage());
  return {std::move(t), std::move(c)};
}

std::pair<Tensor, Completion> Backend::promote(Executor& executor, const HostBuffer& host) {
  return promote(executor, host, default_memory(executor.device()));
}

std::pair<HostBuffer, Completion> Backend::demote(Executor& executor, const Tensor& weight) {
  HostBuffer host(weight.dtype(), weight.shape(), weight.nbytes());
  Completion c =
      executor.enqueue([to = host.bytes().data(), from = weight.data(), n = weight.nbytes()](cudaStream_t s) {
        check(cudaMemcpyAsync(to, from, n, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync (demote)");
      });
  Executor::retain_until_complete(c, host.block());
  Executor::retain_until_complete(c, weight.storage());
  return {std::move(host), std::move(c)};
}

DeviceMemoryPool& Backend::default_memory(int device) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<DeviceMemoryPool>> pools;
  std::lock_guard lock(mutex);
  std::unique_ptr<DeviceMemoryPool>& pool = pools[device];
  if (!pool) pool = std::make_unique<DeviceMemoryPool>(device);
  return *pool;
}

}  // namespace eredu::cuda
