#pragma once
// A second, tiny model of io::ByteSource: tensors held in one std::vector of bytes in memory,
// read with memcpy. It declares no optional capability (no pages to map, no direct windows),
// so its optional members answer std::nullopt or fail; it proves the concept is not shaped
// to the local-file CheckpointSource, and lets tests feed generic engine and backend code
// from something that is not a file. It also models io::DeltaSource, where a test declares
// which ranges of a tensor changed (declare_changed), so that tests can feed the engine a
// delta, and one whose sender lies.

#include <algorithm>
#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/use_awaitable.hpp>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "eredu/core/detail/spawn_operation.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/selection.hpp"
#include "eredu/io/reading/byte_source.hpp"
#include "eredu/io/reading/delta_source.hpp"
#include "eredu/io/reading/lease_pool.hpp"
#include "eredu/io/reading/range_chunks.hpp"

namespace eredu::test {

class VectorSource;

/// VectorSource::stream and stream_ranges: chunk leases of at most `chunk` bytes, in the
/// order of their ranges.
class VectorChunks {
 public:
  /// Chunks of `ranges` of the selected bytes `runs` of `tensor`, `total` bytes in all.
  VectorChunks(VectorSource* source, const io::TensorInfo* tensor, std::vector<ByteRun> runs, std::uint64_t total,
               std::size_t chunk, std::vector<io::SelectionRange> ranges)
      : source_(source), tensor_(tensor), runs_(std::move(runs)), total_(total), chunks_(std::move(ranges), chunk) {}
  /// Bytes selected in all.
  std::uint64_t total() const noexcept { return total_; }
  /// Bytes not yet handed out.
  std::uint64_t remaining() const noexcept { return chunks_.remaining(); }
  /// The next chunk lease, or an empty optional after the last.
  template <asio::completion_token_for<void(std::exception_ptr, std::optional<io::Lease>)> Token>
  auto async_next(Token&& token);

 private:
  VectorSource* source_;
  const io::TensorInfo* tensor_;
  std::vector<ByteRun> runs_;
  std::uint64_t total_;
  io::RangeChunks chunks_;
};

/// Tensors in memory (see file comment). Not movable: leases and streams point into it.
class VectorSource {
 public:
  /// An empty source whose leases come from a pool of `budget` bytes; chunks of `chunk` bytes.
  VectorSource(asio::any_io_executor executor, std::size_t budget, std::size_t chunk)
      : executor_(std::move(executor)),
        pool_(executor_, io::LeasePoolOptions{.budget = budget, .huge_pages = false, .prefault = false}),
        chunk_(chunk) {
    catalog_.add_file(io::CheckpointFile{.path = "memory", .format = "vector"});
  }
  VectorSource(const VectorSource&) = delete;
  VectorSource& operator=(const VectorSource&) = delete;

  /// Adds a tensor with its stored bytes (before any read).
  void add(std::string name, DType dtype, Shape shape, std::span<const std::byte> stored) {
    io::TensorInfo t{.name = std::move(name),
                     .dtype = dtype,
                     .shape = std::move(shape),
                     .file = 0,
                     .offset = bytes_.size(),
                     .nbytes = stored.size()};
    bytes_.insert(bytes_.end(), stored.begin(), stored.end());
    catalog_.add_tensor(std::move(t));
  }

  /// Executor completions run on.
  const asio::any_io_executor& get_executor() const noexcept { return executor_; }
  /// The tensors added.
  const io::Catalog& catalog() const noexcept { return catalog_; }
  /// Reads only: nothing to map, no direct windows; requests of one chunk, one at a time.
  io::SourceCapabilities capabilities() const { return {.request_bytes = chunk_, .concurrency = 1}; }
  /// Reads served so far (each read, lease or chunk counts one).
  std::size_t reads() const noexcept { return reads_; }
  /// Makes every read after the next `served` ones fail with io_error (a store that breaks
  /// mid-load); std::nullopt serves every read again.
  void fail_after(std::optional<std::size_t> served) {
    fail_at_ = served ? std::optional(reads_ + *served) : std::nullopt;
  }
  /// The pool its leases come from.
  const io::LeasePool& pool() const noexcept { return pool_; }
  /// The pool its leases come from, to page-lock (cuda::pin_staging).
  io::LeasePool& pool() noexcept { return pool_; }

  /// Selected bytes; throws tensor_not_found / invalid_selection.
  std::uint64_t selected_bytes(const io::TensorReadRequest& request) const {
    std::uint64_t total = 0;
    for (const ByteRun& r : runs_of(request).second) total += r.length;
    return total;
  }

  /// The selection into one lease.
  template <asio::completion_token_for<void(std::exception_ptr, io::Lease)> Token>
  auto async_read(const io::TensorReadRequest& request, Token&& token) {
    return eredu::detail::spawn_operation(executor_, read_lease(request), std::forward<Token>(token));
  }
  /// The selection into `destination`, which must be its size.
  template <asio::completion_token_for<void(std::exception_ptr)> Token>
  auto async_read_into(const io::TensorReadRequest& request, std::span<std::byte> destination, Token&& token) {
    return eredu::detail::spawn_operation(executor_, read_into(request, destination), std::forward<Token>(token));
  }
  /// The selection as chunk leases.
  VectorChunks stream(const io::TensorReadRequest& request) {
    auto [tensor, runs] = runs_of(request);
    std::uint64_t total = 0;
    for (const ByteRun& r : runs) total += r.length;
    return VectorChunks(this, tensor, std::move(runs), total, chunk_, {{.offset = 0, .length = total}});
  }

  /// Declares that tensor `key`'s bytes differ from the reader's base only in `ranges` of its
  /// whole selection, as a delta's sender would (a test may make them wrong: they are served as
  /// given, unchecked).
  void declare_changed(const std::string& key, std::vector<io::SelectionRange> ranges) {
    changed_[key] = std::move(ranges);
  }
  /// The ranges declare_changed gave for the tensor's whole selection; std::nullopt for
  /// another selection or an undeclared tensor.
  std::optional<std::vector<io::SelectionRange>> changed_ranges(const io::TensorReadRequest& request) const {
    selected_bytes(request);
    const auto it = changed_.find(request.key);
    if (it == changed_.end() || !request.selection.is_all()) return std::nullopt;
    return it->second;
  }
  /// Only `ranges` of the selection, in their order, unchecked (a test's source may misbehave).
  VectorChunks stream_ranges(const io::TensorReadRequest& request, std::vector<io::SelectionRange> ranges) {
    auto [tensor, runs] = runs_of(request);
    std::uint64_t total = 0;
    for (const ByteRun& r : runs) total += r.length;
    return VectorChunks(this, tensor, std::move(runs), total, chunk_, std::move(ranges));
  }
  /// Bytes its reads delivered so far.
  std::uint64_t delivered() const noexcept { return delivered_; }

  /// No pages to map.
  std::optional<io::MappedTensor> map_tensor(const io::TensorReadRequest& request) const {
    selected_bytes(request);
    return std::nullopt;
  }
  /// No pages to map.
  std::optional<io::MappedView> map_resident(const io::TensorReadRequest& request) const {
    selected_bytes(request);
    return std::nullopt;
  }
  /// No direct windows.
  std::optional<io::DirectWindow> direct_window(const io::TensorReadRequest& request) const {
    selected_bytes(request);
    return std::nullopt;
  }
  /// Fails: there is no window to read.
  template <asio::completion_token_for<void(std::exception_ptr)> Token>
  auto async_read_window_into(const io::TensorReadRequest& request, std::span<std::byte>, Token&& token) {
    return eredu::detail::spawn_operation(executor_, no_window(request.key), std::forward<Token>(token));
  }

 private:
  friend class VectorChunks;

  std::pair<const io::TensorInfo*, std::vector<ByteRun>> runs_of(const io::TensorReadRequest& request) const {
    const io::TensorInfo& t = catalog_.at(request.key);
    if (auto why = request.selection.check(t.shape); !why.empty())
      throw Error(errc::invalid_selection, {.file = "memory", .tensor = t.name}, why);
    return {&t, selection_runs(t.shape, t.dtype, request.selection)};
  }

  /// Copies bytes [from, from + out.size()) of the selection `runs` of `t` into `out`.
  void copy(const io::TensorInfo& t, const std::vector<ByteRun>& runs, std::uint64_t from,
            std::span<std::byte> out) const {
    for (const ByteRun& r : runs) {
      const std::uint64_t lo = std::max(from, r.dest_offset);
      const std::uint64_t hi = std::min(from + out.size(), r.dest_offset + r.length);
      if (lo >= hi) continue;
      std::memcpy(out.data() + (lo - from), bytes_.data() + t.offset + r.source_offset + (lo - r.dest_offset), hi - lo);
    }
  }

  asio::awaitable<io::Lease> lease_of(const io::TensorInfo& t, const std::vector<ByteRun>& runs, std::uint64_t from,
                                      std::size_t size, std::uint64_t total) {
    if (io::LeasePool::block_size(size) > pool_.budget())
      throw Error(errc::exceeds_budget, {.file = "memory", .tensor = t.name}, "larger than the pool: stream it");
    io::StagingBuffer buffer = co_await pool_.async_acquire(size, asio::use_awaitable);
    check_failure(t);
    copy(t, runs, from, std::span(buffer.data(), size));
    ++reads_;
    delivered_ += size;
    co_return io::Lease(std::move(buffer), 0, size, &t, from, total);
  }

  asio::awaitable<io::Lease> read_lease(io::TensorReadRequest request) {
    auto [t, runs] = runs_of(request);
    std::uint64_t total = 0;
    for (const ByteRun& r : runs) total += r.length;
    co_return co_await lease_of(*t, runs, 0, total, total);
  }

  asio::awaitable<void> read_into(io::TensorReadRequest request, std::span<std::byte> destination) {
    auto [t, runs] = runs_of(request);
    if (destination.size() != selected_bytes(request))
      throw Error(errc::invalid_argument, {.file = "memory", .tensor = t->name}, "destination is not the selection");
    check_failure(*t);
    copy(*t, runs, 0, destination);
    ++reads_;
    delivered_ += destination.size();
    co_return;
  }

  /// Throws the injected failure (fail_after) for a read of `t`.
  void check_failure(const io::TensorInfo& t) const {
    if (fail_at_ && reads_ >= *fail_at_)
      throw Error(errc::io_error, {.file = "memory", .tensor = t.name}, "injected read failure");
  }

  static asio::awaitable<void> no_window(std::string key) {
    throw Error(errc::invalid_argument, {.file = "memory", .tensor = key}, "an in-memory source has no direct windows");
    co_return;
  }

  asio::any_io_executor executor_;
  io::Catalog catalog_;
  std::vector<std::byte> bytes_;
  io::LeasePool pool_;
  std::size_t chunk_;
  std::size_t reads_ = 0;
  std::uint64_t delivered_ = 0;
  std::optional<std::size_t> fail_at_{};                            // reads from this count on fail (fail_after)
  std::map<std::string, std::vector<io::SelectionRange>> changed_;  // declare_changed
};

template <asio::completion_token_for<void(std::exception_ptr, std::optional<io::Lease>)> Token>
auto VectorChunks::async_next(Token&& token) {
  auto next = [](VectorChunks* self) -> asio::awaitable<std::optional<io::Lease>> {
    const std::optional<io::SelectionRange> chunk = self->chunks_.next();
    if (!chunk) co_return std::nullopt;
    co_return co_await self->source_->lease_of(*self->tensor_, self->runs_, chunk->offset,
                                               static_cast<std::size_t>(chunk->length), self->total_);
  };
  return eredu::detail::spawn_operation(source_->executor_, next(this), std::forward<Token>(token));
}

static_assert(io::DeltaSource<VectorSource>);

}  // namespace eredu::test
