#pragma once
/// \file
/// The CUDA backend's realization steps over any io::ByteSource (Backend::materialize and
/// materialize_recipe are templates on the source): device memory is planned a chunk stream
/// by the engine (engine::plan_placement); the steps here upload it, and run a recipe's
/// kernels on the executor's stream. Compiled for the local-file source in backend.cpp; other
/// sources instantiate them where they are used. Included by backend.hpp.

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <asio/co_spawn.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <cstddef>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "eredu/core/completion.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"
#include "eredu/cuda/backend.hpp"
#include "eredu/cuda/cuda_error.hpp"
#include "eredu/cuda/kernels.hpp"
#include "eredu/engine/description/recipe_evaluator.hpp"
#include "eredu/engine/orchestration/placement.hpp"
#include "eredu/io/reading/byte_source.hpp"

namespace eredu::cuda::detail {

using engine::DerivedWeightRecipe;
using engine::InferredWeight;

/// Bytes per element of a whole-byte dtype (layout recipes were inferred: no sub-byte dtypes).
inline std::size_t element_bytes(DType t) { return dtype_block(t).bytes; }

/// A shape as layout kernels see it: a quantized tensor's last dimension counted in blocks
/// (units of element_bytes), so kernels move blocks whole; recipes were inferred, so nothing
/// cuts one.
inline Shape unit_shape(const Shape& shape, DType t) { return storage_units(shape, t).shape; }

/// Awaits `c`, rethrowing its failure.
inline asio::awaitable<void> await(Completion c) { co_await c.async_wait(asio::use_awaitable); }

/// Awaits `c` and hands back its failure instead of throwing (for draining on error paths,
/// where a catch handler may not co_await).
inline asio::awaitable<std::exception_ptr> settle(Completion c) {
  try {
    co_await c.async_wait(asio::use_awaitable);
  } catch (...) {
    co_return std::current_exception();
  }
  co_return nullptr;
}

/// One warning per process: copies from pageable staging are correct but slower (the driver
/// stages them through its own pinned buffer, and the call blocks until it has).
inline void warn_pageable_once() {
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    log::warn(
        "CUDA backend: the staging memory is not page-locked (no pin_staging in the context): "
        "host-to-device copies go through the driver's bounce buffer");
}

/// What every step of one realization needs. The source is reached through io::ByteSource
/// alone: any source the concept admits can feed these steps.
template <io::ByteSource S>
struct Job {
  S& source;
  Executor& executor;
  DeviceMemoryPool& memory;
  const PinnedRegistration* staging;
  std::stop_token stop;
};

/// A temporary device buffer on the executor's stream, freed (stream-ordered) with its last handle.
template <io::ByteSource S>
Tensor temporary(const Job<S>& job, const InferredWeight& w, const std::string& name) {
  return Tensor::allocate(job.memory, w.dtype, w.shape, job.executor.shared_stream(), name);
}

/// Reads `request` in bounded chunk leases and copies each to `dst + lease offset` on the
/// device while the next is read. Each lease is retained by the completion of its own copy.
/// On failure, waits for the copies already queued before reporting, so that no lease is
/// held and no copy still writes when the realization completes.
template <io::ByteSource S>
asio::awaitable<void> upload(const Job<S>& job, const io::TensorReadRequest& whole, std::byte* dst) {
  io::TensorReadRequest request = whole;
  request.policy = io::ReadPolicy::chunked;
  auto stream = job.source.stream(request);
  Completion last = Completion::ready_now();
  for (;;) {
    std::exception_ptr failure;
    std::optional<io::Lease> lease;
    if (job.stop.stop_requested()) {
      failure = std::make_exception_ptr(engine::stopped_error(request.key));
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
asio::awaitable<void> run_kernel(Executor& executor, const char* what, const std::string& name, const Launch& launch) {
  Completion done =
      executor.enqueue([launch, what, name](cudaStream_t s) mutable { check(launch(s), what, name); }, name);
  co_await await(done);
}

class ConcatJoin;

/// The CUDA backend's recipe primitives (engine::RecipeOps): destinations are device
/// addresses, temporaries device tensors on the executor's stream, kernels queued on it.
template <io::ByteSource S>
struct RecipePrimitives {
  using Region = std::byte*;              ///< device memory of exactly the value's bytes
  using Temporary = Tensor;               ///< a device tensor, freed stream-ordered with its last handle
  using ConcatJoin = detail::ConcatJoin;  ///< copies each input into its rows as it comes

  static constexpr std::string_view name = "CUDA";
  static constexpr std::size_t max_permute_rank = cuda::max_permute_rank;  ///< the permute kernel's limit

  const Job<S>& job;  ///< the realization's source, stream, device memory and stop token

  const io::Catalog& catalog() const noexcept { return job.source.catalog(); }
  bool stop_requested() const noexcept { return job.stop.stop_requested(); }
  static bool supports_cast(DType from, DType to) noexcept { return convert_supported(from, to); }
  static Region subregion(Region r, std::size_t offset, std::size_t) noexcept { return r + offset; }
  static Region region(const Tensor& t) noexcept { return t.data(); }

  /// A device buffer on the executor's stream, named after the node in allocation errors.
  Tensor temporary(const InferredWeight& w, const std::string& what) const { return detail::temporary(job, w, what); }

  /// Bounded chunk leases uploaded straight from the (pinned) pool, each released by its copy.
  asio::awaitable<void> read_into(const io::TensorReadRequest& request, Region out) const {
    co_await upload(job, request, out);
  }

  /// Staged: the whole source lands in a device temporary first (one H2D stream of leases),
  /// then one conversion kernel writes `out`.
  asio::awaitable<void> cast_source(const io::TensorReadRequest& request, const InferredWeight& in, DType to,
                                    Region out, const std::string& what) const {
    Tensor tmp = temporary(in, what);
    co_await upload(job, request, tmp.data());
    co_await convert(std::move(tmp), in, to, out, what);
  }

  /// The conversion kernel over `in`; `in` is freed (stream-ordered) after it.
  asio::awaitable<void> convert(Tensor in, const InferredWeight& w, DType to, Region out,
                                const std::string& what) const {
    const std::uint64_t count = in.elements();
    auto launch = [in, out, count, from = w.dtype, to](cudaStream_t s) {
      return launch_convert(from, to, in.data(), out, count, s);
    };
    co_await run_kernel(job.executor, "conversion kernel launch", what, launch);
  }

  /// The row-copy kernel over indices `range` of dimension `dim` of `in`.
  asio::awaitable<void> copy_slice(Tensor in, const InferredWeight& w, std::size_t dim, Range range, Region out,
                                   const std::string& what) const {
    const std::size_t elem = element_bytes(w.dtype);
    const Shape shape = unit_shape(w.shape, w.dtype);
    const std::uint32_t per = dtype_block(w.dtype).elements;
    if (per > 1 && dim + 1 == shape.size()) range = {range.start / per, range.stop / per};
    std::size_t outer = 1, inner = elem;
    for (std::size_t d = 0; d < dim; ++d) outer *= shape[d];
    for (std::size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
    const std::size_t out_row = range.size() * inner, in_row = shape[dim] * inner;
    const std::size_t start = range.start * inner;
    auto launch = [in, out, outer, out_row, in_row, start](cudaStream_t s) {
      return launch_copy_rows(out, out_row, in.data() + start, in_row, outer, out_row, s);
    };
    co_await run_kernel(job.executor, "slice kernel launch", what, launch);
  }

  /// The permutation kernel (a gather, up to max_permute_rank dimensions).
  asio::awaitable<void> permute(Tensor in, const InferredWeight& w, std::span<const std::size_t> order, Region out,
                                const std::string& what) const {
    const Shape shape = unit_shape(w.shape, w.dtype);
    std::vector<std::size_t> dims(shape.begin(), shape.end());
    auto launch = [in, out, dims, order = std::vector(order.begin(), order.end()),
                   elem = element_bytes(w.dtype)](cudaStream_t s) {
      return launch_permute(in.data(), out, dims.data(), order.data(), dims.size(), elem, s);
    };
    co_await run_kernel(job.executor, "permute kernel launch", what, launch);
  }

  /// A join that copies each input into its rows as soon as it is evaluated, so at most one
  /// input's temporary is held at a time.
  ConcatJoin begin_concat(const InferredWeight& whole, std::size_t dim, Region out, const std::string& what) const;
};

/// Copies each input of a concat into its rows of the output with the row-copy kernel.
class ConcatJoin {
 public:
  /// A join into `out` (of shape `whole`) along `dim`, on `executor`'s stream; `what` names the concat.
  ConcatJoin(Executor& executor, const InferredWeight& whole, std::size_t dim, std::byte* out, const std::string& what)
      : executor_(executor), dim_(dim), out_(out), what_(what) {
    const Shape shape = unit_shape(whole.shape, whole.dtype);
    inner_ = element_bytes(whole.dtype);
    for (std::size_t d = dim + 1; d < shape.size(); ++d) inner_ *= shape[d];
    out_row_ = shape[dim] * inner_;
    for (std::size_t d = 0; d < dim; ++d) outer_ *= shape[d];
  }

  /// Copies `part` (shape `w`) into the next rows and waits for the kernel; `part` is then freed.
  asio::awaitable<void> add(Tensor part, const InferredWeight& w) {
    const std::size_t row = unit_shape(w.shape, w.dtype)[dim_] * inner_;
    auto launch = [part, out = out_ + offset_, out_row = out_row_, row, outer = outer_](cudaStream_t s) {
      return launch_copy_rows(out, out_row, part.data(), row, outer, row, s);
    };
    co_await run_kernel(executor_, "concat kernel launch", what_, launch);
    offset_ += row;
  }

  /// Nothing left: every input was copied when it was added.
  asio::awaitable<void> finish() { co_return; }

 private:
  Executor& executor_;
  std::size_t dim_;
  std::byte* out_;
  const std::string& what_;
  std::size_t inner_ = 0;
  std::size_t out_row_ = 0;
  std::size_t outer_ = 1;
  std::size_t offset_ = 0;
};

template <io::ByteSource S>
ConcatJoin RecipePrimitives<S>::begin_concat(const InferredWeight& whole, std::size_t dim, Region out,
                                             const std::string& what) const {
  return ConcatJoin(job.executor, whole, dim, out, what);
}

static_assert(engine::RecipeOps<RecipePrimitives<io::CheckpointSource>>);

/// The checkpoint dtype kept: upload the selected bytes into the tensor (device memory lands
/// by chunk stream: engine::plan_placement for a buffer that is not the host's).
template <io::ByteSource S>
asio::awaitable<void> read_direct(Job<S> job, std::unique_ptr<io::TensorReadRequest> request, Tensor tensor) {
  if (job.stop.stop_requested()) throw engine::stopped_error(request->key);
  co_await upload(job, *request, tensor.data());
}

/// The whole recipe into its output tensor.
template <io::ByteSource S>
asio::awaitable<void> run_recipe(Job<S> job, std::unique_ptr<DerivedWeightRecipe> recipe, Tensor out) {
  RecipePrimitives<S> ops{job};
  co_await engine::evaluate_recipe(ops, *recipe, out.data());
}

/// Backend::materialize over any byte source: device memory is planned a chunk stream
/// (engine::plan_placement), which upload() executes.
template <io::ByteSource S>
Materialization materialize_from(S& source, const io::TensorReadRequest& request, MaterializationContext& context,
                                 std::stop_token stop) {
  const io::TensorInfo& info = source.catalog().at(request.key);
  // Validates the selection before anything is allocated.
  const engine::OwnerBytes owner{.bytes = source.selected_bytes(request), .unit_alignment = 1};
  const engine::PlacementPlan plan = engine::plan_placement(source.capabilities(), Backend::buffer_traits, {}, owner);
  if (plan.landings().size() != 1 || plan.landings().front() != engine::Landing::chunk_stream)
    throw BackendError(errc::backend_failure, {.tensor = request.key},
                       "the CUDA backend lands device memory by chunk stream only");
  Shape shape = request.selection.is_all() ? info.shape : request.selection.selected_shape(info.shape);
  Tensor weight =
      Tensor::allocate(context.memory, info.dtype, std::move(shape), context.executor.shared_stream(), request.key);
  Job<S> job{source, context.executor, context.memory, context.staging, std::move(stop)};
  return Backend::start(source.get_executor(), weight,
                        read_direct(job, std::make_unique<io::TensorReadRequest>(request), weight));
}

/// Backend::materialize_recipe over any byte source.
template <io::ByteSource S>
Materialization materialize_recipe_from(S& source, const engine::DerivedWeightRecipe& recipe,
                                        MaterializationContext& context, std::stop_token stop) {
  engine::InferredWeight w = recipe.infer(source.catalog());
  Tensor weight =
      Tensor::allocate(context.memory, w.dtype, w.shape, context.executor.shared_stream(), recipe.to_string());
  Job<S> job{source, context.executor, context.memory, context.staging, std::move(stop)};
  return Backend::start(source.get_executor(), weight,
                        run_recipe(job, std::make_unique<DerivedWeightRecipe>(recipe), weight));
}

}  // namespace eredu::cuda::detail

namespace eredu::cuda {

template <io::ByteSource S>
Materialization Backend::materialize(S& source, const io::TensorReadRequest& request, MaterializationContext& context,
                                     std::stop_token stop) {
  return detail::materialize_from(source, request, context, std::move(stop));
}

template <io::ByteSource S>
Materialization Backend::materialize_recipe(S& source, const engine::DerivedWeightRecipe& recipe,
                                            MaterializationContext& context, std::stop_token stop) {
  return detail::materialize_recipe_from(source, recipe, context, std::move(stop));
}

}  // namespace eredu::cuda
