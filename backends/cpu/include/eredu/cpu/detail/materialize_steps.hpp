#pragma once
/// \file
/// The CPU backend's realization steps over any io::ByteSource (Backend::materialize and
/// materialize_recipe are templates on the source): placement planned by the engine
/// (engine::plan_placement), then executed here. The steps that need no source (the arena's
/// kernels over mappings) are compiled once, in backend.cpp. Included by backend.hpp.

#include <array>
#include <asio/co_spawn.hpp>
#include <asio/use_awaitable.hpp>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "eredu/core/completion.hpp"
#include "eredu/core/detail/stop_cancellation.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/cpu/convert.hpp"
#include "eredu/cpu/layout.hpp"
#include "eredu/engine/description/recipe_evaluator.hpp"
#include "eredu/engine/orchestration/placement.hpp"
#include "eredu/io/reading/byte_source.hpp"

namespace eredu::cpu::detail {

using engine::DerivedWeightRecipe;
using engine::InferredWeight;

/// A tensor as layout kernels see it: its storage units (elements, or a quantized dtype's
/// blocks, whole: recipes that reach here were inferred, so nothing cuts a block and no
/// sub-byte dtype gets here) and their bytes.
inline StorageUnits units_of(const InferredWeight& w) { return storage_units(w.shape, w.dtype); }

/// `range` of dimension `dim` in units: a quantized tensor's last dimension counts blocks.
inline Range unit_range(const InferredWeight& w, std::size_t dim, Range range) {
  const std::uint32_t per = dtype_block(w.dtype).elements;
  if (per == 1 || dim + 1 != w.shape.size()) return range;
  return {range.start / per, range.stop / per};
}

/// Throws the error of a realization told to stop (engine::stopped_error).
[[noreturn]] void throw_stopped(const std::string& what);

/// Awaits `c`, rethrowing its failure.
asio::awaitable<void> await(Completion c);

/// Awaits `c` and hands back its failure instead of throwing (for draining on error paths,
/// where a catch handler may not co_await).
asio::awaitable<std::exception_ptr> settle(Completion c);

/// Faults a fresh tensor's pages in on every thread of the arena (no-op when recycled).
asio::awaitable<void> populate(Executor& executor, const Tensor& tensor);

/// Converts (or, for from == to, copies) `view` (the whole source, resident in the page
/// cache) into `out` in one pass, with no staging copy. The arena's threads read the mapping
/// in guarded blocks, so a file that shrinks or a page that fails to read in becomes a typed
/// error instead of a SIGBUS.
asio::awaitable<void> convert_mapped(Executor& executor, std::stop_token stop_token, io::MappedView view,
                                     const std::string& key, DType from, DType to, std::span<std::byte> out);

/// Faults a mapped weight's pages in (reading from the file what the page cache lacks) on the
/// arena, or pins them (mlock, which faults them in too), so the load's end means every byte
/// is in memory and any failure to read one is this load's typed error, not a later SIGBUS.
asio::awaitable<void> map_weight(Executor& executor, std::stop_token stop, std::shared_ptr<io::MappedTensor> mapped,
                                 WeightStorage weights);

/// What every step of one realization needs. The source is reached through io::ByteSource
/// alone: any source the concept admits can feed these steps.
template <io::ByteSource S>
struct Job {
  S& source;
  Executor& executor;
  StoragePool& storage;
  std::stop_token stop;
  engine::PlacementPolicy policy;  // the context's switches (policy_of)
};

/// The placement switches of `context`.
inline engine::PlacementPolicy policy_of(const MaterializationContext& context) {
  return {.map_weights = context.weights != WeightStorage::copied,
          .read_cold_windows = context.read_cold_windows,
          .copy_resident = context.copy_resident_on_executor};
}

/// What the placement planner knows of a tensor's bytes.
inline engine::OwnerBytes owner_of(std::uint64_t bytes, DType dtype, bool converted = false) {
  return {.bytes = bytes, .unit_alignment = engine::unit_alignment(dtype), .converted = converted};
}

/// The checkpoint dtype kept, into storage just allocated: the tensor gets the bytes in one
/// copy, by the source, or (when the plan allows it, the bytes are resident and the tensor's
/// storage is recycled) from a mapping of the page cache on the executor, with streaming
/// stores (engine::plan_storage_fill).
///
/// Fresh storage is left to the reader, unpopulated: the kernel faults each page in as it
/// copies into it. Into fresh memory that beat both a populate pass before the read and the
/// arena's copies from a mapping, on a page-cache-hot 2 GiB file, whether the memory had just
/// been freed by another process or handed back to the host seconds before
/// (docs/performance.md, 2026-12-02: first loads 0.40 s against 0.54 and 0.71 s, medians of 5).
template <io::ByteSource S>
asio::awaitable<void> read_direct(Job<S> job, std::unique_ptr<io::TensorReadRequest> request,
                                  engine::PlacementPlan plan, Tensor tensor) {
  if (job.stop.stop_requested()) throw_stopped(request->key);
  StorageBlock& storage = *tensor.storage();
  const bool fresh = storage.fresh();
  const engine::OwnerBytes owner = owner_of(tensor.nbytes(), tensor.dtype());
  engine::Placement fill = engine::place(job.source, *request, engine::plan_storage_fill(plan, fresh), owner);
  if (fill.landing == engine::Landing::copy_from_mapping) {
    co_await convert_mapped(job.executor, job.stop, std::move(*fill.resident), request->key, tensor.dtype(),
                            tensor.dtype(), tensor.mutable_bytes());
    co_return;
  }
  // A stop drops the read's queued requests (Reader::cancel) instead of waiting for them.
  eredu::detail::StopCancellation cancel(job.stop, job.source.get_executor());
  co_await job.source.async_read_into(*request, tensor.mutable_bytes(), cancel.use_awaitable());
  if (fresh) storage.mark_populated();  // every page was written: recycling the block saves its faults
}

/// A cold tensor at an unaligned file offset: its file's page-aligned window, read O_DIRECT
/// into storage laid out like the file, so the disk writes the tensor's final memory (no
/// page-cache pages to allocate, no copy out of them).
template <io::ByteSource S>
asio::awaitable<void> read_window(Job<S> job, std::unique_ptr<io::TensorReadRequest> request, io::DirectWindow window,
                                  Tensor tensor) {
  if (job.stop.stop_requested()) throw_stopped(request->key);
  StorageBlock& storage = *tensor.storage();
  eredu::detail::StopCancellation cancel(job.stop, job.source.get_executor());
  co_await job.source.async_read_window_into(*request, storage.allocation().first(window.bytes),
                                             cancel.use_awaitable());
  storage.mark_populated();  // the window is the whole allocation (allocate_window)
}

/// Reads `source` in bounded chunk leases and converts each into `out` on the arena while
/// the next is read; each lease is released by its conversion task once done. Chunk
/// boundaries need not fall on elements: a split element is carried over.
template <io::ByteSource S>
asio::awaitable<void> stream_convert(const Job<S>& job, const io::TensorReadRequest& source, DType from, DType to,
                                     std::span<std::byte> out) {
  io::TensorReadRequest request{source.key, source.selection, io::ReadPolicy::chunked};
  auto stream = job.source.stream(request);
  const ConvertUnits units = convert_units(from, to);
  const std::size_t in_elem = units.in_bytes, out_elem = units.out_bytes;
  // A unit split between two chunks (an element, or a quantized block) is carried over.
  std::array<std::byte, max_dtype_block_bytes> carry{};
  std::size_t carry_n = 0;
  std::uint64_t consumed = 0;  // input bytes converted so far
  Completion pending = Completion::ready_now();
  eredu::detail::StopCancellation cancel(job.stop, job.source.get_executor());
  for (;;) {
    std::exception_ptr failure;
    std::optional<io::Lease> lease;
    if (job.stop.stop_requested()) {
      failure = std::make_exception_ptr(engine::stopped_error(source.key));
    } else {
      try {
        lease = co_await stream.async_next(cancel.use_awaitable());
      } catch (...) {
        failure = std::current_exception();
      }
    }
    if (failure) {
      // The previous chunk's conversion still writes into `out`: let it finish first.
      co_await settle(pending);
      std::rethrow_exception(failure);
    }
    if (!lease) break;
    std::span<const std::byte> bytes = lease->bytes();
    if (carry_n) {
      std::size_t take = std::min(in_elem - carry_n, bytes.size());
      std::memcpy(carry.data() + carry_n, bytes.data(), take);
      carry_n += take;
      bytes = bytes.subspan(take);
      if (carry_n == in_elem) {
        convert_serial(from, to, std::span(carry).first(in_elem), out.subspan(consumed / in_elem * out_elem, out_elem));
        consumed += in_elem;
        carry_n = 0;
      }
    }
    const std::size_t whole = bytes.size() / in_elem * in_elem;
    std::span<const std::byte> src = bytes.first(whole);
    std::span<std::byte> dst = out.subspan(consumed / in_elem * out_elem, whole / in_elem * out_elem);
    consumed += whole;
    std::memcpy(carry.data(), bytes.data() + whole, bytes.size() - whole);
    carry_n = bytes.size() - whole;
    // One chunk converts while the next is read: at most two leases per tensor.
    co_await await(pending);
    pending = job.executor.submit([held = std::move(*lease), src, dst, from, to]() mutable {
      struct Release {
        io::Lease& l;
        ~Release() { l.release(); }
      } release{held};
      convert(from, to, src, dst);
    });
  }
  co_await await(pending);
}

class ConcatJoin;

/// The CPU backend's recipe primitives (engine::RecipeOps): destinations are host spans,
/// temporaries pooled tensors, and every kernel runs on the context's arena.
template <io::ByteSource S>
struct RecipePrimitives {
  using Region = std::span<std::byte>;    ///< host bytes
  using Temporary = Tensor;               ///< a pooled tensor
  using ConcatJoin = detail::ConcatJoin;  ///< keeps the inputs, joins them at the end

  static constexpr std::string_view name = "CPU";
  /// The layout kernels permute any rank.
  static constexpr std::size_t max_permute_rank = std::numeric_limits<std::size_t>::max();

  const Job<S>& job;  ///< the realization's source, arena, storage, stop token and policy

  const io::Catalog& catalog() const noexcept { return job.source.catalog(); }
  bool stop_requested() const noexcept { return job.stop.stop_requested(); }
  static bool supports_cast(DType from, DType to) noexcept { return convert_supported(from, to); }
  static Region subregion(Region r, std::size_t offset, std::size_t bytes) { return r.subspan(offset, bytes); }
  static Region region(const Tensor& t) noexcept { return t.mutable_bytes(); }

  /// A pooled tensor (not populated: the kernel or read that fills it faults its pages in).
  Tensor temporary(const InferredWeight& w, const std::string&) const {
    return Tensor::allocate(job.storage, w.dtype, w.shape);
  }

  /// The reader writes the selected bytes straight into `out`: one copy, no lease.
  asio::awaitable<void> read_into(const io::TensorReadRequest& request, Region out) const {
    eredu::detail::StopCancellation cancel(job.stop, job.source.get_executor());
    co_await job.source.async_read_into(request, out, cancel.use_awaitable());
  }

  /// As placed (engine::plan_placement for converted bytes): resident in the page cache,
  /// converted straight from a mapping, no lease; otherwise streamed in bounded chunk
  /// leases, at most two at a time.
  asio::awaitable<void> cast_source(const io::TensorReadRequest& request, const InferredWeight& in, DType to,
                                    Region out, const std::string&) const {
    const engine::OwnerBytes owner = owner_of(in.bytes, in.dtype, true);
    const engine::PlacementPlan plan =
        engine::plan_placement(job.source.capabilities(), Backend::buffer_traits, job.policy, owner);
    engine::Placement placed = engine::place(job.source, request, plan, owner);
    if (placed.landing == engine::Landing::copy_from_mapping) {
      co_await convert_mapped(job.executor, job.stop, std::move(*placed.resident), request.key, in.dtype, to, out);
    } else {
      co_await stream_convert(job, request, in.dtype, to, out);
    }
  }

  /// `in` converted on the arena (the parallel kernel, cache-sized blocks).
  asio::awaitable<void> convert(Tensor in, const InferredWeight& w, DType to, Region out, const std::string&) const {
    Completion c = job.executor.submit([in, out, from = w.dtype, to] { cpu::convert(from, to, in.bytes(), out); });
    co_await await(c);
  }

  /// Indices `range` of dimension `dim` of `in`, copied on the arena.
  asio::awaitable<void> copy_slice(Tensor in, const InferredWeight& w, std::size_t dim, Range range, Region out,
                                   const std::string&) const {
    Completion c = job.executor.submit([in, out, units = units_of(w), dim, range = unit_range(w, dim, range)] {
      cpu::copy_slice(in.bytes(), units.shape, units.unit_bytes, dim, range, out);
    });
    co_await await(c);
  }

  /// `in` with its dimensions reordered on the arena (a tiled transpose for the last two).
  asio::awaitable<void> permute(Tensor in, const InferredWeight& w, std::span<const std::size_t> order, Region out,
                                const std::string&) const {
    Completion c = job.executor.submit([in, out, units = units_of(w), order = std::vector(order.begin(), order.end())] {
      cpu::permute(in.bytes(), units.shape, units.unit_bytes, order, out);
    });
    co_await await(c);
  }

  /// A join that keeps the inputs and runs one concat kernel over all of them at the end.
  ConcatJoin begin_concat(const InferredWeight& whole, std::size_t dim, Region out, const std::string&) const;
};

/// Keeps every input of a concat, then joins them with one parallel kernel.
class ConcatJoin {
 public:
  /// A join into `out` along `dim` of `elem`-byte elements, on `executor`'s arena.
  ConcatJoin(Executor& executor, std::size_t dim, std::size_t elem, std::span<std::byte> out)
      : executor_(executor), dim_(dim), elem_(elem), out_(out) {}

  /// Keeps the next input until finish().
  asio::awaitable<void> add(Tensor part, const InferredWeight&) {
    parts_.push_back(std::move(part));
    co_return;
  }

  /// Joins every input kept, in order, with one parallel kernel.
  asio::awaitable<void> finish() {
    Completion c = executor_.submit([parts = parts_, out = out_, dim = dim_, elem = elem_] {
      std::vector<ConcatInput> inputs;
      for (const Tensor& p : parts) inputs.push_back({p.bytes(), storage_units(p.shape(), p.dtype()).shape});
      cpu::concat(inputs, dim, elem, out);
    });
    co_await await(c);
  }

 private:
  Executor& executor_;
  std::size_t dim_;
  std::size_t elem_;
  std::span<std::byte> out_;
  std::vector<Tensor> parts_;
};

template <io::ByteSource S>
ConcatJoin RecipePrimitives<S>::begin_concat(const InferredWeight& whole, std::size_t dim, Region out,
                                             const std::string&) const {
  return ConcatJoin(job.executor, dim, units_of(whole).unit_bytes, out);
}

/// The whole recipe into its (populated) output tensor.
template <io::ByteSource S>
asio::awaitable<void> run_recipe(Job<S> job, std::unique_ptr<DerivedWeightRecipe> recipe, Tensor out) {
  co_await populate(job.executor, out);
  RecipePrimitives<S> ops{job};
  co_await engine::evaluate_recipe(ops, *recipe, out.mutable_bytes());
}

/// Backend::materialize over any byte source: plans the tensor's placement, then executes
/// the landing the source can serve.
template <io::ByteSource S>
Materialization materialize_from(S& source, const io::TensorReadRequest& request, MaterializationContext& context,
                                 std::stop_token stop) {
  const io::TensorInfo& info = source.catalog().at(request.key);
  // Validates the selection before anything is allocated.
  const std::uint64_t bytes = source.selected_bytes(request);
  Shape shape = request.selection.is_all() ? info.shape : request.selection.selected_shape(info.shape);
  Job<S> job{source, context.executor, context.storage, std::move(stop), policy_of(context)};
  const engine::OwnerBytes owner = owner_of(bytes, info.dtype);
  engine::PlacementPlan plan = engine::plan_placement(source.capabilities(), Backend::buffer_traits, job.policy, owner);
  // Landings that need no storage of ours, or storage of a special shape, are settled now;
  // one that fills ordinary storage once it is allocated (read_direct).
  engine::Placement placed = engine::place(source, request, plan.without(engine::Landing::copy_from_mapping), owner);
  if (placed.landing == engine::Landing::mapped) {
    // The tensor's handle is read-only; this job's, which pins the pages, is not.
    auto shared = std::make_shared<io::MappedTensor>(std::move(*placed.mapping));
    // Before anyone sees the bytes: the remap swaps the pages under the same addresses.
    if (context.weights == WeightStorage::mapped_private) shared->make_private();
    Tensor weight(info.dtype, std::move(shape), std::make_shared<StorageBlock>(StorageBlock::adopt(shared)));
    return Backend::start(source.get_executor(), weight,
                          map_weight(job.executor, job.stop, std::move(shared), context.weights));
  }
  if (placed.landing == engine::Landing::direct_window) {
    const io::DirectWindow window = placed.window;
    Tensor weight(info.dtype, std::move(shape),
                  std::make_shared<StorageBlock>(context.storage.allocate_window(window.bytes, window.lead, bytes)));
    return Backend::start(source.get_executor(), weight,
                          read_window(job, std::make_unique<io::TensorReadRequest>(request), window, weight));
  }
  Tensor weight = Tensor::allocate(context.storage, info.dtype, std::move(shape));
  return Backend::start(source.get_executor(), weight,
                        read_direct(job, std::make_unique<io::TensorReadRequest>(request), std::move(plan), weight));
}

/// Backend::materialize_recipe over any byte source.
template <io::ByteSource S>
Materialization materialize_recipe_from(S& source, const engine::DerivedWeightRecipe& recipe,
                                        MaterializationContext& context, std::stop_token stop) {
  engine::InferredWeight w = recipe.infer(source.catalog());
  Tensor weight = Tensor::allocate(context.storage, w.dtype, w.shape);
  Job<S> job{source, context.executor, context.storage, std::move(stop), policy_of(context)};
  return Backend::start(source.get_executor(), weight,
                        run_recipe(job, std::make_unique<DerivedWeightRecipe>(recipe), weight));
}

}  // namespace eredu::cpu::detail

namespace eredu::cpu {

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

}  // namespace eredu::cpu
