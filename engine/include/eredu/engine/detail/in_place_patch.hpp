#pragma once
/// \file
/// InPlaceModelSlot's patch policy over the swap core (swap_core.hpp). The new version is read
/// in the source's bounded chunks and compared (on the backend's executor), block by block,
/// with the serving weights where they lie: only the blocks that differ are kept (the patch), and every chunk is hashed
/// on the way, so the new version's digests are checked before anything is written. Publishing closes the gate, drains
/// the requests in flight, exchanges the patch's bytes with the serving ones (so the patch then holds the bytes it
/// replaced), and runs the canary on the patched model; if the canary rejects it, a second exchange puts those bytes
/// back before the gate reopens. No staged copy of the version exists at any time: the patch is the only memory it
/// takes besides the source's staging, and PatchOptions::budget bounds it.
///
/// A source sent as a delta against the serving bytes (io::DeltaSource) names the ranges that
/// can differ: with a digest to check, only those are read and compared, and the bytes between
/// them are hashed where they serve, so the digest still covers the whole patched weight. With
/// a digest of xxh3_128_blocks and the block digests the slot kept when it last checked the
/// weight (InPlaceState::block_digests), only the 64 KiB blocks the ranges touch are hashed,
/// rebuilt from the serving bytes with the new ones over them; the kept digests stand for the
/// rest. A patch keeps the block digests it checked; a swap forgets them.

#include <algorithm>
#include <asio/awaitable.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/engine/backend/backend_glue.hpp"
#include "eredu/engine/backend/patching_backend.hpp"
#include "eredu/engine/description/parameter_error.hpp"
#include "eredu/engine/detail/in_place_swap.hpp"
#include "eredu/engine/detail/swap_core.hpp"
#include "eredu/engine/detail/swap_steps.hpp"
#include "eredu/engine/orchestration/engine_error.hpp"
#include "eredu/engine/serving/swap_options.hpp"
#include "eredu/io/integrity/block_digests.hpp"
#include "eredu/io/integrity/checksums.hpp"
#include "eredu/io/integrity/digest.hpp"
#include "eredu/io/reading/byte_source.hpp"
#include "eredu/io/reading/delta_source.hpp"

namespace eredu::engine::detail {

/// Bytes compared as one: a changed byte puts its whole block into the patch.
inline constexpr std::size_t patch_block = 64;
/// Bytes compared first as one, since most blocks of an RL step's update are unchanged.
inline constexpr std::size_t patch_page = 4096;
/// Most tensors a patch reads at once: fewer where the source serves fewer reads at once
/// (SourceCapabilities::concurrency); its staging budget bounds their chunks.
inline constexpr unsigned patch_streams = 4;

/// The changed blocks of one chunk of the new version, each run of them bound for its place in
/// a serving weight's storage.
struct PatchPiece {
  /// `length` bytes from `bytes[from]` go to `at`.
  struct Run {
    std::byte* at = nullptr;  ///< where they go
    std::size_t from = 0;     ///< where they are in `bytes`
    std::size_t length = 0;   ///< how many
  };
  std::vector<std::byte> bytes;  ///< every run's new bytes, in order
  std::vector<Run> runs;         ///< the runs
  /// What a piece of `bytes` changed bytes, with room for `runs` runs, holds: what
  /// PatchOptions::budget bounds.
  static std::uint64_t held(std::uint64_t bytes, std::uint64_t runs) {
    return bytes + runs * sizeof(Run) + sizeof(PatchPiece);
  }
  /// Exchanges each run's bytes with the serving ones: after it, the piece holds those.
  void exchange() {
    for (const Run& run : runs)
      std::swap_ranges(bytes.begin() + static_cast<std::ptrdiff_t>(run.from),
                       bytes.begin() + static_cast<std::ptrdiff_t>(run.from + run.length), run.at);
  }
};

/// A patch staged by a load: its pieces, their changed bytes, and the canary it runs once written.
template <class Model>
struct Patch {
  std::vector<PatchPiece> pieces;  ///< every chunk's changed runs, of every weight
  std::uint64_t bytes = 0;         ///< the changed bytes in all
  std::uint64_t read = 0;          ///< bytes read and compared
  std::uint64_t hashed = 0;        ///< bytes hashed to check digests
  /// The patched owners' new block digests, for InPlaceState::block_digests once written.
  std::vector<std::pair<ParameterId, io::BlockDigests>> digests;
  /// The swap's canary step, run on the patched model under the closed gate (empty: none).
  std::function<asio::awaitable<void>(const Model&)> canary{};
};

/// Calls `run(offset, length)` for each run of consecutive patch_block-byte blocks in which
/// `next` differs from the serving bytes at `serving` (as many), in order, until it returns
/// false. Returns false if a call did.
template <class Run>
bool for_each_changed_run(std::span<const std::byte> next, const std::byte* serving, Run&& run) {
  const std::size_t n = next.size();
  std::size_t open = 0, length = 0;  // the run being extended
  std::size_t i = 0;
  while (i < n) {
    const std::size_t page = std::min(patch_page, n - i);
    if (std::memcmp(next.data() + i, serving + i, page) == 0) {
      if (length > 0 && !run(open, std::exchange(length, 0))) return false;
      i += page;
      continue;
    }
    for (const std::size_t end = i + page; i < end;) {
      const std::size_t len = std::min(patch_block, end - i);
      if (std::memcmp(next.data() + i, serving + i, len) != 0) {
        if (length == 0) open = i;
        length += len;
      } else if (length > 0 && !run(open, std::exchange(length, 0))) {
        return false;
      }
      i += len;
    }
  }
  return length == 0 || run(open, length);
}

/// InPlaceModelSlot's patch policy (see file comment and run_swap's requirements).
template <PatchingBackend B, class Model, class Gate>
struct InPlacePatchSwap {
  using Report = SwapReport;                             ///< what a patch reports
  using Staged = Patch<Model>;                           ///< the changed runs
  using Committed = Staged;                              ///< the same, once committed
  static constexpr const char* what = "in-place patch";  ///< the swap's name in messages
  static constexpr bool check_after_canary = false;      ///< its canary runs in publish

  InPlaceState<Model, Gate>* state;               ///< the slot's (outlives the swap)
  std::shared_ptr<const WeightBindingPlan> plan;  ///< the swap's plan
  std::uint64_t budget = 0;                       ///< PatchOptions::budget
  typename B::Executor* executor = nullptr;       ///< compares and hashes (outlives the swap)

  /// The slot's claim flag.
  std::atomic<bool>& swapping() const noexcept { return state->swapping; }
  /// The generation the serving weights hold.
  std::uint64_t serving_generation() const { return Gate::current_generation(state->gate); }

  /// Refuses what a patch cannot change in place: no serving version yet, another aliasing,
  /// a weight a recipe computes (its bytes are not the source's).
  void admit(const WeightBindingPlan& p, std::uint64_t serving) const {
    if (serving == 0)
      throw OrchestrationError(errc::invalid_argument, {},
                               "an in-place patch changes the serving version, and none is bound yet: swap to the "
                               "first version with async_swap");
    if (aliases_of(p) != state->aliases)
      throw OrchestrationError(errc::invalid_argument, {},
                               "an in-place patch needs the serving version's aliasing (the same tied weights)");
    for (const WeightBinding* owner : p.owners())
      if (owner->recipe() != nullptr)
        throw OrchestrationError(errc::invalid_argument, {.parameter = owner->name()},
                                 "an in-place patch writes the source's bytes as they are, and a recipe computes "
                                 "this weight: swap to it with async_swap");
  }

  /// One weight to read and compare.
  struct Target {
    const WeightBinding* owner = nullptr;  ///< its binding
    io::TensorReadRequest read{};          ///< its bytes in the source
    std::span<std::byte> storage{};        ///< the serving bytes they replace
    std::optional<io::DigestCheck> check;  ///< its digest, when the swap verifies one
    std::string file{};                    ///< the source's file of its tensor, for messages
  };
  /// What the load's readers share.
  template <class Source>
  struct Load {
    Source* source = nullptr;            ///< the new version
    std::vector<Target> targets;         ///< every owner, in the plan's order
    std::atomic<std::size_t> next{0};    ///< the next target to take
    std::atomic<std::uint64_t> held{0};  ///< bytes the patch holds
    std::uint64_t budget = 0;            ///< the most it may hold
    /// The serving owners' block digests (InPlaceState::block_digests), read-only here.
    const std::map<ParameterId, io::BlockDigests>* kept = nullptr;
    bool verify = false;                       ///< the swap verifies digests
    unsigned readers = 1;                      ///< readers at once
    MaterializeProgress* progress = nullptr;   ///< the swap's counters (never null)
    typename B::Executor* executor = nullptr;  ///< compares and hashes the chunks
    std::mutex mutex;                          ///< guards `patch` and `failure`
    Staged patch;                              ///< the runs found so far
    /// The first reader's failure: the others stop at their next chunk. Each reader keeps its
    /// own (awaitable_operators would report two failures as asio::multiple_exceptions).
    std::exception_ptr failure;
    std::atomic<bool> failed{false};  ///< `failure` is set
    /// Adds `more` to what the patch holds if the budget allows; false (nothing added) if not.
    bool try_hold(std::uint64_t more) {
      if (held.fetch_add(more) + more <= budget) return true;
      held.fetch_sub(more);
      return false;
    }
  };

  /// Reads every weight of the plan and keeps what differs from the serving weights.
  template <io::ByteSource Source>
  asio::awaitable<Staged> load(const SwapRequest<Source, typename B::MaterializationContext, Model>& request,
                               const MaterializeOptions& materialize) const {
    const io::Catalog& catalog = request.source->catalog();
    Load<Source> load;
    load.source = request.source;
    load.budget = budget;
    load.kept = &state->block_digests;
    load.progress = materialize.progress;
    load.executor = executor;
    std::map<ParameterId, typename B::Parameter*> slots;
    for (const WeightBinding* owner : plan->owners()) slots.emplace(owner->id(), nullptr);
    struct Finder final : ParameterVisitorMut<typename B::Parameter> {
      explicit Finder(std::map<ParameterId, typename B::Parameter*>& s) : slots(s) {}
      void visit_mut(const ParameterMetadata& metadata, typename B::Parameter& parameter) override {
        if (auto it = slots.find(metadata.id); it != slots.end()) it->second = &parameter;
      }
      std::map<ParameterId, typename B::Parameter*>& slots;
    } finder(slots);
    state->gate->model.visit_parameters_mut(finder, std::string());

    load.verify = materialize.verify.mode != VerifyMode::off;
    load.readers = std::clamp<unsigned>(request.source->capabilities().concurrency, 1, patch_streams);
    std::uint64_t total = 0;
    for (const WeightBinding* owner : plan->owners()) {
      typename B::Parameter* slot = slots.at(owner->id());
      if (slot == nullptr)
        throw OrchestrationError(errc::unexpected_bindings, {.parameter = owner->name()},
                                 "the plan binds a parameter the serving model does not declare");
      Target target{owner, io::TensorReadRequest{owner->checkpoint_key(), owner->selection()}, {}, std::nullopt};
      try {
        const io::TensorInfo* tensor = catalog.find(owner->checkpoint_key());
        if (tensor == nullptr)
          throw Error(errc::tensor_not_found, {.tensor = owner->checkpoint_key()},
                      "the new version has no such tensor");
        check_bind_fits(slot->dtype, slot->shape, tensor->dtype, owner->selection().selected_shape(tensor->shape));
        target.storage = B::writable_bytes(*slot);
        const std::uint64_t selected = request.source->selected_bytes(target.read);
        if (selected != target.storage.size())
          throw BackendError(errc::bind_shape_mismatch, {.tensor = owner->checkpoint_key()},
                             fmt::format("the new version's {} bytes cannot replace the serving weight's {}", selected,
                                         target.storage.size()));
        target.file = catalog.file_of(*tensor).path;
        if (load.verify)
          target.check = materialize.verify.checksums.check(catalog, owner->checkpoint_key(), owner->selection(),
                                                            materialize.verify.preferred);
      } catch (...) {
        std::rethrow_exception(attach_parameter(std::current_exception(), owner->name()));
      }
      total += target.storage.size();
      load.targets.push_back(std::move(target));
    }
    load.progress->owners_total += load.targets.size();
    load.progress->bytes_total += total;

    using namespace asio::experimental::awaitable_operators;
    asio::awaitable<void> a = read_some(load, 0), b = read_some(load, 1), c = read_some(load, 2),
                          d = read_some(load, 3);
    static_assert(patch_streams == 4, "the readers below are patch_streams");
    asio::awaitable<void> all = std::move(a) && std::move(b) && std::move(c) && std::move(d);
    co_await std::move(all);
    if (load.failure) std::rethrow_exception(load.failure);
    co_return std::move(load.patch);
  }

  /// Reader `reader` (none past load.readers): takes the next target until none is left, reads
  /// it chunk by chunk, hashes and compares each chunk, and adds its changed runs to the patch.
  template <class Source>
  static asio::awaitable<void> read_some(Load<Source>& load, unsigned reader) {
    if (reader >= load.readers) co_return;
    for (std::size_t i = load.next++; i < load.targets.size() && !load.failed; i = load.next++) {
      Target& target = load.targets[i];
      try {
        std::optional<io::Hasher> hasher;
        if (target.check) hasher.emplace(target.check->kind);
        std::vector<PatchPiece> pieces;
        std::uint64_t read = 0, changed = 0;
        // A delta against the bytes serving (io::DeltaSource) sends only what can differ from
        // them: only that is read and compared, and the rest is hashed where it serves, so the
        // digest still covers every byte the patched weight will hold. Without a digest to
        // check, the sender's ranges are not trusted, and every byte is read.
        std::optional<std::vector<io::SelectionRange>> ranges;
        if constexpr (io::DeltaSource<Source>)
          if (hasher) ranges = load.source->changed_ranges(target.read);
        std::uint64_t asked = target.storage.size();
        if (ranges) {
          asked = 0;
          for (const io::SelectionRange& r : *ranges) asked += r.length;
        }
        // The stream takes the ranges; below, only whether there are any is read.
        auto chunks = [&] {
          if constexpr (io::DeltaSource<Source>)
            if (ranges) return load.source->stream_ranges(target.read, std::move(*ranges));
          return load.source->stream(target.read);
        }();
        // With the serving bytes' block digests, kept by the patch that last checked them, a
        // digest of xxh3_128_blocks needs only the blocks the ranges touch hashed again: each
        // is rebuilt from the serving bytes with the ranges' new bytes laid over them.
        std::optional<io::BlockDigests> next;  // the new version's, from the kept ones
        if (ranges && target.check->kind == io::DigestKind::xxh3_128_blocks)
          if (const auto it = load.kept->find(target.owner->id());
              it != load.kept->end() && it->second.bytes() == target.storage.size() &&
              load.try_hold(it->second.memory_bytes() + io::BlockDigests::block_bytes))
            next = it->second;
        std::uint64_t rehashed = 0;  // bytes of the blocks hashed again
        std::vector<std::byte> block;
        std::size_t open_block = 0;  // the block in `block`, if `block` is not empty
        const auto close_block = [&] {
          if (block.empty()) return;
          next->set(open_block, block);
          rehashed += block.size();
          block.clear();
        };
        // Lays `bytes`, at `offset` of the selection, over the serving bytes of the blocks they
        // touch, hashing each block they complete (leases ascend: a block never reopens).
        const auto rebuild = [&](std::uint64_t offset, std::span<const std::byte> bytes) {
          for (std::uint64_t at = offset, end = offset + bytes.size(); at < end;) {
            const std::size_t j = static_cast<std::size_t>(at / io::BlockDigests::block_bytes);
            const std::uint64_t first = next->block_first(j), last = first + next->block_length(j);
            if (block.empty() || open_block != j) {
              close_block();
              block.assign(target.storage.begin() + static_cast<std::ptrdiff_t>(first),
                           target.storage.begin() + static_cast<std::ptrdiff_t>(last));
              open_block = j;
            }
            const std::uint64_t stop = std::min(end, last);
            std::memcpy(block.data() + (at - first), bytes.data() + (at - offset), static_cast<std::size_t>(stop - at));
            at = stop;
            if (stop == last) close_block();
          }
        };
        std::uint64_t hashed = 0;  // the selection's bytes hashed so far, in order
        // Hashes the serving bytes [hashed, to), which the version keeps as they are.
        const auto hash_kept = [&](std::uint64_t to) -> asio::awaitable<void> {
          if (next || to <= hashed) co_return;
          const std::span<const std::byte> kept(target.storage.data() + hashed, to - hashed);
          Completion done = B::submit_host_work(*load.executor, [&] { hasher->update(kept); });
          co_await done.async_wait(asio::use_awaitable);
          load.progress->bytes_done += kept.size();
          hashed = to;
        };
        for (;;) {
          std::optional<io::Lease> lease = co_await chunks.async_next(asio::use_awaitable);
          if (!lease || load.failed) break;
          const std::span<const std::byte> bytes = lease->bytes();
          if (lease->offset() < hashed || lease->offset() + bytes.size() > target.storage.size())
            throw Error(errc::io_error, {.file = target.file, .tensor = target.read.key},
                        fmt::format("the source delivered bytes {}-{} of a {}-byte selection, after bytes up to {}",
                                    lease->offset(), lease->offset() + bytes.size(), target.storage.size(), hashed));
          if (ranges) co_await hash_kept(lease->offset());
          // Compared and hashed on the executor: the event loop goes on with the other readers.
          // One comparison finds the changed runs. Their list grows only by what the budget still
          // allows, and their bytes are reserved before they are copied, so the patch never
          // holds more than the budget (PatchPiece::held counts the list's capacity).
          std::byte* serving = target.storage.data() + lease->offset();
          bool over = false;
          Completion compared = B::submit_host_work(*load.executor, [&] {
            if (next)
              rebuild(lease->offset(), bytes);
            else if (hasher)
              hasher->update(bytes);
            const auto reserve = [&](std::uint64_t more) {
              if (load.held.fetch_add(more) + more <= load.budget) return true;
              over = true;
              return false;
            };
            PatchPiece piece;
            std::uint64_t n = 0;
            const bool within = for_each_changed_run(bytes, serving, [&](std::size_t from, std::size_t length) {
              if (const std::size_t room = piece.runs.capacity(); piece.runs.size() == room) {
                // The list doubles: the new one is reserved in full, as the old one is held while it moves.
                const std::size_t grown = std::max<std::size_t>(1, 2 * room);
                if (!reserve((room == 0 ? sizeof(PatchPiece) : 0) + grown * sizeof(PatchPiece::Run))) return false;
                piece.runs.reserve(grown);
                load.held.fetch_sub(room * sizeof(PatchPiece::Run));
              }
              piece.runs.push_back({serving + from, n, length});
              n += length;
              return true;
            });
            if (!within || piece.runs.empty() || !reserve(n)) return;
            piece.bytes.reserve(n);
            for (const PatchPiece::Run& run : piece.runs) {
              const auto from = bytes.begin() + (run.at - serving);
              piece.bytes.insert(piece.bytes.end(), from, from + static_cast<std::ptrdiff_t>(run.length));
            }
            changed += n;
            pieces.push_back(std::move(piece));
          });
          co_await compared.async_wait(asio::use_awaitable);
          if (over)
            throw Error(errc::exceeds_budget, {.file = target.file, .tensor = target.read.key},
                        fmt::format("the new version changes more bytes than a patch may hold ({} bytes, "
                                    "PatchOptions::budget), reached at byte {} of the selection {}: swap to it "
                                    "with async_swap, which stages a whole copy",
                                    load.budget, lease->offset(), target.read.selection.to_string()));
          read += bytes.size();
          hashed = lease->offset() + bytes.size();
          load.progress->bytes_done += bytes.size();
        }
        if (load.failed) co_return;
        if (read != asked)
          throw Error(errc::io_error, {.file = target.file, .tensor = target.read.key},
                      fmt::format("the source delivered {} of the {} bytes asked of the selection's {}", read, asked,
                                  target.storage.size()));
        if (ranges) co_await hash_kept(target.storage.size());
        if (hasher) {
          std::string actual;
          if (next) {
            close_block();
            load.held.fetch_sub(io::BlockDigests::block_bytes);
            actual = next->hex_digest();
            load.progress->bytes_done += target.storage.size() - read;  // kept as they serve
          } else {
            actual = hasher->hex_digest();
            rehashed = target.storage.size();
            // The blocks' digests the hash went through, kept if the budget allows.
            if (io::BlockDigests all = hasher->take_blocks();
                all.bytes() == target.storage.size() && all.size() > 0 && load.try_hold(all.memory_bytes()))
              next = std::move(all);
          }
          target.check->compare(actual, target.storage.size());
          ++load.progress->tensors_verified;
          load.progress->bytes_verified += target.storage.size();
        } else if (load.verify) {
          ++load.progress->tensors_unverified;
        }
        std::lock_guard lock(load.mutex);
        for (PatchPiece& piece : pieces) load.patch.pieces.push_back(std::move(piece));
        load.patch.bytes += changed;
        load.patch.read += read;
        load.patch.hashed += rehashed;
        if (next) load.patch.digests.emplace_back(target.owner->id(), std::move(*next));
        ++load.progress->owners_done;
      } catch (...) {
        std::lock_guard lock(load.mutex);
        if (!load.failure) load.failure = attach_parameter(std::current_exception(), target.owner->name());
        load.failed = true;
      }
    }
  }

  /// Nothing to add: the load checked every weight against its slot.
  void validate(const Staged&) const noexcept {}
  /// Keeps the canary for publish: the patched model exists only once it is written.
  template <class Run>
  asio::awaitable<void> canary(Staged& patch, Run run) const {
    patch.canary = std::move(run);
    co_return;
  }
  /// At once.
  asio::awaitable<Committed> commit(std::optional<Staged> staged, std::exception_ptr failure, Report&) const {
    return commit_locally(std::move(staged), std::move(failure));
  }
  /// Closes the gate, drains the requests in flight, writes the patch, runs the canary (and
  /// undoes the patch if it fails), reopens.
  asio::awaitable<void> publish(Committed& patch, std::uint64_t serving, const SwapCancellation& cancellation,
                                Report& report) const {
    cancellation.check("before the patch is written");
    const SwapClock::time_point closed = co_await close_for_write(state->gate, report);
    // Swap each run's bytes with the serving ones: the patch then holds the old bytes.
    auto exchange = [&] {
      for (PatchPiece& piece : patch.pieces) piece.exchange();
    };
    exchange();
    std::exception_ptr rejected;
    if (patch.canary) {
      try {
        co_await patch.canary(std::as_const(state->gate->model));
      } catch (...) {
        rejected = std::current_exception();
      }
    }
    if (rejected) {
      exchange();
      report.publish_pause = SwapClock::now() - closed;
      Gate::reopen_unchanged(state->gate);
      std::rethrow_exception(rejected);
    }
    report.written_bytes = patch.bytes;
    report.hashed_bytes = patch.hashed;
    // The patched owners' bytes are the new version's: digests of the old ones no longer hold.
    for (const WeightBinding* owner : plan->owners()) state->block_digests.erase(owner->id());
    for (auto& [id, digests] : patch.digests) state->block_digests.insert_or_assign(id, std::move(digests));
    report.publish_pause = SwapClock::now() - closed;
    trace_step("publish in place", closed);
    report.generation = serving + 1;
    Gate::open(state->gate, nullptr);
  }
  /// Nothing: the replaced bytes go with the patch.
  asio::awaitable<void> retire(Committed&) const { co_return; }
};

}  // namespace eredu::engine::detail
