#pragma once
/// \file
/// eredu::mpi::Subscriber and eredu::mpi::PublishedSource: the inference side of live updates.
/// A Subscriber joins the group of a Publisher (publisher.hpp); async_open gives one published
/// version as a PublishedSource — an io::ByteSource, so every slot swaps to it exactly as to a
/// checkpoint, and each rank's sharding plan selects only its bytes, which it reads from the
/// publisher's memory with MPI_Rget (one read per part, the strided rows of a column shard in
/// one indexed datatype).
///
/// \code
///   mpi::Subscriber subscriber(live, /*publisher=*/0, ctx.get_executor());  // collective with the Publisher
///   std::unique_ptr<mpi::PublishedSource> v = co_await subscriber.async_open("", asio::use_awaitable);  // newest
///   engine::TensorParallelPlan plan = engine::plan_tensor_parallel(v->catalog(), rules, tp.rank(), tp.size());
///   engine::SwapOptions<Model> options{.checksums = co_await v->async_checksums(plan.bindings, asio::use_awaitable)};
///   options.canary = [&](const Model& m) -> asio::awaitable<void> {
///     co_await v->async_confirm(asio::use_awaitable);  // still offered: not withdrawn meanwhile
///     check(m);
///   };
///   co_await slot.async_swap(*v, plan.bindings, background, std::move(options), asio::use_awaitable);
///   v->finish(true);  // tells the publisher this rank has its bytes
/// \endcode
///
/// Verification: async_checksums asks the publisher for the digests (xxh3_128_blocks) of
/// exactly the selections `plan` reads, hashed from the publisher's memory; the swap then
/// checks each tensor where it lands, so a block corrupted in flight (or read after the trainer
/// reused the memory) is checksum_mismatch, never a served model. A tensor read whole is also
/// checked against the digest the publisher computed when it published.
///
/// Failures name the location `mpi://<group>/rank<P>/<version>` and the tensor:
/// version_not_published (no such version), version_withdrawn (withdrawn before this rank was
/// done), CollectiveError(collective_error) for a transfer that failed or did not complete
/// within SubscriberOptions::timeout (a publisher that died or stalls; the group is then
/// unusable, so later opens fail at once), and the swap's own (checksum_mismatch, ...).
/// Every wait is bounded by the timeout: nothing hangs on a dead publisher.

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "eredu/core/detail/spawn_operation.hpp"
#include "eredu/engine/description/weight_binding_plan.hpp"
#include "eredu/io/integrity/checksums.hpp"
#include "eredu/io/reading/byte_source.hpp"
#include "eredu/io/reading/delta_source.hpp"
#include "eredu/io/reading/lease_pool.hpp"
#include "eredu/io/reading/range_chunks.hpp"
#include "eredu/mpi/communicator.hpp"
#include "eredu/mpi/live_transport.hpp"

namespace eredu::mpi {

namespace detail {
struct SubscriberState;
struct Manifest;
}  // namespace detail

/// Settings of a subscriber.
struct SubscriberOptions {
  /// The longest any request or read waits for the publisher.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  /// Staging memory, rounded up to pages, shared by every version the subscriber opens: a
  /// quarter holds two-sided replies (each part is received there, then copied to its
  /// destination); the rest holds lease and stream reads and encoded deltas. Reads into
  /// tensor storage under one_sided use none.
  std::size_t budget = std::size_t{256} << 20;
  /// Bytes one read (an MPI_Rget, or a request's reply) moves at most: at most a quarter of
  /// `budget`, so that a reply fits its share.
  std::size_t part_size = std::size_t{16} << 20;
  /// How it reads: the publisher's choice (PublisherOptions::transport).
  LiveTransport transport = LiveTransport::two_sided;
};

class PublishedSource;

/// Where a delta's unchanged bytes come from (PublishedSource::use_base): copies bytes
/// [from, from + out.size()) of `request`'s selection, as the base version holds them, into
/// `out`; false when it does not hold that selection (it is then read whole).
using BaseBytes =
    std::function<bool(const io::TensorReadRequest& request, std::uint64_t from, std::span<std::byte> out)>;

/// BaseBytes from a serving version's parameters: each plain binding of `plan` holds exactly
/// the bytes of its (tensor, selection), which `parameter` gives by parameter name (an empty
/// span: not held). Selections no plain binding reads (a recipe's inputs) are read whole.
/// What `parameter` returns must stay valid and unchanged while the source reads: keep the
/// serving version (ModelSlot::current()) alive.
BaseBytes base_from_parameters(const engine::WeightBindingPlan& plan,
                               std::function<std::span<const std::byte>(const std::string& parameter)> parameter);

/// PublishedSource::stream and stream_ranges: the selection, or ranges of it, as chunk leases,
/// each read from the publisher.
class PublishedChunks {
 public:
  /// Chunks of at most `chunk` bytes of `ranges` (ascending, disjoint) of `tensor`'s selected
  /// `runs`, `total` bytes in all.
  PublishedChunks(PublishedSource* source, io::TensorReadRequest request, const io::TensorInfo* tensor,
                  std::vector<ByteRun> runs, std::uint64_t total, std::size_t chunk,
                  std::vector<io::SelectionRange> ranges)
      : source_(source),
        request_(std::move(request)),
        tensor_(tensor),
        runs_(std::move(runs)),
        total_(total),
        chunks_(std::move(ranges), chunk) {}
  /// Bytes selected in all.
  std::uint64_t total() const noexcept { return total_; }
  /// Bytes not yet handed out.
  std::uint64_t remaining() const noexcept { return chunks_.remaining(); }
  /// The next chunk lease, or an empty optional after the last.
  template <asio::completion_token_for<void(std::exception_ptr, std::optional<io::Lease>)> Token>
  auto async_next(Token&& token);

 private:
  asio::awaitable<std::optional<io::Lease>> next();
  PublishedSource* source_;
  io::TensorReadRequest request_;
  const io::TensorInfo* tensor_;
  std::vector<ByteRun> runs_;
  std::uint64_t total_;
  io::RangeChunks chunks_;
};

/// One published version as a byte source (see file comment). Not movable: leases and streams
/// point into it. Destroying it without finish() tells the publisher this rank gave up.
class PublishedSource {
 public:
  /// Made by Subscriber::async_open.
  PublishedSource(std::shared_ptr<detail::SubscriberState> subscriber, detail::Manifest manifest);
  ~PublishedSource();
  PublishedSource(const PublishedSource&) = delete;
  PublishedSource& operator=(const PublishedSource&) = delete;

  /// The version's tag.
  const std::string& version() const noexcept;
  /// The tag of the version it was published against (empty: none).
  const std::string& base() const noexcept;
  /// Where that base version comes from, as location() names this one (empty: no base).
  std::string base_location() const;
  /// Where it comes from, as errors name it: mpi://<group>/rank<P>/<version>.
  const std::string& location() const noexcept { return location_; }

  /// Executor completions run on.
  const asio::any_io_executor& get_executor() const noexcept;
  /// The version's tensors (names, dtypes, shapes).
  const io::Catalog& catalog() const noexcept { return catalog_; }
  /// Reads only: nothing to map, no direct windows; parts of SubscriberOptions::part_size.
  io::SourceCapabilities capabilities() const;
  /// Selected bytes; throws tensor_not_found / invalid_selection.
  std::uint64_t selected_bytes(const io::TensorReadRequest& request) const;

  /// The selection into one lease.
  template <asio::completion_token_for<void(std::exception_ptr, io::Lease)> Token>
  auto async_read(const io::TensorReadRequest& request, Token&& token) {
    return eredu::detail::spawn_operation(get_executor(), read_lease(request), std::forward<Token>(token));
  }
  /// The selection into `destination`, which must be its size.
  template <asio::completion_token_for<void(std::exception_ptr)> Token>
  auto async_read_into(const io::TensorReadRequest& request, std::span<std::byte> destination, Token&& token) {
    return eredu::detail::spawn_operation(get_executor(), read_into(request, destination), std::forward<Token>(token));
  }
  /// The selection as chunk leases.
  PublishedChunks stream(const io::TensorReadRequest& request);
  /// Where the selection can differ from the base use_base declared (io::DeltaSource): the
  /// changed blocks of a tensor sent as blocks or as changed values, clipped to the selection;
  /// std::nullopt when no base is declared, or for a tensor sent whole or as an XOR.
  std::optional<std::vector<io::SelectionRange>> changed_ranges(const io::TensorReadRequest& request) const;
  /// Only `ranges` of the selection (ascending, disjoint, inside it) as chunk leases, read as
  /// stream() reads them. Throws invalid_argument for ranges that are not.
  PublishedChunks stream_ranges(const io::TensorReadRequest& request, std::vector<io::SelectionRange> ranges);

  /// No pages to map.
  std::optional<io::MappedTensor> map_tensor(const io::TensorReadRequest& request) const;
  /// No pages to map.
  std::optional<io::MappedView> map_resident(const io::TensorReadRequest& request) const;
  /// No direct windows.
  std::optional<io::DirectWindow> direct_window(const io::TensorReadRequest& request) const;
  /// Fails with invalid_argument: there is no window to read.
  template <asio::completion_token_for<void(std::exception_ptr)> Token>
  auto async_read_window_into(const io::TensorReadRequest& request, std::span<std::byte>, Token&& token) {
    return eredu::detail::spawn_operation(get_executor(), no_window(request.key), std::forward<Token>(token));
  }

  /// The publisher's digests of exactly the selections `plan` reads (tensors read whole carry
  /// the digest computed at publication too), for SwapOptions::checksums.
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr, io::Checksums)`. Errors: tensor_not_found for a binding naming
  /// no tensor of the version, version_withdrawn, and the transfer's (see file comment).
  template <asio::completion_token_for<void(std::exception_ptr, io::Checksums)> Token>
  auto async_checksums(const engine::WeightBindingPlan& plan, Token&& token) {
    return eredu::detail::spawn_operation(get_executor(), checksums(plan), std::forward<Token>(token));
  }
  /// Succeeds while the publisher still offers the version; version_withdrawn once withdrawn
  /// (call it in the canary: a version withdrawn during the load is then never published).
  template <asio::completion_token_for<void(std::exception_ptr)> Token>
  auto async_confirm(Token&& token) {
    return eredu::detail::spawn_operation(get_executor(), confirm(), std::forward<Token>(token));
  }
  /// Tells the publisher this rank is done reading (`ok`: with success). Once; never throws.
  void finish(bool ok) noexcept;

  /// Declares that this rank holds version `base`, whose bytes `bytes` gives. When this
  /// version is a delta against it, each read copies the base's bytes of its selection and
  /// reads from the publisher only the blocks that changed: the result is still verified
  /// against the full version's digests, so a wrong base is checksum_mismatch, never a served
  /// model. Returns true when this version is a delta against `base` with at least one tensor
  /// sent as changed blocks (otherwise every read is whole). Call it before reading.
  bool use_base(const std::string& base, BaseBytes bytes);
  /// Most staging bytes the subscriber held, for every version it opened, counted as its lease
  /// pool's high water plus its reply buffers' (two maxima, perhaps at different times): at
  /// most SubscriberOptions::budget (rounded up to pages).
  std::size_t staging_high_water() const;
  /// Bytes read from the publisher so far: whole selections, or a delta's changed blocks.
  std::uint64_t transferred_bytes() const noexcept { return transferred_.load(); }

  /// Test hook: flips bit 0 of byte `byte` of the next read's bytes after they arrive, as a
  /// transfer fault would (the swap's digest check must then refuse the version).
  void corrupt_next_read(std::uint64_t byte) noexcept { corrupt_at_ = byte; }

 private:
  friend class PublishedChunks;
  /// The index of `t`, one of catalog()'s tensors, in the catalog and the manifest.
  std::size_t index_of(const io::TensorInfo& t) const noexcept {
    return static_cast<std::size_t>(&t - catalog_.tensors().data());
  }
  std::pair<const io::TensorInfo*, std::vector<ByteRun>> runs_of(const io::TensorReadRequest& request) const;
  /// Chunk leases of `ranges` of `t`'s selected `runs` (`total` bytes), checked by the caller.
  PublishedChunks chunks_of(const io::TensorReadRequest& request, const io::TensorInfo* t, std::vector<ByteRun> runs,
                            std::uint64_t total, std::vector<io::SelectionRange> ranges);
  /// Reads [from, from + out.size()) of the selection `runs` into `out`. `staging`: memory
  /// reserved with the caller's lease for a delta's encoding (delta_staging), so nothing more
  /// is taken from the pool (std::nullopt: the caller holds none of the pool, take it there).
  asio::awaitable<void> fetch(const io::TensorReadRequest& request, const io::TensorInfo& t,
                              const std::vector<ByteRun>& runs, std::uint64_t from, std::span<std::byte> out,
                              std::optional<std::span<std::byte>> staging = std::nullopt);
  asio::awaitable<void> read_runs(const io::TensorInfo& t, std::uint64_t address, std::vector<ByteRun> runs,
                                  std::span<std::byte> out);
  asio::awaitable<void> request_runs(const io::TensorInfo& t, std::uint64_t address, std::vector<ByteRun> runs,
                                     std::span<std::byte> out, std::uint64_t size);
  /// The entries of a sparse delta's blocks that `wanted` touches ([first, last), ascending and
  /// disjoint); sorts `wanted` by source offset.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> sparse_slots(const io::TensorInfo& t,
                                                                    std::vector<ByteRun>& wanted) const;
  /// Bytes a delta read of `wanted` stages besides its destination (0: none).
  std::uint64_t delta_staging(const io::TensorInfo& t, std::vector<ByteRun> wanted) const;
  asio::awaitable<bool> apply_sparse(const io::TensorInfo& t, std::vector<ByteRun> wanted, std::span<std::byte> out,
                                     std::optional<std::span<std::byte>> staging);
  asio::awaitable<bool> apply_xor(const io::TensorInfo& t, std::vector<ByteRun> wanted, std::span<std::byte> out,
                                  std::optional<std::span<std::byte>> staging);
  asio::awaitable<io::Lease> lease_of(const io::TensorReadRequest& request, const io::TensorInfo& t,
                                      const std::vector<ByteRun>& runs, std::uint64_t from, std::size_t size,
                                      std::uint64_t total);
  asio::awaitable<io::Lease> read_lease(io::TensorReadRequest request);
  asio::awaitable<void> read_into(io::TensorReadRequest request, std::span<std::byte> destination);
  asio::awaitable<io::Checksums> checksums(engine::WeightBindingPlan plan);
  asio::awaitable<void> confirm();
  asio::awaitable<void> no_window(std::string key);

  std::shared_ptr<detail::SubscriberState> subscriber_;
  std::unique_ptr<detail::Manifest> manifest_;
  std::string location_;
  io::Catalog catalog_;
  io::LeasePool& pool_;  // the subscriber's, shared by the versions it opens
  bool finished_ = false;
  std::optional<std::uint64_t> corrupt_at_{};
  BaseBytes base_bytes_{};  // set when this version is a delta against the base this rank holds
  std::atomic<std::uint64_t> transferred_{0};
};

template <asio::completion_token_for<void(std::exception_ptr, std::optional<io::Lease>)> Token>
auto PublishedChunks::async_next(Token&& token) {
  return eredu::detail::spawn_operation(source_->get_executor(), next(), std::forward<Token>(token));
}

static_assert(io::DeltaSource<PublishedSource>);

/// The inference side of a live-update group (see file comment).
class Subscriber {
 public:
  /// Joins `group` as a subscriber of the publisher at rank `publisher`: makes the window with
  /// the Publisher and every other Subscriber (collective and blocking, within the group's
  /// timeout). Completions run on `executor`. `group` must outlive the subscriber and every
  /// source it opens. Throws CollectiveError, Error(invalid_argument) for a publisher rank
  /// outside the group or this rank's own.
  Subscriber(Communicator& group, int publisher, asio::any_io_executor executor, SubscriberOptions options = {});
  /// Frees the window with the publisher and the other subscribers (collective).
  ~Subscriber();
  Subscriber(const Subscriber&) = delete;
  Subscriber& operator=(const Subscriber&) = delete;

  /// Opens `version` (empty: the newest the publisher offers).
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr, std::unique_ptr<PublishedSource>)`. Errors: version_not_published,
  /// version_withdrawn, and the transfer's (see file comment).
  template <asio::completion_token_for<void(std::exception_ptr, std::unique_ptr<PublishedSource>)> Token>
  auto async_open(std::string version, Token&& token) {
    return eredu::detail::spawn_operation(executor(), open(std::move(version)), std::forward<Token>(token));
  }

  /// The publisher's rank in the group.
  int publisher() const noexcept;

 private:
  const asio::any_io_executor& executor() const noexcept;
  asio::awaitable<std::unique_ptr<PublishedSource>> open(std::string version);
  std::shared_ptr<detail::SubscriberState> state_;
};

}  // namespace eredu::mpi
