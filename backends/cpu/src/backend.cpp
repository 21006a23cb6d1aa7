#include "eredu/cpu/backend.hpp"

#include <fmt/format.h>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <vector>

#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"
#include "eredu/core/trace.hpp"
#include "eredu/cpu/convert.hpp"
#include "eredu/cpu/copy_bytes.hpp"
#include "eredu/io/integrity/digest.hpp"
#include "eredu/io/mapping/guarded_read.hpp"
#include "eredu/io/mapping/mapped_tensor.hpp"

namespace eredu::cpu {
// The steps that need no source, declared (and documented) in cpu/detail/materialize_steps.hpp.
namespace detail {

[[noreturn]] void throw_stopped(const std::string& what) { throw engine::stopped_error(what); }

asio::awaitable<void> await(Completion c) { co_await c.async_wait(asio::use_awaitable); }

asio::awaitable<std::exception_ptr> settle(Completion c) {
  try {
    co_await c.async_wait(asio::use_awaitable);
  } catch (...) {
    co_return std::current_exception();
  }
  co_return nullptr;
}

asio::awaitable<void> populate(Executor& executor, const Tensor& tensor) {
  if (!tensor.storage()->fresh()) co_return;
  Completion c = executor.submit([block = tensor.storage()] { StoragePool::populate(*block); });
  co_await c.async_wait(asio::use_awaitable);
}

/// Input bytes of a mapped conversion done between two stop checks, whose pages are then
/// unmapped: what the conversions running at once (one per arena thread) keep mapped.
constexpr std::size_t mapped_window_bytes = std::size_t{8} << 20;
/// Input bytes per guarded block of a mapped conversion (the unit of parallel work).
constexpr std::size_t mapped_block_bytes = std::size_t{128} << 10;

asio::awaitable<void> convert_mapped(Executor& executor, std::stop_token stop_token, io::MappedView view,
                                     const std::string& key, DType from, DType to, std::span<std::byte> out) {
  // A copy (from == to) moves bytes, whatever the element size (sub-byte dtypes included).
  const ConvertUnits units = convert_units(from, to);
  const std::size_t in_elem = units.in_bytes, out_elem = units.out_bytes;
  Completion c = executor.submit([view = std::move(view), key, from, to, out, in_elem, out_elem, stop = stop_token] {
    const std::span<const std::byte> in = view.bytes();
    const std::size_t window = mapped_window_bytes / in_elem * in_elem;
    const std::size_t block = mapped_block_bytes / in_elem * in_elem;
    for (std::size_t begin = 0; begin < in.size(); begin += window) {
      if (stop.stop_requested()) throw_stopped(key);
      const std::size_t end = std::min(in.size(), begin + window);
      const std::span<const std::byte> part = in.subspan(begin, end - begin);
      std::atomic<const std::byte*> fault{nullptr};
      // One call maps the window's pages, instead of a fault per few pages as they are read.
      view.populate(part);
      // Isolated: a thread waiting in this loop must not pick up another tensor's window,
      // which would map more than one window per thread.
      tbb::this_task_arena::isolate([&] {
        // Blocks by index, so each starts on an element whatever ranges TBB splits off.
        const std::size_t blocks = (end - begin + block - 1) / block;
        tbb::parallel_for(tbb::blocked_range<std::size_t>(0, blocks), [&](const tbb::blocked_range<std::size_t>& r) {
          trace::Span span(from == to ? "copy from mapping" : "convert from mapping", "cpu",
                           trace::enabled() ? fmt::format("{}: {} blocks", key, r.size()) : "");
          for (std::size_t b = r.begin(); b != r.end() && !fault.load(std::memory_order_relaxed); ++b) {
            const std::size_t at = begin + b * block, n = std::min(block, end - at);
            const std::span<const std::byte> src = in.subspan(at, n);
            const std::span<std::byte> dst = out.subspan(at / in_elem * out_elem, n / in_elem * out_elem);
            auto work = [&] { convert_serial(from, to, src, dst, ConvertStores::streaming); };
            if (auto f = io::guarded_read(view.region(), work)) fault.store(f->address, std::memory_order_relaxed);
          }
        });
      });
      if (const std::byte* at = fault.load(std::memory_order_relaxed)) throw view.fault_error({at});
      view.release_pages(part);
    }
    // A mapping reads the file as it is at each page: a rewrite in place meanwhile (cp -p)
    // faults nothing, and would mix two versions.
    view.check_unchanged();
  });
  co_await await(c);
}

/// Bytes of a mapped weight faulted in per task: the arena's threads fault in a large tensor
/// together, a small one is one task.
constexpr std::size_t map_populate_bytes = std::size_t{8} << 20;

asio::awaitable<void> map_weight(Executor& executor, std::stop_token stop, std::shared_ptr<io::MappedTensor> mapped,
                                 WeightStorage weights) {
  if (stop.stop_requested()) throw_stopped(mapped->tensor());
  Completion c = executor.submit([mapped, weights] {
    trace::Span span(weights == WeightStorage::mapped_locked ? "lock mapped weight" : "map weight", "cpu",
                     trace::enabled() ? mapped->tensor() : "");
    if (weights == WeightStorage::mapped_locked) {
      mapped->lock();
      return;
    }
    const std::span<const std::byte> bytes = mapped->bytes();
    const std::size_t parts = (bytes.size() + map_populate_bytes - 1) / map_populate_bytes;
    tbb::this_task_arena::isolate([&] {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, parts), [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t i = r.begin(); i != r.end(); ++i) {
          const std::size_t at = i * map_populate_bytes;
          mapped->populate(bytes.subspan(at, std::min(map_populate_bytes, bytes.size() - at)));
        }
      });
    });
  });
  co_await await(c);
}

static_assert(engine::RecipeOps<RecipePrimitives<io::CheckpointSource>>);

}  // namespace detail

template Materialization Backend::materialize(io::CheckpointSource&, const io::TensorReadRequest&,
                                              MaterializationContext&, std::stop_token);
template Materialization Backend::materialize_recipe(io::CheckpointSource&, const engine::DerivedWeightRecipe&,
                                                     MaterializationContext&, std::stop_token);

namespace {

/// Hashes `weight` and compares with `check`. A mapped weight is hashed inside guarded_read
/// (serially: a fault raised on another thread would not be caught), so a page its file can
/// no longer supply fails with the mapping's typed error instead of SIGBUS; the hasher lives
/// outside the guard, whose jump abandons only the update in progress.
void verify_bytes(const Tensor& weight, const io::DigestCheck& check) {
  const io::MappedTensor* mapped = weight ? weight.storage()->mapping() : nullptr;
  if (!mapped) return check.verify(weight.bytes());
  io::Hasher hasher(check.kind);
  auto update = [&] { hasher.update(weight.bytes()); };
  if (auto fault = io::guarded_read(mapped->region(), update)) throw mapped->fault_error(*fault);
  check.compare(hasher.hex_digest(), weight.nbytes());
}

/// copy_bytes from `weight`; a mapped weight in guarded 1 MiB blocks on the calling arena.
void copy_weight(const Tensor& weight, std::span<std::byte> out) {
  const io::MappedTensor* mapped = weight ? weight.storage()->mapping() : nullptr;
  if (!mapped) return copy_bytes(weight.bytes(), out);
  const std::span<const std::byte> in = weight.bytes();
  constexpr std::size_t block = std::size_t{1} << 20;
  std::atomic<const std::byte*> fault{nullptr};
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, (in.size() + block - 1) / block),
                    [&](const tbb::blocked_range<std::size_t>& r) {
                      for (std::size_t b = r.begin(); b != r.end() && !fault.load(std::memory_order_relaxed); ++b) {
                        const std::size_t at = b * block, n = std::min(block, in.size() - at);
                        // The byte-copy kernel (vector loads, streaming stores), as convert_mapped
                        // copies: no libc memcpy, which a sanitizer intercepts and a fault's jump
                        // would leave half-way through (ThreadSanitizer then dies).
                        auto copy = [&] {
                          convert_serial(DType::U8, DType::U8, in.subspan(at, n), out.subspan(at, n),
                                         ConvertStores::streaming);
                        };
                        if (auto f = io::guarded_read(mapped->region(), copy))
                          fault.store(f->address, std::memory_order_relaxed);
                      }
                    });
  if (const std::byte* at = fault.load(std::memory_order_relaxed)) throw mapped->fault_error({at});
}

}  // namespace

void Backend::validate_bind(const Parameter& parameter, const Tensor& weight) {
  engine::check_bind_fits(parameter.dtype, parameter.shape, weight.dtype(), weight.shape());
  if (const io::MappedTensor* mapped = weight ? weight.storage()->mapping() : nullptr) {
    // A rewritten file throws file_changed here; a replaced one leaves these bytes intact.
    if (mapped->check_file() == io::MappedFile::State::replaced && mapped->file().first_replacement_notice())
      log::warn(
          "{}: the path now names another file; weights mapped from it keep the bytes of the file that was "
          "opened (load again to serve the new one)",
          mapped->file().path());
  }
}

void Backend::reserve_storage(MaterializationContext& context, std::uint64_t bytes) noexcept {
  if (context.weights == WeightStorage::copied) context.storage.reserve(bytes);
}

Completion Backend::verify_weight(MaterializationContext& context, const Tensor& weight, io::DigestCheck check) {
  return context.executor.submit([weight, check = std::move(check)] { verify_bytes(weight, check); });
}

namespace {
/// Throws BackendError unless `slot` holds a tensor the host may write in place.
void check_writable(const Parameter& slot) {
  if (!slot.value)
    throw BackendError(errc::backend_failure, {}, "an in-place overwrite needs a parameter that is already bound");
  if (const io::MappedTensor* mapped = slot.value.storage()->mapping())
    throw BackendError(errc::backend_failure, {.file = mapped->file().path(), .tensor = mapped->tensor()},
                       "the bound tensor is mapped read-only from its checkpoint file: an in-place swap needs "
                       "weights loaded into copied storage");
}
}  // namespace

Completion Backend::overwrite(Executor& executor, Parameter& slot, const Tensor& weight) {
  check_writable(slot);
  if (slot.value.dtype() != weight.dtype() || slot.value.shape() != weight.shape() ||
      slot.value.nbytes() != weight.nbytes())
    throw BackendError(errc::bind_shape_mismatch, {},
                       fmt::format("the bound {} {} tensor cannot be overwritten in place by a {} {} weight",
                                   dtype_name(slot.value.dtype()), format_shape(slot.value.shape()),
                                   dtype_name(weight.dtype()), format_shape(weight.shape())));
  if (slot.value.shares_storage_with(weight)) return Completion::ready_now();
  return executor.submit([destination = slot.value, weight] { copy_weight(weight, destination.mutable_bytes()); });
}

std::span<std::byte> Backend::writable_bytes(Parameter& slot) {
  check_writable(slot);
  return slot.value.mutable_bytes();
}

std::pair<Tensor, Completion> Backend::promote(Executor& executor, const HostBuffer& host, StoragePool& storage) {
  Tensor t = Tensor::allocate(storage, host.dtype(), host.shape());
  Completion c = executor.submit([t, bytes = host.shared_bytes(), n = host.bytes().size()] {
    StoragePool::populate(*t.storage());
    std::span<const std::byte> src(bytes.get(), n);
    copy_bytes(src, t.mutable_bytes());
  });
  return {std::move(t), std::move(c)};
}

std::pair<Tensor, Completion> Backend::promote(Executor& executor, const HostBuffer& host) {
  return promote(executor, host, default_storage());
}

std::pair<HostBuffer, Completion> Backend::demote(Executor& executor, const Tensor& weight) {
  HostBuffer host(weight.dtype(), weight.shape(), weight.nbytes());
  Completion c = executor.submit([weight, bytes = host.shared_bytes(), n = weight.nbytes()] {
    copy_weight(weight, std::span<std::byte>(bytes.get(), n));
  });
  return {std::move(host), std::move(c)};
}

StoragePool& Backend::default_storage() {
  static StoragePool pool;
  return pool;
}

}  // namespace eredu::cpu
