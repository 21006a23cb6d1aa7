#include "eredu/mpi/publisher.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <tbb/parallel_for.h>

#include <asio/post.hpp>
#include <asio/thread_pool.hpp>

#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"
#include "eredu/core/printable.hpp"
#include "eredu/core/selection.hpp"
#include "eredu/io/integrity/digest.hpp"
#include "live/channel.hpp"
#include "live/element_width.hpp"
#include "live/wire.hpp"
#include "live/xor_planes.hpp"
#include "progress.hpp"

namespace eredu::mpi {
namespace detail {

/// The live_digest of `selection` of a tensor whose bytes are `bytes`, in the order a load delivers them.
std::string selection_digest(const ManifestTensor& t, std::span<const std::byte> bytes, const Selection& selection) {
  if (selection.is_all()) return io::digest_hex(live_digest, bytes);
  io::Hasher h(live_digest);
  for (const ByteRun& run : selection_runs(t.shape, t.dtype, selection))
    h.update(bytes.subspan(run.source_offset, run.length));
  return h.hex_digest();
}

/// Bytes a staged tensor's hashing copies out at a time, per hashing thread.
constexpr std::size_t staging_piece = std::size_t{8} << 20;

/// Copies `runs` (non-empty, packed into `out` in order) of staged tensor `t`: what `copy`
/// throws, as a BackendError naming the tensor and the offset of the first run.
void copy_staged(const CopyOut& copy, const ManifestTensor& t, std::span<const ByteRun> runs,
                 std::span<std::byte> out) {
  if (out.empty()) return;  // a copier need not handle nothing
  const std::uint64_t offset = runs.front().source_offset;
  try {
    copy(runs, out);
  } catch (const BackendError& e) {
    if (e.context().offset) throw;
    ErrorContext where = e.context();  // a device's error names neither the piece nor, maybe, the tensor
    where.tensor = t.name;
    where.offset = offset;
    throw BackendError(e.kind(), std::move(where), e.detail());
  } catch (const std::exception& e) {
    throw BackendError(errc::backend_failure, {.tensor = t.name, .offset = offset},
                       fmt::format("copying {} bytes out of the tensor's memory failed: {}", out.size(), e.what()));
  }
}

/// selection_digest of a staged tensor, copied out through `copy` in pieces of at most
/// staging_piece, each one call for all the runs (or parts of runs) it packs.
std::string staged_digest(const ManifestTensor& t, const CopyOut& copy, const Selection& selection) {
  const std::vector<ByteRun> runs = selection.is_all()
                                        ? std::vector<ByteRun>{ByteRun{.source_offset = 0, .length = t.nbytes}}
                                        : selection_runs(t.shape, t.dtype, selection);
  std::uint64_t total = 0;
  for (const ByteRun& run : runs) total += run.length;
  std::vector<std::byte> piece(static_cast<std::size_t>(std::min<std::uint64_t>(total, staging_piece)));
  io::Hasher h(live_digest);
  std::vector<ByteRun> batch;
  std::uint64_t filled = 0;
  const auto flush = [&] {
    const std::span<std::byte> out(piece.data(), static_cast<std::size_t>(filled));
    copy_staged(copy, t, batch, out);
    h.update(out);  // packed in order: the selection's bytes as a load delivers them
    batch.clear();
    filled = 0;
  };
  for (const ByteRun& run : runs)
    for (std::uint64_t at = 0; at < run.length;) {
      const std::uint64_t n = std::min<std::uint64_t>(piece.size() - filled, run.length - at);
      batch.push_back(ByteRun{.source_offset = run.source_offset + at, .dest_offset = filled, .length = n});
      filled += n;
      at += n;
      if (filled == piece.size()) flush();
    }
  if (filled > 0) flush();
  return h.hex_digest();
}

/// Calls `f(byte offset)` for each element of `element` bytes that differs between `now` and
/// `before` (equal sizes, a multiple of `element`), comparing whole integers where it can.
template <class F>
void for_each_changed(std::span<const std::byte> now, std::span<const std::byte> before, std::size_t element, F&& f) {
  with_element_width(element, [&]<std::size_t W>(std::integral_constant<std::size_t, W>) {
    const std::size_t width = W != 0 ? W : element;  // a memcmp of constant 1-8 bytes is one compare
    for (std::size_t at = 0; at + width <= now.size(); at += width)
      if (std::memcmp(now.data() + at, before.data() + at, width) != 0) f(at);
  });
}

/// One offered version: its manifest, its memory, and which subscribers opened and finished it.
struct PublicationState {
  Manifest manifest;
  std::vector<std::span<const std::byte>> memory;   // by tensor (empty for a staged one)
  std::vector<CopyOut> copy_out;                    // by tensor: set for a staged one
  std::vector<std::span<const std::byte>> regions;  // attached for it: contiguous tensors merged
  /// By tensor: a sparse delta's indices and values (the only memory a publication owns).
  std::vector<std::vector<std::byte>> encoded;
  // Guarded by PublisherState::mutex:
  bool withdrawn = false;
  bool detached = false;
  std::set<int> opened;
  std::set<int> served;
  std::set<int> failed;
};

/// selection_digest of tensor `i` of `p`, staged or not.
std::string digest_of(const PublicationState& p, std::size_t i, const Selection& selection) {
  const ManifestTensor& t = p.manifest.tensors[i];
  return p.copy_out[i] ? staged_digest(t, p.copy_out[i], selection) : selection_digest(t, p.memory[i], selection);
}

struct PublisherState : std::enable_shared_from_this<PublisherState> {
  PublisherState(std::shared_ptr<CommState> c, PublisherOptions o)
      : comm(c),
        options(o),
        window(o.transport == LiveTransport::one_sided ? std::make_unique<LiveWindow>(std::move(c), false) : nullptr) {}

  std::shared_ptr<CommState> comm;
  PublisherOptions options;
  /// Freed by ~Publisher (collectively with the subscribers), even while Publication handles
  /// keep this state alive.
  std::unique_ptr<LiveWindow> window;  ///< none under LiveTransport::two_sided
  bool closed = false;                 ///< ~Publisher ran (guarded by attach_mutex)
  asio::thread_pool worker{1};         // answers requests: hashing never holds the progress thread

  mutable std::mutex mutex;
  mutable std::condition_variable changed;
  std::map<std::uint64_t, std::shared_ptr<PublicationState>> publications;  // by id, in publication order
  /// Selections subscribers asked digests of, by tensor name: the next versions hash them at
  /// publication (a serving fleet's plans rarely change between versions).
  std::map<std::string, std::set<std::string>> asked;
  /// Tags of the latest withdrawn versions (at most 1024), so that asking for one is
  /// version_withdrawn rather than version_not_published.
  std::deque<std::string> withdrawn_tags;
  std::uint64_t next_id = 1;
  bool stopping = false;
  std::shared_ptr<PostedReceive> receive;  // the request being waited for

  // The regions attached to the window, by first byte, with the publications using each: the
  // same memory offered in two versions at once is attached once (MPI forbids overlapping
  // attachments).
  struct Attached {
    std::span<const std::byte> memory;
    MPI_Aint address = 0;
    int uses = 0;
  };
  std::mutex attach_mutex;
  std::map<const std::byte*, Attached> attached;
  /// Two-sided replies in flight from each region, by first byte (taken inside attach_mutex,
  /// never around a wait for the progress thread, which decrements them).
  std::mutex send_mutex;
  std::condition_variable send_done;
  std::map<const std::byte*, int> sending;

  /// Attaches `region` (or counts one more use of it); its window address. Throws
  /// Error(invalid_argument) when it overlaps a region attached in another extent.
  MPI_Aint attach(std::span<const std::byte> region, const std::string& version) {
    std::lock_guard lock(attach_mutex);
    auto next = attached.lower_bound(region.data());
    if (next != attached.end() && next->first == region.data() && next->second.memory.size() == region.size()) {
      ++next->second.uses;
      return next->second.address;
    }
    const bool overlaps_next = next != attached.end() && next->first < region.data() + region.size();
    const bool overlaps_previous =
        next != attached.begin() && std::prev(next)->first + std::prev(next)->second.memory.size() > region.data();
    if (overlaps_next || overlaps_previous)
      throw Error(errc::invalid_argument, {},
                  fmt::format("version {}: its memory overlaps memory another offered version uses in another "
                              "layout (MPI cannot attach overlapping regions): withdraw that version first",
                              printable(version)));
    if (closed) throw Error(errc::invalid_argument, {}, "the publisher is closed");
    // Two-sided reads name memory by its address, as a dynamic window does.
    const MPI_Aint address =
        window ? window->attach(region) : static_cast<MPI_Aint>(reinterpret_cast<std::uintptr_t>(region.data()));
    attached.emplace(region.data(), Attached{region, address, 1});
    return address;
  }

  /// One use fewer of `region`; detached when unused, once no reply is being sent from it
  /// (each send ends within reply_timeout, by completing or timing out).
  void release(std::span<const std::byte> region) noexcept {
    {
      std::lock_guard lock(attach_mutex);
      auto it = attached.find(region.data());
      if (it == attached.end() || --it->second.uses > 0) return;
      if (window) window->detach(region);
      attached.erase(it);  // no read can start a send from it now
    }
    std::unique_lock lock(send_mutex);
    send_done.wait(lock, [&] { return sending.find(region.data()) == sending.end(); });
  }

  /// Waits for the next request (on the progress thread).
  void post_receive() {
    {
      std::lock_guard lock(mutex);
      if (stopping) return;
    }
    auto [rx, done] = receive_message(comm, MPI_ANY_SOURCE, request_tag, max_request_bytes, "a subscriber's request",
                                      std::chrono::hours(24 * 365), true);
    bool cancel_now = false;
    {
      std::lock_guard lock(mutex);
      receive = rx;
      cancel_now = stopping;  // the destructor ran meanwhile and cancelled the one before
    }
    if (cancel_now) cancel_receive(comm, rx);
    // May run inline (a receive that failed at once), so no lock is held here.
    done.on_complete([weak = weak_from_this(), rx = rx](std::exception_ptr error) {
      std::shared_ptr<PublisherState> self = weak.lock();
      if (!self) return;
      {
        std::lock_guard lock(self->mutex);
        if (self->stopping) return;
      }
      if (error) {
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          log::warn("live publisher: receiving requests on group '{}' failed; no more requests are answered: {}",
                    self->comm->name, e.what());
        }
        return;
      }
      asio::post(self->worker, [self, rx] { self->handle(rx->buffer.bytes()); });
      self->post_receive();
    });
  }

  std::shared_ptr<PublicationState> find(std::uint64_t id) const {
    auto it = publications.find(id);
    return it == publications.end() ? nullptr : it->second;
  }

  /// Sends a reply's header to `dest` on `tag`: its status and the size of the body that
  /// follows on tag + 1.
  void send_header(int dest, int tag, ReplyStatus status, std::uint64_t size, const std::string& what) {
    WireWriter head;
    head.u32(static_cast<std::uint32_t>(status));
    head.u32(0);
    head.u64(size);
    send_message(comm, dest, tag, std::make_shared<const std::vector<std::byte>>(std::move(head.bytes())), what,
                 options.reply_timeout);
  }

  /// Answers `head` with `status` and `body`; a body larger than the subscriber receives is
  /// refused instead (too_large), since a send it never receives would wait out reply_timeout
  /// and leave the group unusable for every subscriber.
  void reply(const RequestHead& head, ReplyStatus status, std::vector<std::byte> body) {
    if (body.size() > head.reply_capacity) {
      refuse_too_large(head, body.size());
      return;
    }
    const auto what = fmt::format("a reply to rank {}", head.sender);
    send_header(head.sender, head.reply_tag, status, body.size(), what);
    if (!body.empty())
      send_message(comm, head.sender, head.reply_tag + 1,
                   std::make_shared<const std::vector<std::byte>>(std::move(body)), what, options.reply_timeout);
  }

  /// Answers `head` with too_large for a reply of `size` bytes (the reason as its body, if
  /// even that fits).
  void refuse_too_large(const RequestHead& head, std::uint64_t size) {
    std::vector<std::byte> why =
        text(fmt::format("a reply of {} bytes, more than the {} bytes of reply memory", size, head.reply_capacity));
    if (why.size() > head.reply_capacity) why.clear();
    reply(head, ReplyStatus::too_large, std::move(why));
  }

  static std::vector<std::byte> text(const std::string& s) {
    WireWriter w;
    w.str(s);
    return std::move(w.bytes());
  }

  void handle(std::span<const std::byte> message) {
    RequestHead head;
    try {
      WireReader r(message, "request");
      head.kind = static_cast<RequestKind>(r.u32());
      head.sender = static_cast<int>(r.u32());
      head.reply_tag = static_cast<int>(r.u32());
      head.publication = r.u64();
      head.reply_capacity = r.u64();
      if (head.sender < 0 || head.sender >= comm->size) return;  // nowhere to answer
      answer(head, r);
    } catch (const BackendError& e) {  // a staged tensor's copy failed
      if (head.kind != RequestKind::done && head.reply_tag != 0) reply(head, ReplyStatus::failed, text(e.what()));
    } catch (const std::exception& e) {
      if (head.kind == RequestKind::done || head.sender < 0 || head.sender >= comm->size || head.reply_tag == 0) {
        log::warn("live publisher: a malformed request: {}", e.what());
        return;
      }
      reply(head, ReplyStatus::bad_request, text(e.what()));
    }
  }

  void answer(const RequestHead& head, WireReader& r) {
    if (head.kind == RequestKind::open) {
      const std::string version = r.str();
      std::shared_ptr<PublicationState> p;
      bool withdrawn = false;
      bool first_open = false;
      {
        std::lock_guard lock(mutex);
        for (auto it = publications.rbegin(); it != publications.rend(); ++it) {
          if (!version.empty() && it->second->manifest.version != version) continue;
          if (it->second->withdrawn) {
            withdrawn = !version.empty();
            if (withdrawn) break;
            continue;
          }
          p = it->second;
          first_open = p->opened.insert(head.sender).second;
          break;
        }
      }
      if (!p && !version.empty()) {
        std::lock_guard lock(mutex);
        withdrawn =
            withdrawn || std::find(withdrawn_tags.begin(), withdrawn_tags.end(), version) != withdrawn_tags.end();
      }
      if (!p) {
        reply(head, withdrawn ? ReplyStatus::withdrawn : ReplyStatus::not_published,
              text(version.empty() ? "no version is offered" : version));
        return;
      }
      std::vector<std::byte> manifest = encode_manifest(p->manifest);
      if (manifest.size() > head.reply_capacity && first_open) {  // refused: the subscriber never holds it
        std::lock_guard lock(mutex);
        p->opened.erase(head.sender);
      }
      reply(head, ReplyStatus::ok, std::move(manifest));
      return;
    }
    std::shared_ptr<PublicationState> p;
    bool withdrawn = false;
    {
      std::lock_guard lock(mutex);
      p = find(head.publication);
      if (p) withdrawn = p->withdrawn;
      if (p && head.kind == RequestKind::done) {
        if (r.u32() != 0) {
          p->served.insert(head.sender);
          p->failed.erase(head.sender);
        } else {
          p->failed.insert(head.sender);
        }
        changed.notify_all();
      }
    }
    if (head.kind == RequestKind::done) return;
    if (!p || withdrawn) {
      reply(head, p ? ReplyStatus::withdrawn : ReplyStatus::not_published,
            text(p ? p->manifest.version : fmt::format("publication {}", head.publication)));
      return;
    }
    if (head.kind == RequestKind::confirm) {
      reply(head, ReplyStatus::ok, {});
      return;
    }
    if (head.kind == RequestKind::read) {
      reply_attached(head, r);
      return;
    }
    if (head.kind == RequestKind::read_staged) {
      reply_staged(head, *p, r);
      return;
    }
    if (head.kind != RequestKind::digests)
      throw Error(errc::invalid_argument, {}, fmt::format("unknown request kind {}", static_cast<int>(head.kind)));
    const std::uint64_t n = r.u64();
    WireWriter out;
    out.u64(n);
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::uint64_t index = r.u64();
      const std::string text_selection = r.str();
      if (index >= p->manifest.tensors.size())
        throw Error(errc::tensor_not_found, {}, fmt::format("no tensor {} in version {}", index, p->manifest.version));
      const ManifestTensor& t = p->manifest.tensors[index];
      {
        std::lock_guard lock(mutex);
        asked[t.name].insert(text_selection);
      }
      const std::optional<Selection> selection = Selection::parse(text_selection);
      if (!selection) throw Error(errc::invalid_selection, {.tensor = t.name}, "a selection that does not parse");
      if (std::string why = selection->check(t.shape); !why.empty())
        throw Error(errc::invalid_selection, {.tensor = t.name}, why);
      out.str(digest_of(*p, index, *selection));
    }
    reply(head, ReplyStatus::ok, std::move(out.bytes()));
  }

  /// A read request's runs (u64 count, then count × (u64 offset, u64 length)) and their total,
  /// at most 1 GiB. Throws Error(invalid_argument).
  static std::pair<std::vector<std::pair<std::uint64_t, std::uint64_t>>, std::uint64_t> requested_runs(WireReader& r) {
    const std::uint64_t count = r.u64();
    if (count > max_request_bytes / 16) throw Error(errc::invalid_argument, {}, "a read of too many runs");
    constexpr std::uint64_t most = std::uint64_t{1} << 30;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> runs;
    std::uint64_t total = 0;
    for (std::uint64_t i = 0; i < count; ++i) {
      const std::uint64_t offset = r.u64(), length = r.u64();
      if (length > most || total + length > most) throw Error(errc::invalid_argument, {}, "a read of more than 1 GiB");
      runs.emplace_back(offset, length);
      total += length;
    }
    return {std::move(runs), total};
  }

  /// Answers a two-sided read from attached memory: each run must lie within one region still
  /// attached (a withdrawn version's memory may be the caller's again). A read of one run (a
  /// row shard's part) is sent from that memory itself, not a copy: its region counts the send
  /// until it completes, and release() waits for it before the memory goes back to the trainer.
  /// Several runs (a column shard's rows, a delta's blocks) are packed into one buffer first,
  /// under attach_mutex; sending them as an indexed datatype from the memory was not measured.
  void reply_attached(const RequestHead& head, WireReader& r) {
    if (window) throw Error(errc::invalid_argument, {}, "this publisher's subscribers read its window (one_sided)");
    const std::uint64_t address = r.u64();
    auto [runs, total] = requested_runs(r);
    if (total > head.reply_capacity) {
      refuse_too_large(head, total);
      return;
    }
    const auto what = fmt::format("a reply to rank {}", head.sender);
    std::shared_ptr<MessageBuffer> packed;
    const std::byte* region = nullptr;  // the one run's region, counted while its send is in flight
    std::span<const std::byte> memory;
    {
      std::lock_guard lock(attach_mutex);  // withdraw detaches under it: no region goes mid-copy
      if (runs.size() != 1) packed = std::make_shared<MessageBuffer>(static_cast<std::size_t>(total));
      std::size_t at = 0;
      for (const auto& [offset, length] : runs) {
        if (offset > std::numeric_limits<std::uint64_t>::max() - address)
          throw Error(errc::invalid_argument, {}, "a read past the address space");
        const std::uint64_t from = offset + address;
        const auto* first = reinterpret_cast<const std::byte*>(static_cast<std::uintptr_t>(from));
        auto it = attached.upper_bound(first);
        bool inside = false;
        if (it != attached.begin()) {  // the region that starts at or before `first`
          --it;
          const std::uint64_t start = reinterpret_cast<std::uintptr_t>(it->second.memory.data());
          inside = from >= start && from - start <= it->second.memory.size() &&
                   length <= it->second.memory.size() - (from - start);
        }
        if (!inside)
          throw Error(
              errc::invalid_argument, {},
              fmt::format("a read of {} bytes at {:#x} outside the memory this publisher offers", length, from));
        if (packed) {
          std::memcpy(packed->data() + at, first, length);
          at += length;
        } else {
          region = it->first;
          memory = {first, static_cast<std::size_t>(length)};
        }
      }
      if (packed) packed->set_size(at);
      if (region != nullptr) {
        std::lock_guard count(send_mutex);
        ++sending[region];
      }
    }
    Completion body;
    try {
      send_header(head.sender, head.reply_tag, ReplyStatus::ok, total, what);
      if (packed && total > 0)
        send_message(comm, head.sender, head.reply_tag + 1, std::move(packed), what, options.reply_timeout);
      else if (region != nullptr && total > 0)
        body = send_memory(comm, head.sender, head.reply_tag + 1, memory, what, options.reply_timeout);
    } catch (...) {
      if (region != nullptr) sent(region);
      throw;
    }
    if (region == nullptr) return;
    if (!body.valid()) {
      sent(region);
      return;
    }
    body.on_complete([weak = weak_from_this(), region](std::exception_ptr) {
      if (std::shared_ptr<PublisherState> self = weak.lock()) self->sent(region);
    });
  }

  /// One send fewer from `region` (on the progress thread, or the worker).
  void sent(const std::byte* region) {
    std::lock_guard lock(send_mutex);
    if (auto it = sending.find(region); it != sending.end() && --it->second == 0) sending.erase(it);
    send_done.notify_all();
  }

  /// Answers a read of a staged tensor with the bytes it asks for, copied out of its memory
  /// into one reply buffer, not zeroed first (the copy writes every byte), once the reply is
  /// known to fit the subscriber's reply memory. The caller checked that `p` is not withdrawn,
  /// and withdraw() waits for this worker.
  void reply_staged(const RequestHead& head, const PublicationState& p, WireReader& r) {
    const std::uint64_t index = r.u64();
    if (index >= p.manifest.tensors.size() || !p.copy_out[index])
      throw Error(errc::invalid_argument, {}, fmt::format("a staged read of tensor {}, which is not staged", index));
    const ManifestTensor& t = p.manifest.tensors[index];
    const auto [runs, total] = requested_runs(r);
    std::vector<ByteRun> packed;  // the reply holds the runs in order
    std::uint64_t at = 0;
    for (const auto& [offset, length] : runs) {
      if (offset > t.nbytes || length > t.nbytes - offset)
        throw Error(errc::invalid_argument, {.tensor = t.name},
                    fmt::format("a read of {} bytes at offset {} of a {}-byte tensor", length, offset, t.nbytes));
      if (length > 0) packed.push_back(ByteRun{.source_offset = offset, .dest_offset = at, .length = length});
      at += length;
    }
    if (total > head.reply_capacity) {
      refuse_too_large(head, total);
      return;
    }
    auto out = std::make_shared<MessageBuffer>(static_cast<std::size_t>(total));
    copy_staged(p.copy_out[index], t, packed, {out->data(), out->capacity()});  // one call: it may batch the runs
    out->set_size(out->capacity());
    const auto what = fmt::format("a reply to rank {}", head.sender);
    send_header(head.sender, head.reply_tag, ReplyStatus::ok, total, what);
    if (total > 0) send_message(comm, head.sender, head.reply_tag + 1, std::move(out), what, options.reply_timeout);
  }

  /// Withdraws `p` and detaches its memory (see Publication::withdraw).
  void withdraw(const std::shared_ptr<PublicationState>& p) {
    {
      std::unique_lock lock(mutex);
      if (p->detached) return;
      p->withdrawn = true;
      const auto all_done = [&] {
        return std::all_of(p->opened.begin(), p->opened.end(),
                           [&](int r) { return p->served.count(r) > 0 || p->failed.count(r) > 0; });
      };
      if (!changed.wait_for(lock, options.linger, all_done))
        log::warn(
            "live publisher: version {} withdrawn while {} subscriber(s) had not said they were done, after {} ms",
            printable(p->manifest.version), p->opened.size() - p->served.size() - p->failed.size(),
            options.linger.count());
      p->detached = true;
    }
    // A request the worker is answering may still be hashing this version's memory: wait for
    // it (the worker is one thread, in order; later requests see the version withdrawn), so that
    // the memory is the caller's when this returns.
    auto drained = std::make_shared<std::promise<void>>();
    std::future<void> idle = drained->get_future();
    asio::post(worker, [drained] { drained->set_value(); });
    idle.wait();
    for (std::span<const std::byte> r : p->regions) release(r);
    std::lock_guard lock(mutex);
    publications.erase(p->manifest.publication);
    withdrawn_tags.push_back(p->manifest.version);
    if (withdrawn_tags.size() > 1024) withdrawn_tags.pop_front();
  }
};

}  // namespace detail

Publication::Publication() noexcept = default;
Publication::Publication(Publication&&) noexcept = default;
Publication& Publication::operator=(Publication&& other) noexcept {
  if (this != &other) {
    withdraw();
    owner_ = std::move(other.owner_);
    state_ = std::move(other.state_);
  }
  return *this;
}
Publication::~Publication() { withdraw(); }

Publication::Publication(std::shared_ptr<detail::PublisherState> owner,
                         std::shared_ptr<detail::PublicationState> state) noexcept
    : owner_(std::move(owner)), state_(std::move(state)) {}

const std::string& Publication::version() const noexcept {
  static const std::string none;
  return state_ ? state_->manifest.version : none;
}

int Publication::served() const {
  if (!state_) return 0;
  std::lock_guard lock(owner_->mutex);
  return static_cast<int>(state_->served.size());
}

int Publication::failed() const {
  if (!state_) return 0;
  std::lock_guard lock(owner_->mutex);
  return static_cast<int>(state_->failed.size());
}

bool Publication::wait_served(int subscribers, std::chrono::milliseconds timeout) const {
  if (!state_) return false;
  std::unique_lock lock(owner_->mutex);
  return owner_->changed.wait_for(
      lock, timeout, [&] { return static_cast<int>(state_->served.size() + state_->failed.size()) >= subscribers; });
}

void Publication::withdraw() noexcept {
  if (!state_) return;
  owner_->withdraw(state_);
  state_.reset();
  owner_.reset();
}

Publisher::Publisher(Communicator& group, PublisherOptions options) {
  if (!group.valid()) throw Error(errc::invalid_argument, {}, "a publisher needs a communicator");
  state_ = std::make_shared<detail::PublisherState>(group.state(), options);
  state_->post_receive();
}

Publisher::~Publisher() {
  std::vector<std::shared_ptr<detail::PublicationState>> left;
  {
    std::lock_guard lock(state_->mutex);
    for (auto& [id, p] : state_->publications) left.push_back(p);
  }
  for (auto& p : left) state_->withdraw(p);
  std::shared_ptr<detail::PostedReceive> rx;
  {
    std::lock_guard lock(state_->mutex);
    state_->stopping = true;
    rx = state_->receive;
  }
  if (rx) detail::cancel_receive(state_->comm, rx);
  state_->worker.join();
  std::lock_guard lock(state_->attach_mutex);
  state_->closed = true;
  state_->window.reset();
}

bool Publisher::offered(const std::string& version) const {
  std::lock_guard lock(state_->mutex);
  return std::any_of(state_->publications.begin(), state_->publications.end(),
                     [&](const auto& p) { return p.second->manifest.version == version && !p.second->withdrawn; });
}

int Publisher::rank() const noexcept { return state_->comm->rank; }

void Publisher::mark_delta(detail::PublicationState& p, const std::string& version) {
  const std::size_t block = state_->options.delta_block;
  if (p.manifest.base.empty() || block == 0) return;
  std::shared_ptr<detail::PublicationState> base;
  {
    std::lock_guard lock(state_->mutex);
    for (auto& [id, other] : state_->publications)
      if (other->manifest.version == p.manifest.base && !other->withdrawn) base = other;
  }
  if (!base) {
    log::warn("live publisher: version {} names base {}, which is not offered: subscribers read it whole",
              printable(version), printable(p.manifest.base));
    return;
  }
  p.manifest.delta_block = block;
  std::map<std::string, std::size_t> in_base;
  for (std::size_t j = 0; j < base->manifest.tensors.size(); ++j) in_base.emplace(base->manifest.tensors[j].name, j);
  for (std::size_t i = 0; i < p.manifest.tensors.size(); ++i) {
    detail::ManifestTensor& t = p.manifest.tensors[i];
    const auto it = in_base.find(t.name);
    if (it == in_base.end()) continue;
    const detail::ManifestTensor& b = base->manifest.tensors[it->second];
    if (t.staged || b.staged) continue;  // staged memory is only read one reply at a time
    const std::span<const std::byte> now = p.memory[i];
    const std::span<const std::byte> before = base->memory[it->second];
    // The same memory in both versions (a trainer updating in place) says nothing about what
    // the base's subscribers hold: it goes whole.
    if (b.dtype != t.dtype || b.shape != t.shape || t.nbytes == 0 || now.data() == before.data()) continue;
    const std::size_t blocks = (now.size() + block - 1) / block;
    std::vector<std::uint8_t> differs(blocks, 0);
    tbb::parallel_for(std::size_t{0}, blocks, [&](std::size_t k) {
      const std::size_t at = k * block;
      const std::size_t n = std::min(block, now.size() - at);
      differs[k] = std::memcmp(now.data() + at, before.data() + at, n) != 0 ? 1 : 0;
    });
    std::uint64_t changed_bytes = 0;
    for (std::size_t k = 0; k < blocks; ++k) {
      if (!differs[k]) continue;
      changed_bytes += std::min(block, now.size() - k * block);
      if (!t.changed.empty() && t.changed.back().first + t.changed.back().second == k)
        ++t.changed.back().second;
      else
        t.changed.emplace_back(k, 1);
    }
    // The changed elements, where that is smaller: values that changed scattered over every
    // block (an RL step that moves 1-2 % of the bf16 values) touch every block.
    const std::size_t element = dtype_bits(t.dtype) / 8;
    std::uint64_t sparse_bytes = UINT64_MAX;
    std::vector<std::vector<std::uint32_t>> found;  // by block: the indices of changed elements
    std::uint64_t found_count = 0;
    if (changed_bytes > 0 && dtype_bits(t.dtype) % 8 == 0 && element > 0 && block % element == 0 &&
        now.size() / element <= UINT32_MAX) {
      found.resize(blocks);
      // The index is only worth it up to half the tensor's bytes: past that many entries (a
      // step that moved most values), stop collecting, so that the search holds at most that.
      const std::uint64_t most = now.size() / (2 * (4 + element));
      std::atomic<std::uint64_t> collected{0};
      std::atomic<bool> too_many{false};
      tbb::parallel_for(std::size_t{0}, blocks, [&](std::size_t k) {
        if (!differs[k] || too_many.load(std::memory_order_relaxed)) return;
        const std::size_t end = std::min(block, now.size() - k * block);
        detail::for_each_changed(
            now.subspan(k * block, end), before.subspan(k * block, end), element,
            [&](std::size_t at) { found[k].push_back(static_cast<std::uint32_t>((k * block + at) / element)); });
        if (collected.fetch_add(found[k].size()) + found[k].size() > most) {
          too_many = true;
          std::vector<std::uint32_t>().swap(found[k]);
        }
      });
      if (too_many) {
        found.clear();
      } else {
        for (const auto& f : found) found_count += f.size();
        sparse_bytes = found_count * (4 + element);
      }
    }
    // Reconstructing copies the base's bytes as well: past half, reading it whole is cheaper.
    const bool by_blocks = changed_bytes * 2 <= now.size() && changed_bytes <= sparse_bytes;
    const bool by_elements = !by_blocks && sparse_bytes * 2 <= now.size();
    t.delta = by_blocks || by_elements;
    if (!by_blocks) t.changed.clear();
    if (!t.delta && state_->options.xor_deltas && changed_bytes > 0 && dtype_bits(t.dtype) % 8 == 0 && element > 0) {
      // Most values moved (the drift of an RL step): their XOR with the base, in byte planes,
      // compressed, where that is at most half the bytes.
      std::vector<std::byte> encoded = detail::encode_xor_planes(now, before, element);
      if (encoded.size() * 2 <= now.size()) {
        t.delta = true;
        t.xor_planes = true;
        t.encoded_bytes = encoded.size();
        p.encoded[i] = std::move(encoded);
      }
    }
    if (!by_elements) continue;
    t.sparse = true;
    t.elements = found_count;
    std::vector<std::byte>& out = p.encoded[i];
    out.resize(static_cast<std::size_t>(sparse_bytes));
    std::byte* indices = out.data();
    std::byte* values = out.data() + t.elements * 4;
    std::vector<std::uint64_t>& first = t.block_first;  // each block's first slot
    first.assign(blocks + 1, 0);
    for (std::size_t k = 0; k < blocks; ++k) first[k + 1] = first[k] + found[k].size();
    tbb::parallel_for(std::size_t{0}, blocks, [&](std::size_t k) {
      std::uint64_t slot = first[k];
      for (const std::uint32_t index : found[k]) {
        std::memcpy(indices + slot * 4, &index, 4);
        std::memcpy(values + slot * element, now.data() + std::uint64_t{index} * element, element);
        ++slot;
      }
    });
  }
}

Publication Publisher::publish(std::string version, std::string base, std::vector<PublishedTensor> tensors) {
  if (version.empty()) throw Error(errc::invalid_argument, {}, "a version needs a non-empty tag");
  auto p = std::make_shared<detail::PublicationState>();
  p->manifest.version = version;
  p->manifest.base = std::move(base);
  std::set<std::string> names;
  for (PublishedTensor& t : tensors) {
    if (!names.insert(t.name).second)
      throw Error(errc::invalid_argument, {.tensor = t.name},
                  fmt::format("version {}: a tensor given twice", printable(version)));
    const std::optional<std::uint64_t> elements = checked_element_count(t.shape);
    const std::optional<std::uint64_t> expected = elements ? checked_byte_size(*elements, t.dtype) : std::nullopt;
    const bool staged = static_cast<bool>(t.copy_out);
    if (staged && !t.bytes.empty())
      throw Error(errc::invalid_argument, {.tensor = t.name},
                  fmt::format("version {}: both bytes and copy_out given", printable(version)));
    // value_or, not *expected below: GCC 12 sees the optional as maybe uninitialized there.
    const std::uint64_t nbytes = expected.value_or(std::numeric_limits<std::uint64_t>::max());
    if (!expected || (!staged && nbytes != t.bytes.size()))
      throw Error(errc::invalid_argument, {.tensor = t.name},
                  fmt::format("version {}: {} bytes for {} [{}] ({} expected)", printable(version), t.bytes.size(),
                              dtype_name(t.dtype), fmt::join(t.shape, ", "), expected ? nbytes : 0));
    p->manifest.tensors.push_back(
        {.name = t.name, .dtype = t.dtype, .shape = t.shape, .nbytes = nbytes, .staged = staged});
    p->memory.push_back(t.bytes);
    p->copy_out.push_back(std::move(t.copy_out));
  }
  p->encoded.resize(p->memory.size());
  mark_delta(*p, version);
  // The digests: of every selection subscribers asked for before, and of the whole tensor
  // where none was (or the whole was) — one hashing pass over the bytes they will read, in
  // parallel over tensors and selections.
  struct Job {
    std::size_t tensor;
    std::string selection;  // empty: the whole tensor
    std::string digest{};
  };
  std::vector<Job> jobs;
  {
    std::lock_guard lock(state_->mutex);
    for (std::size_t i = 0; i < p->manifest.tensors.size(); ++i) {
      auto it = state_->asked.find(p->manifest.tensors[i].name);
      const bool whole = it == state_->asked.end() || it->second.contains(Selection::all().to_string());
      if (whole) jobs.push_back({i, {}});
      if (it != state_->asked.end())
        for (const std::string& s : it->second)
          if (s != Selection::all().to_string()) jobs.push_back({i, s});
    }
  }
  tbb::parallel_for(std::size_t{0}, jobs.size(), [&](std::size_t k) {
    Job& job = jobs[k];
    const detail::ManifestTensor& t = p->manifest.tensors[job.tensor];
    const std::optional<Selection> selection =
        job.selection.empty() ? Selection::all() : Selection::parse(job.selection);
    if (selection && selection->check(t.shape).empty()) job.digest = detail::digest_of(*p, job.tensor, *selection);
  });
  for (Job& job : jobs) {
    detail::ManifestTensor& t = p->manifest.tensors[job.tensor];
    if (job.selection.empty())
      t.digest = std::move(job.digest);
    else if (!job.digest.empty())  // a selection this version's shape no longer admits is left out
      t.selection_digests.emplace_back(std::move(job.selection), std::move(job.digest));
  }
  {
    std::lock_guard lock(state_->mutex);
    for (auto& [id, other] : state_->publications)
      if (other->manifest.version == version && !other->withdrawn)
        throw Error(errc::invalid_argument, {}, fmt::format("version {} is already offered", printable(version)));
  }
  // One region per run of contiguous tensors (a trainer's flat buffer is one attachment).
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < p->memory.size(); ++i)
    if (!p->memory[i].empty()) order.push_back(i);
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return p->memory[a].data() < p->memory[b].data(); });
  std::vector<std::pair<const std::byte*, const std::byte*>> runs;
  for (std::size_t i : order) {
    const std::byte* begin = p->memory[i].data();
    const std::byte* end = begin + p->memory[i].size();
    if (!runs.empty() && begin <= runs.back().second)
      runs.back().second = std::max(runs.back().second, end);
    else
      runs.emplace_back(begin, end);
  }
  try {
    std::size_t next = 0;  // `order` is sorted, and each run holds the next tensors of it
    for (const auto& [begin, end] : runs) {
      const std::span<const std::byte> region(begin, static_cast<std::size_t>(end - begin));
      const MPI_Aint address = state_->attach(region, version);
      p->regions.push_back(region);
      for (; next < order.size() && p->memory[order[next]].data() < end; ++next)
        p->manifest.tensors[order[next]].address =
            static_cast<std::uint64_t>(address + (p->memory[order[next]].data() - begin));
    }
    for (std::size_t i = 0; i < p->encoded.size(); ++i) {
      if (p->encoded[i].empty()) continue;
      const std::span<const std::byte> region(p->encoded[i]);
      p->manifest.tensors[i].encoded_address = static_cast<std::uint64_t>(state_->attach(region, version));
      p->regions.push_back(region);
    }
  } catch (...) {
    for (std::span<const std::byte> r : p->regions) state_->release(r);
    throw;
  }
  std::lock_guard lock(state_->mutex);
  p->manifest.publication = state_->next_id++;
  state_->publications.emplace(p->manifest.publication, p);
  return Publication(state_, p);
}

}  // namespace eredu::mpi
