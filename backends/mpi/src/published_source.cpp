#include "eredu/mpi/published_source.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <type_traits>
#include <utility>

#include <fmt/format.h>
#include <asio/co_spawn.hpp>
#include <asio/use_awaitable.hpp>

#include "eredu/core/collective_error.hpp"
#include "eredu/core/detail/ignore_cancellation.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"
#include "eredu/core/printable.hpp"
#include "live/channel.hpp"
#include "live/element_width.hpp"
#include "live/reply_buffers.hpp"
#include "live/wire.hpp"
#include "live/xor_planes.hpp"
#include "progress.hpp"

namespace eredu::mpi {
namespace detail {

/// The share of a subscriber's budget that holds two-sided replies (SubscriberOptions::budget).
std::size_t reply_share(std::size_t budget) noexcept { return budget / 4; }

/// A reply's status and body, received into the subscriber's reply memory, which gets the
/// buffer back when the reply is dropped.
class Reply {
 public:
  /// No reply yet.
  Reply() = default;
  /// `body`, from `owner` (nullptr: an empty body, from nowhere).
  Reply(ReplyStatus status, MessageBuffer body, ReplyBuffers* owner) noexcept
      : status_(status), body_(std::move(body)), owner_(owner) {}
  Reply(Reply&& other) noexcept
      : status_(other.status_), body_(std::move(other.body_)), owner_(std::exchange(other.owner_, nullptr)) {}
  Reply& operator=(Reply&& other) noexcept {
    if (this != &other) {
      give_back();
      status_ = other.status_;
      body_ = std::move(other.body_);
      owner_ = std::exchange(other.owner_, nullptr);
    }
    return *this;
  }
  ~Reply() { give_back(); }

  /// What the publisher answered.
  ReplyStatus status() const noexcept { return status_; }
  /// The reply's body.
  std::span<const std::byte> bytes() const noexcept { return body_.bytes(); }

 private:
  void give_back() noexcept {
    if (owner_ != nullptr) std::exchange(owner_, nullptr)->release(std::move(body_));
  }
  ReplyStatus status_ = ReplyStatus::ok;
  MessageBuffer body_;
  ReplyBuffers* owner_ = nullptr;
};

struct SubscriberState {
  SubscriberState(std::shared_ptr<CommState> c, int p, asio::any_io_executor e, SubscriberOptions o)
      : comm(c),
        publisher(p),
        executor(std::move(e)),
        options(o),
        window(o.transport == LiveTransport::one_sided ? std::make_unique<LiveWindow>(std::move(c), true) : nullptr) {}

  std::shared_ptr<CommState> comm;
  int publisher;
  asio::any_io_executor executor;
  SubscriberOptions options;
  std::unique_ptr<LiveWindow> window;  ///< none under LiveTransport::two_sided
  std::atomic<std::uint64_t> sequence{0};
  /// Reply buffers, shared by the versions it opens: kept from one version to the next.
  ReplyBuffers replies{reply_share(options.budget)};
  /// Leases, streamed chunks and deltas' encodings: the rest of the budget, shared by the
  /// versions it opens, so two versions loading at once stage no more than one.
  io::LeasePool pool{
      executor, io::LeasePoolOptions{
                    .budget = options.budget - reply_share(options.budget), .huge_pages = false, .prefault = false}};

  /// The location errors name.
  std::string location(const std::string& version) const {
    return fmt::format("mpi://{}/rank{}/{}", comm->name, publisher, version);
  }

  std::vector<std::byte> head(RequestKind kind, int reply_tag, std::uint64_t publication) const {
    WireWriter w;
    w.u32(static_cast<std::uint32_t>(kind));
    w.u32(static_cast<std::uint32_t>(comm->rank));
    w.u32(static_cast<std::uint32_t>(reply_tag));
    w.u64(publication);
    w.u64(replies.budget());
    return std::move(w.bytes());
  }

  /// Sends a request and waits for its reply. Every reply is received into the reply memory
  /// (a quarter of the budget), so a publisher cannot make a subscriber take more: `read`, the
  /// reply to a read of `asked` bytes, which must announce at most that; any other (a
  /// manifest, digests, a refusal's text) at most the reply memory.
  ///
  /// The caller's cancellation does not reach the exchange once it starts: a reply announced is
  /// received whole, or its receive times out. A reply the subscriber never received would hold
  /// the publisher's send until PublisherOptions::reply_timeout, which then leaves the
  /// publisher's group unusable; a load that gives up on its other reads (one read failed) or
  /// is cancelled would do that. The caller waits for at most one reply more.
  asio::awaitable<Reply> request(RequestKind kind, std::uint64_t publication, std::vector<std::byte> body,
                                 bool read = false, std::uint64_t asked = 0) {
    co_return co_await asio::co_spawn(executor, exchange(kind, publication, std::move(body), read, asked),
                                      eredu::detail::use_awaitable_ignoring_cancellation());
  }

  /// request's exchange, in a coroutine of its own that no cancellation reaches.
  asio::awaitable<Reply> exchange(RequestKind kind, std::uint64_t publication, std::vector<std::byte> body, bool read,
                                  std::uint64_t asked) {
    const int tag = reply_tag_base + 2 * static_cast<int>(sequence.fetch_add(1) % reply_tags);
    std::vector<std::byte> message = head(kind, tag, publication);
    message.insert(message.end(), body.begin(), body.end());
    if (message.size() > max_request_bytes)
      throw Error(errc::invalid_argument, {}, "a live-update request larger than the publisher receives");
    auto [header, header_done] =
        receive_message(comm, publisher, tag, reply_header_bytes, "the publisher's reply", options.timeout, false);
    Completion sent =
        send_message(comm, publisher, request_tag, std::make_shared<const std::vector<std::byte>>(std::move(message)),
                     "a request to the publisher", options.timeout, true);
    co_await sent.async_wait(asio::use_awaitable);
    co_await header_done.async_wait(asio::use_awaitable);
    WireReader r(header->buffer.bytes(), "reply header");
    const auto status = static_cast<ReplyStatus>(r.u32());
    r.u32();
    const std::uint64_t size = r.u64();
    if (size == 0) co_return Reply(status, MessageBuffer{}, nullptr);
    // Checked before any memory is taken.
    if (read && status == ReplyStatus::ok && size > asked)
      throw Error(
          errc::incomplete_data, {},
          fmt::format("the publisher (rank {}) announced {} bytes where {} were asked", publisher, size, asked));
    if (size > replies.budget() || size > (std::uint64_t{1} << 31))
      throw Error(errc::exceeds_budget, {},
                  fmt::format("the publisher (rank {}) announced a reply of {} bytes, more than the {} bytes of reply "
                              "memory (a quarter of SubscriberOptions::budget; at most 2 GiB)",
                              publisher, size, replies.budget()));
    MessageBuffer buffer = co_await replies.acquire(static_cast<std::size_t>(size));
    const std::size_t capacity = buffer.capacity();
    try {
      auto [rx, done] =
          receive_message(comm, publisher, tag + 1, std::move(buffer), "the publisher's reply", options.timeout, false);
      co_await done.async_wait(asio::use_awaitable);
      co_return Reply(status, std::move(rx->buffer), &replies);
    } catch (...) {
      replies.lose(capacity);  // the receive owns it, and MPI may still write it
      throw;
    }
  }

  /// Throws the error a non-ok reply stands for.
  void check(ReplyStatus status, std::span<const std::byte> body, const std::string& version) const {
    if (status == ReplyStatus::ok) return;
    std::string detail;
    try {
      WireReader r(body, "reply");
      detail = r.str();
    } catch (const std::exception&) {}
    const std::string where = location(version.empty() ? "(newest)" : version);
    switch (status) {
      case ReplyStatus::not_published:
        throw Error(errc::version_not_published, {.file = where},
                    fmt::format("the publisher (rank {}) offers no such version: {}", publisher, printable(detail)));
      case ReplyStatus::withdrawn:
        throw Error(errc::version_withdrawn, {.file = where},
                    fmt::format("the publisher (rank {}) withdrew version {}", publisher, printable(detail)));
      case ReplyStatus::too_large:
        throw Error(errc::exceeds_budget, {.file = where},
                    fmt::format("the publisher (rank {}) has more to send than this subscriber's reply memory, a "
                                "quarter of SubscriberOptions::budget, holds: {}",
                                publisher, printable(detail)));
      case ReplyStatus::failed:
        throw BackendError(
            errc::backend_failure, {.file = where},
            fmt::format("the publisher (rank {}) could not copy out its memory: {}", publisher, printable(detail)));
      default:
        throw Error(errc::invalid_argument, {.file = where},
                    fmt::format("the publisher (rank {}) refused the request: {}", publisher, printable(detail)));
    }
  }

  /// Rethrows the failure in flight with the location and tensor in its context.
  [[noreturn]] void rethrow_located(const std::string& version, const std::string& tensor) const {
    try {
      throw;
    } catch (const CollectiveError& e) {
      if (!e.context().file.empty()) throw;
      CollectiveContext c = e.collective();
      c.where.file = location(version);
      c.where.tensor = tensor;
      throw CollectiveError(e.kind(), std::move(c),
                            fmt::format("reading from the publisher (rank {}): {}", publisher, e.detail()));
    }
  }
};

}  // namespace detail

// --- Subscriber ---

Subscriber::Subscriber(Communicator& group, int publisher, asio::any_io_executor executor, SubscriberOptions options) {
  if (!group.valid()) throw Error(errc::invalid_argument, {}, "a subscriber needs a communicator");
  if (publisher < 0 || publisher >= group.size() || publisher == group.rank())
    throw Error(errc::invalid_argument, {},
                fmt::format("publisher rank {} is not another rank of group '{}' ({} ranks)", publisher, group.name(),
                            group.size()));
  if (options.part_size == 0 || options.part_size > (std::size_t{1} << 30) || options.timeout.count() <= 0)
    throw Error(errc::invalid_argument, {}, "subscriber options: part_size must be 1 B..1 GiB and timeout positive");
  if (options.budget > io::LeasePool::max_budget || options.part_size > detail::reply_share(options.budget))
    throw Error(errc::invalid_argument, {},
                fmt::format("subscriber options: part_size ({} bytes) must be at most a quarter of budget ({} bytes), "
                            "the share that holds replies, and budget at most {} bytes",
                            options.part_size, options.budget, io::LeasePool::max_budget));
  state_ = std::make_shared<detail::SubscriberState>(group.state(), publisher, std::move(executor), options);
}

Subscriber::~Subscriber() = default;

int Subscriber::publisher() const noexcept { return state_->publisher; }

const asio::any_io_executor& Subscriber::executor() const noexcept { return state_->executor; }

asio::awaitable<std::unique_ptr<PublishedSource>> Subscriber::open(std::string version) {
  std::shared_ptr<detail::SubscriberState> s = state_;
  detail::WireWriter body;
  body.str(version);
  detail::Reply reply;
  try {
    reply = co_await s->request(detail::RequestKind::open, 0, std::move(body.bytes()));
  } catch (...) {
    s->rethrow_located(version.empty() ? "(newest)" : version, {});
  }
  s->check(reply.status(), reply.bytes(), version);
  detail::Manifest manifest = detail::decode_manifest(reply.bytes());
  co_return std::make_unique<PublishedSource>(s, std::move(manifest));
}

// --- PublishedSource ---

PublishedSource::PublishedSource(std::shared_ptr<detail::SubscriberState> subscriber, detail::Manifest manifest)
    : subscriber_(std::move(subscriber)),
      manifest_(std::make_unique<detail::Manifest>(std::move(manifest))),
      location_(subscriber_->location(manifest_->version)),
      pool_(subscriber_->pool) {
  catalog_.add_file(io::CheckpointFile{.path = location_, .format = "published"});
  std::uint64_t offset = 0;  // a catalog offset per tensor: where it lies in the version, for messages
  for (const detail::ManifestTensor& t : manifest_->tensors) {
    catalog_.add_tensor(io::TensorInfo{
        .name = t.name, .dtype = t.dtype, .shape = t.shape, .file = 0, .offset = offset, .nbytes = t.nbytes});
    offset += t.nbytes;
  }
}

PublishedSource::~PublishedSource() { finish(false); }

std::size_t PublishedSource::staging_high_water() const {
  return pool_.high_water() + subscriber_->replies.high_water();
}

const std::string& PublishedSource::version() const noexcept { return manifest_->version; }
const std::string& PublishedSource::base() const noexcept { return manifest_->base; }
std::string PublishedSource::base_location() const {
  return manifest_->base.empty() ? std::string{} : subscriber_->location(manifest_->base);
}
const asio::any_io_executor& PublishedSource::get_executor() const noexcept { return subscriber_->executor; }

io::SourceCapabilities PublishedSource::capabilities() const {
  return {.request_bytes = subscriber_->options.part_size, .concurrency = 16};
}

std::pair<const io::TensorInfo*, std::vector<ByteRun>> PublishedSource::runs_of(
    const io::TensorReadRequest& request) const {
  const io::TensorInfo& t = catalog_.at(request.key);
  if (auto why = request.selection.check(t.shape); !why.empty())
    throw Error(errc::invalid_selection, {.file = location_, .tensor = t.name}, why);
  return {&t, selection_runs(t.shape, t.dtype, request.selection)};
}

std::uint64_t PublishedSource::selected_bytes(const io::TensorReadRequest& request) const {
  std::uint64_t total = 0;
  for (const ByteRun& r : runs_of(request).second) total += r.length;
  return total;
}

std::optional<io::MappedTensor> PublishedSource::map_tensor(const io::TensorReadRequest& request) const {
  selected_bytes(request);
  return std::nullopt;
}
std::optional<io::MappedView> PublishedSource::map_resident(const io::TensorReadRequest& request) const {
  selected_bytes(request);
  return std::nullopt;
}
std::optional<io::DirectWindow> PublishedSource::direct_window(const io::TensorReadRequest& request) const {
  selected_bytes(request);
  return std::nullopt;
}

asio::awaitable<void> PublishedSource::no_window(std::string key) {
  throw Error(errc::invalid_argument, {.file = location_, .tensor = key}, "a published version has no direct windows");
  co_return;
}

namespace {

/// The part [from, from + size) of the selection `runs` (destination offsets from `from`).
std::vector<ByteRun> slice_runs(const std::vector<ByteRun>& runs, std::uint64_t from, std::uint64_t size) {
  std::vector<ByteRun> out;
  for (const ByteRun& r : runs) {
    const std::uint64_t lo = std::max(from, r.dest_offset);
    const std::uint64_t hi = std::min(from + size, r.dest_offset + r.length);
    if (lo >= hi) continue;
    out.push_back(
        ByteRun{.source_offset = r.source_offset + (lo - r.dest_offset), .dest_offset = lo - from, .length = hi - lo});
  }
  return out;
}

/// The pieces of `runs` (destination offsets relative to the output) that lie in `changed`
/// blocks of `block` bytes of a tensor of `nbytes`, each at most `part` bytes.
std::vector<ByteRun> changed_pieces(const std::vector<ByteRun>& runs,
                                    const std::vector<std::pair<std::uint64_t, std::uint64_t>>& changed,
                                    std::uint64_t block, std::uint64_t nbytes, std::uint64_t part) {
  std::vector<ByteRun> out;
  for (const ByteRun& r : runs) {
    // The first changed range that ends after the run starts.
    auto it = std::upper_bound(changed.begin(), changed.end(), r.source_offset,
                               [&](std::uint64_t at, const auto& c) { return at < (c.first + c.second) * block; });
    for (; it != changed.end() && it->first * block < r.source_offset + r.length; ++it) {
      const std::uint64_t lo = std::max(r.source_offset, it->first * block);
      const std::uint64_t hi = std::min({r.source_offset + r.length, (it->first + it->second) * block, nbytes});
      for (std::uint64_t at = lo; at < hi; at += part)
        out.push_back(ByteRun{.source_offset = at,
                              .dest_offset = r.dest_offset + (at - r.source_offset),
                              .length = std::min(part, hi - at)});
    }
  }
  return out;
}

}  // namespace

asio::awaitable<void> PublishedSource::request_runs(const io::TensorInfo& t, std::uint64_t address,
                                                    std::vector<ByteRun> runs, std::span<std::byte> out,
                                                    std::uint64_t size) {
  // A staged tensor is named by its index; attached memory by its address.
  const std::size_t index = index_of(t);
  const bool staged = manifest_->tensors[index].staged;
  detail::WireWriter body;
  body.u64(staged ? index : address);
  body.u64(runs.size());
  for (const ByteRun& r : runs) {
    body.u64(r.source_offset);
    body.u64(r.length);
  }
  const std::string where = subscriber_->location(manifest_->version);
  detail::Reply answer;
  try {
    answer = co_await subscriber_->request(staged ? detail::RequestKind::read_staged : detail::RequestKind::read,
                                           manifest_->publication, std::move(body.bytes()), true, size);
  } catch (const Error& e) {  // a reply announced larger than the part, or than the reply memory
    if ((e.kind() != errc::incomplete_data && e.kind() != errc::exceeds_budget) || !e.context().file.empty()) throw;
    throw Error(e.kind(), {.file = where, .tensor = t.name, .offset = runs.front().source_offset},
                fmt::format("{}, for the part at offset {}", e.detail(), runs.front().source_offset));
  }
  const std::span<const std::byte> bytes = answer.bytes();
  try {
    subscriber_->check(answer.status(), bytes, manifest_->version);
  } catch (const BackendError& e) {  // the publisher's copy of a staged tensor failed
    throw BackendError(e.kind(), {.file = e.context().file, .tensor = t.name, .offset = runs.front().source_offset},
                       e.detail());
  } catch (const Error& e) {  // a part the publisher refused as larger than the reply memory
    if (e.kind() != errc::exceeds_budget) throw;
    throw Error(e.kind(), {.file = e.context().file, .tensor = t.name, .offset = runs.front().source_offset},
                e.detail());
  }
  if (bytes.size() != size)
    throw Error(errc::incomplete_data, {.file = where, .tensor = t.name, .offset = runs.front().source_offset},
                fmt::format("the publisher (rank {}) sent {} bytes where {} were asked, for the part at offset {}",
                            subscriber_->publisher, bytes.size(), size, runs.front().source_offset));
  std::size_t at = 0;
  for (const ByteRun& r : runs) {
    std::memcpy(out.data() + r.dest_offset, bytes.data() + at, r.length);
    at += r.length;
  }
}

asio::awaitable<void> PublishedSource::read_runs(const io::TensorInfo& t, std::uint64_t address,
                                                 std::vector<ByteRun> runs, std::span<std::byte> out) {
  const std::size_t part = subscriber_->options.part_size;
  std::vector<Completion> parts;
  std::exception_ptr failure;
  try {
    // One MPI_Rget per part of at most `part` bytes (no run is longer).
    for (std::size_t first = 0; first < runs.size();) {
      std::size_t last = first;
      std::uint64_t size = 0;
      while (last < runs.size() && (last == first || size + runs[last].length <= part)) size += runs[last++].length;
      // Relative to the part's first destination byte: a whole selection's part is then packed.
      std::vector<ByteRun> group(runs.begin() + static_cast<std::ptrdiff_t>(first),
                                 runs.begin() + static_cast<std::ptrdiff_t>(last));
      const std::uint64_t lo = group.front().dest_offset;
      std::uint64_t hi = lo;
      for (ByteRun& r : group) {
        hi = std::max(hi, r.dest_offset + r.length);
        r.dest_offset -= lo;
      }
      transferred_ += size;
      if (!subscriber_->window || manifest_->tensors[index_of(t)].staged) {
        // One request at a time, awaited here: a request spawned apart could outlive this
        // source when the load gives up on it (ASan saw one).
        co_await request_runs(t, address, std::move(group), out.subspan(lo, hi - lo), size);
        first = last;
        continue;
      }
      parts.push_back(subscriber_->window->read(subscriber_->publisher, static_cast<MPI_Aint>(address),
                                                std::move(group), out.subspan(lo, hi - lo),
                                                fmt::format("the read of {} bytes of {} from version {}", size,
                                                            printable(t.name), printable(manifest_->version)),
                                                subscriber_->options.timeout));
      first = last;
    }
    for (const Completion& c : parts) co_await c.async_wait(asio::use_awaitable);
  } catch (...) {
    failure = std::current_exception();
  }
  if (failure) {
    // No part may still write into `out` once this returns.
    for (const Completion& c : parts) {
      try {
        co_await c.async_wait(asio::use_awaitable);
      } catch (...) {  // the first failure is the one reported
      }
    }
    try {
      std::rethrow_exception(failure);
    } catch (...) {
      subscriber_->rethrow_located(manifest_->version, t.name);
    }
  }
}

asio::awaitable<void> PublishedSource::fetch(const io::TensorReadRequest& request, const io::TensorInfo& t,
                                             const std::vector<ByteRun>& runs, std::uint64_t from,
                                             std::span<std::byte> out, std::optional<std::span<std::byte>> staging) {
  const detail::ManifestTensor& m = manifest_->tensors[index_of(t)];
  const std::size_t part = subscriber_->options.part_size;
  const std::vector<ByteRun> wanted = slice_runs(runs, from, out.size());
  bool done = false;
  if (m.delta && base_bytes_ && base_bytes_(request, from, out)) {
    // The base's bytes are in place: read what changed over them.
    if (m.sparse) {
      done = co_await apply_sparse(t, wanted, out, staging);
    } else if (m.xor_planes) {
      done = co_await apply_xor(t, wanted, out, staging);
    } else {
      co_await read_runs(t, m.address, changed_pieces(wanted, m.changed, manifest_->delta_block, m.nbytes, part), out);
      done = true;
    }
  }
  if (!done) {
    std::vector<ByteRun> pieces;
    for (const ByteRun& r : wanted)
      for (std::uint64_t at = 0; at < r.length; at += part)
        pieces.push_back(ByteRun{.source_offset = r.source_offset + at,
                                 .dest_offset = r.dest_offset + at,
                                 .length = std::min<std::uint64_t>(part, r.length - at)});
    co_await read_runs(t, m.address, std::move(pieces), out);
  }
  if (corrupt_at_ && *corrupt_at_ < out.size()) {
    out[*corrupt_at_] ^= std::byte{1};
    corrupt_at_.reset();
  }
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> PublishedSource::sparse_slots(const io::TensorInfo& t,
                                                                                   std::vector<ByteRun>& wanted) const {
  const detail::ManifestTensor& m = manifest_->tensors[index_of(t)];
  const std::uint64_t block = manifest_->delta_block;
  std::sort(wanted.begin(), wanted.end(),
            [](const ByteRun& a, const ByteRun& b) { return a.source_offset < b.source_offset; });
  std::vector<std::pair<std::uint64_t, std::uint64_t>> slots;
  for (const ByteRun& r : wanted) {
    if (r.length == 0) continue;
    if (r.source_offset > m.nbytes || r.length > m.nbytes - r.source_offset)
      throw Error(errc::invalid_argument, {.file = location_, .tensor = t.name},
                  fmt::format("a read of bytes [{}, {}) past the tensor's {}", r.source_offset,
                              r.source_offset + r.length, m.nbytes));
    const std::uint64_t first = m.block_first[static_cast<std::size_t>(r.source_offset / block)];
    const std::uint64_t last = m.block_first[static_cast<std::size_t>((r.source_offset + r.length - 1) / block + 1)];
    if (first == last) continue;
    if (!slots.empty() && first <= slots.back().second)
      slots.back().second = std::max(slots.back().second, last);
    else
      slots.emplace_back(first, last);
  }
  return slots;
}

std::uint64_t PublishedSource::delta_staging(const io::TensorInfo& t, std::vector<ByteRun> wanted) const {
  const detail::ManifestTensor& m = manifest_->tensors[index_of(t)];
  if (!m.delta || !base_bytes_) return 0;
  if (m.xor_planes) return m.encoded_bytes + std::min<std::uint64_t>(detail::xor_chunk_bytes, m.nbytes);
  if (!m.sparse) return 0;
  std::uint64_t count = 0;
  for (const auto& s : sparse_slots(t, wanted)) count += s.second - s.first;
  return count * (4 + dtype_bits(m.dtype) / 8);
}

asio::awaitable<bool> PublishedSource::apply_sparse(const io::TensorInfo& t, std::vector<ByteRun> wanted,
                                                    std::span<std::byte> out,
                                                    std::optional<std::span<std::byte>> staging) {
  const detail::ManifestTensor& m = manifest_->tensors[index_of(t)];
  const std::uint64_t element = dtype_bits(m.dtype) / 8;
  // The entries of the blocks this read touches: a row shard, or one chunk of a streamed
  // tensor, reads only its own.
  const std::vector<std::pair<std::uint64_t, std::uint64_t>> slots = sparse_slots(t, wanted);
  std::uint64_t count = 0;
  for (const auto& s : slots) count += s.second - s.first;
  if (count == 0) co_return true;
  const std::uint64_t size = count * (4 + element);
  io::StagingBuffer encoded;
  std::span<std::byte> in;
  if (staging) {  // reserved with the caller's lease: too small, and it is read whole
    if (staging->size() < size) co_return false;
    in = staging->first(static_cast<std::size_t>(size));
  } else {
    if (io::LeasePool::block_size(size) > pool_.budget()) co_return false;  // read it whole instead
    encoded = co_await pool_.async_acquire(static_cast<std::size_t>(size), asio::use_awaitable);
    in = std::span(encoded.data(), static_cast<std::size_t>(size));
  }
  // Their indices, packed, then their values, packed (the publication holds every index, then
  // every value), in parts of at most part_size: two passes, as read_runs packs destinations in
  // ascending order.
  const std::uint64_t part = subscriber_->options.part_size;
  std::vector<ByteRun> pieces;
  const auto add = [&](std::uint64_t from, std::uint64_t to, std::uint64_t length) {
    for (std::uint64_t at = 0; at < length; at += part)
      pieces.push_back(
          ByteRun{.source_offset = from + at, .dest_offset = to + at, .length = std::min(part, length - at)});
  };
  std::uint64_t packed = 0;
  for (const auto& s : slots) {
    add(s.first * 4, packed * 4, (s.second - s.first) * 4);
    packed += s.second - s.first;
  }
  packed = 0;
  for (const auto& s : slots) {
    add(m.elements * 4 + s.first * element, count * 4 + packed * element, (s.second - s.first) * element);
    packed += s.second - s.first;
  }
  co_await read_runs(t, m.encoded_address, std::move(pieces), in);
  const std::byte* const indices = in.data();
  const std::byte* const values = in.data() + count * 4;
  const auto index_at = [indices](std::uint64_t k) {
    std::uint32_t index = 0;
    std::memcpy(&index, indices + k * 4, 4);
    return std::uint64_t{index};
  };
  std::uint64_t most = 0;  // one pass, vectorised: every entry must name an element of the tensor
  for (std::uint64_t k = 0; k < count; ++k) most = std::max(most, index_at(k));
  if ((most + 1) * element > m.nbytes)
    throw Error(errc::invalid_argument, {.file = location_, .tensor = t.name},
                fmt::format("the publisher's delta names element {}, past the tensor's end", most));
  // The entries ascend, as the runs do (sorted above): walk both once. An element's copy has a
  // size known at compile time for the usual widths (13.8 million entries took 0.34-0.38 s
  // with a run search and a memcpy of run-time size per entry). Entries out of order are
  // skipped, and the digest check then refuses the tensor.
  const auto scatter = [&]<std::size_t E>(std::integral_constant<std::size_t, E>) {
    const std::uint64_t width = E != 0 ? E : element;
    std::uint64_t k = 0;  // the first entry that may reach the current run
    for (const ByteRun& w : wanted) {
      const std::uint64_t lo = w.source_offset, hi = w.source_offset + w.length;
      while (k < count && index_at(k) * width + width <= lo) ++k;
      for (std::uint64_t j = k; j < count; ++j) {
        const std::uint64_t at = index_at(j) * width;
        if (at >= hi) break;
        if (at >= lo && at + width <= hi) {
          std::memcpy(out.data() + w.dest_offset + (at - lo), values + j * width, width);
        } else {  // an element the run's ends cut: its bytes inside the run
          const std::uint64_t from = std::max(at, lo), to = std::min(at + width, hi);
          if (from < to)
            std::memcpy(out.data() + w.dest_offset + (from - lo), values + j * width + (from - at), to - from);
        }
      }
    }
  };
  detail::with_element_width(element, scatter);
  co_return true;
}

asio::awaitable<bool> PublishedSource::apply_xor(const io::TensorInfo& t, std::vector<ByteRun> wanted,
                                                 std::span<std::byte> out,
                                                 std::optional<std::span<std::byte>> staging) {
  const detail::ManifestTensor& m = manifest_->tensors[index_of(t)];
  const std::uint64_t size = m.encoded_bytes;
  const std::size_t element = dtype_bits(m.dtype) / 8;
  // The whole encoded delta (both shards' chunks: a chunk is a frame, and the table comes
  // first), and room to decompress one chunk.
  const std::uint64_t chunk = std::min<std::uint64_t>(detail::xor_chunk_bytes, m.nbytes);
  const std::uint64_t staged = size + chunk;
  io::StagingBuffer buffer;
  std::byte* memory = nullptr;
  if (staging) {  // reserved with the caller's lease: too small, and it is read whole
    if (staging->size() < staged) co_return false;
    memory = staging->data();
  } else {
    if (io::LeasePool::block_size(staged) > pool_.budget()) co_return false;  // read it whole instead
    buffer = co_await pool_.async_acquire(static_cast<std::size_t>(staged), asio::use_awaitable);
    memory = buffer.data();
  }
  const std::span<std::byte> in(memory, static_cast<std::size_t>(size));
  const std::span<std::byte> planes(memory + size, static_cast<std::size_t>(chunk));
  const std::uint64_t part = subscriber_->options.part_size;
  std::vector<ByteRun> pieces;
  for (std::uint64_t at = 0; at < size; at += part)
    pieces.push_back(ByteRun{.source_offset = at, .dest_offset = at, .length = std::min(part, size - at)});
  co_await read_runs(t, m.encoded_address, std::move(pieces), in);
  const detail::XorPlanes delta(in, m.nbytes, element, location_, t.name);
  if (delta.chunk_bytes() > detail::xor_chunk_bytes)
    throw Error(errc::checksum_mismatch, {.file = location_, .tensor = t.name},
                fmt::format("the XOR delta of {} has chunks of {} bytes, more than {}", printable(t.name),
                            delta.chunk_bytes(), detail::xor_chunk_bytes));
  // XorPlanes::decompress refuses a chunk that does not fit `planes`: a chunk is at most
  // min(chunk_bytes, nbytes) bytes.
  // Only the chunks this selection touches, each decompressed once.
  std::sort(wanted.begin(), wanted.end(),
            [](const ByteRun& a, const ByteRun& b) { return a.source_offset < b.source_offset; });
  std::size_t decompressed = delta.chunks();  // none yet
  for (const ByteRun& r : wanted) {
    for (std::uint64_t at = r.source_offset; at < r.source_offset + r.length;) {
      const std::size_t c = static_cast<std::size_t>(at / delta.chunk_bytes());
      const std::uint64_t end = std::min(r.source_offset + r.length, (c + 1) * delta.chunk_bytes());
      if (c != decompressed) {
        delta.decompress(c, planes);
        decompressed = c;
      }
      delta.apply(c, planes, at, out.subspan(r.dest_offset + (at - r.source_offset), end - at));
      at = end;
    }
  }
  co_return true;
}

bool PublishedSource::use_base(const std::string& base, BaseBytes bytes) {
  const bool delta = manifest_->delta_block != 0 && !base.empty() && base == manifest_->base && bytes &&
                     std::any_of(manifest_->tensors.begin(), manifest_->tensors.end(),
                                 [](const detail::ManifestTensor& t) { return t.delta; });
  base_bytes_ = delta ? std::move(bytes) : BaseBytes{};
  return delta;
}

BaseBytes base_from_parameters(const engine::WeightBindingPlan& plan,
                               std::function<std::span<const std::byte>(const std::string& parameter)> parameter) {
  auto by_selection = std::make_shared<std::map<std::pair<std::string, std::string>, std::string>>();
  for (const engine::WeightBinding* owner : plan.owners())
    if (owner->recipe() == nullptr)
      by_selection->emplace(std::pair{owner->checkpoint_key(), owner->selection().to_string()}, owner->name());
  return [by_selection, parameter = std::move(parameter)](const io::TensorReadRequest& request, std::uint64_t from,
                                                          std::span<std::byte> out) {
    const auto it = by_selection->find({request.key, request.selection.to_string()});
    if (it == by_selection->end()) return false;
    const std::span<const std::byte> held = parameter(it->second);
    if (from > held.size() || out.size() > held.size() - from) return false;
    std::memcpy(out.data(), held.data() + from, out.size());
    return true;
  };
}

asio::awaitable<io::Lease> PublishedSource::lease_of(const io::TensorReadRequest& request, const io::TensorInfo& t,
                                                     const std::vector<ByteRun>& runs, std::uint64_t from,
                                                     std::size_t size, std::uint64_t total) {
  const std::size_t block = io::LeasePool::block_size(size);
  if (block > pool_.budget())
    throw Error(errc::exceeds_budget, {.file = location_, .tensor = t.name},
                fmt::format("{} bytes are more than the staging budget ({} bytes): stream it", size, pool_.budget()));
  // A delta read over the base's bytes stages what it reads (changed values, or an XOR) besides
  // the lease. Both come in one acquisition: a read that held its lease while it waited for
  // more would wait for good once concurrent reads held the rest of the pool. What does not
  // fit beside the lease is read whole.
  std::uint64_t extra = delta_staging(t, slice_runs(runs, from, size));
  if (extra > pool_.budget() - block ||
      io::LeasePool::block_size(static_cast<std::size_t>(extra)) > pool_.budget() - block)
    extra = 0;
  const std::size_t reserved = extra > 0 ? io::LeasePool::block_size(static_cast<std::size_t>(extra)) : 0;
  io::StagingBuffer buffer = co_await pool_.async_acquire(block + reserved, asio::use_awaitable);
  co_await fetch(request, t, runs, from, std::span(buffer.data(), size),
                 std::span(buffer.data() + block, static_cast<std::size_t>(extra)));
  co_return io::Lease(std::move(buffer), 0, size, &t, from, total);
}

asio::awaitable<io::Lease> PublishedSource::read_lease(io::TensorReadRequest request) {
  auto [t, runs] = runs_of(request);
  std::uint64_t total = 0;
  for (const ByteRun& r : runs) total += r.length;
  co_return co_await lease_of(request, *t, runs, 0, total, total);
}

asio::awaitable<void> PublishedSource::read_into(io::TensorReadRequest request, std::span<std::byte> destination) {
  auto [t, runs] = runs_of(request);
  std::uint64_t total = 0;
  for (const ByteRun& r : runs) total += r.length;
  if (destination.size() != total)
    throw Error(errc::invalid_argument, {.file = location_, .tensor = t->name},
                fmt::format("a destination of {} bytes for a selection of {}", destination.size(), total));
  co_await fetch(request, *t, runs, 0, destination);
}

PublishedChunks PublishedSource::stream(const io::TensorReadRequest& request) {
  auto [t, runs] = runs_of(request);
  std::uint64_t total = 0;
  for (const ByteRun& r : runs) total += r.length;
  return chunks_of(request, t, std::move(runs), total, {io::SelectionRange{.offset = 0, .length = total}});
}

PublishedChunks PublishedSource::stream_ranges(const io::TensorReadRequest& request,
                                               std::vector<io::SelectionRange> ranges) {
  auto [t, runs] = runs_of(request);
  std::uint64_t total = 0;
  for (const ByteRun& r : runs) total += r.length;
  std::uint64_t end = 0;
  for (const io::SelectionRange& r : ranges) {
    if (r.offset < end || r.offset > total || r.length > total - r.offset)
      throw Error(errc::invalid_argument, {.file = location_, .tensor = t->name},
                  fmt::format("a stream of bytes [{}, {}) of a {}-byte selection, after bytes up to {}: ranges must "
                              "ascend, not overlap, and lie inside the selection",
                              r.offset, r.offset + r.length, total, end));
    end = r.offset + r.length;
  }
  return chunks_of(request, t, std::move(runs), total, std::move(ranges));
}

PublishedChunks PublishedSource::chunks_of(const io::TensorReadRequest& request, const io::TensorInfo* t,
                                           std::vector<ByteRun> runs, std::uint64_t total,
                                           std::vector<io::SelectionRange> ranges) {
  const std::size_t chunk = std::min<std::size_t>(subscriber_->options.part_size, pool_.budget());
  return PublishedChunks(this, request, t, std::move(runs), total, chunk, std::move(ranges));
}

std::optional<std::vector<io::SelectionRange>> PublishedSource::changed_ranges(
    const io::TensorReadRequest& request) const {
  auto [t, runs] = runs_of(request);
  const detail::ManifestTensor& m = manifest_->tensors[index_of(*t)];
  const std::uint64_t block = manifest_->delta_block;
  if (!base_bytes_ || !m.delta || m.xor_planes || block == 0) return std::nullopt;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> sparse_blocks;  // blocks with changed values
  if (m.sparse) {
    const std::uint64_t blocks = (m.nbytes + block - 1) / block;
    if (m.block_first.size() != blocks + 1) return std::nullopt;
    for (std::uint64_t k = 0; k < blocks; ++k) {
      if (m.block_first[k] == m.block_first[k + 1]) continue;
      if (!sparse_blocks.empty() && sparse_blocks.back().first + sparse_blocks.back().second == k)
        ++sparse_blocks.back().second;
      else
        sparse_blocks.emplace_back(k, 1);
    }
  }
  // No piece is longer than the tensor: one each, in the selection's order once sorted.
  std::vector<ByteRun> pieces =
      changed_pieces(runs, m.sparse ? sparse_blocks : m.changed, block, m.nbytes, std::max<std::uint64_t>(m.nbytes, 1));
  std::sort(pieces.begin(), pieces.end(),
            [](const ByteRun& a, const ByteRun& b) { return a.dest_offset < b.dest_offset; });
  std::vector<io::SelectionRange> out;
  for (const ByteRun& piece : pieces) {
    if (!out.empty() && out.back().offset + out.back().length == piece.dest_offset)
      out.back().length += piece.length;
    else
      out.push_back(io::SelectionRange{.offset = piece.dest_offset, .length = piece.length});
  }
  return out;
}

asio::awaitable<std::optional<io::Lease>> PublishedChunks::next() {
  const std::optional<io::SelectionRange> chunk = chunks_.next();
  if (!chunk) co_return std::nullopt;
  co_return co_await source_->lease_of(request_, *tensor_, runs_, chunk->offset,
                                       static_cast<std::size_t>(chunk->length), total_);
}

asio::awaitable<io::Checksums> PublishedSource::checksums(engine::WeightBindingPlan plan) {
  // Every (tensor, selection) the plan reads, once.
  std::set<std::pair<std::string, std::string>> seen;
  std::vector<std::pair<std::size_t, Selection>> wanted;
  auto note = [&](const std::string& key, const Selection& selection) {
    if (!seen.emplace(key, selection.to_string()).second) return;
    const io::TensorInfo* t = catalog_.find(key);
    if (t == nullptr)
      throw Error(errc::tensor_not_found, {.file = location_, .tensor = key}, "the version has no such tensor");
    wanted.emplace_back(static_cast<std::size_t>(t - &catalog_.tensors()[0]), selection);
  };
  for (const engine::WeightBinding* owner : plan.owners()) {
    if (const engine::DerivedWeightRecipe* recipe = owner->recipe()) {
      std::vector<const engine::DerivedWeightRecipe*> todo{recipe};
      while (!todo.empty()) {
        const engine::DerivedWeightRecipe* node = todo.back();
        todo.pop_back();
        if (node->kind() == engine::DerivedWeightRecipe::Kind::source)
          note(node->key(), node->selection());
        else
          for (const engine::DerivedWeightRecipe& input : node->inputs()) todo.push_back(&input);
      }
    } else {
      note(owner->checkpoint_key(), owner->selection());
    }
  }
  io::Checksums out;
  // Digests the manifest already carries (the selections this plan asked for in an earlier
  // version) need no request.
  auto known = [&](const std::pair<std::size_t, Selection>& w) -> const std::string* {
    const detail::ManifestTensor& t = manifest_->tensors[w.first];
    if (w.second.is_all()) return t.digest.empty() ? nullptr : &t.digest;
    const std::string text = w.second.to_string();
    for (const auto& [selection, digest] : t.selection_digests)
      if (selection == text) return &digest;
    return nullptr;
  };
  std::vector<std::pair<std::size_t, Selection>> missing;
  for (const auto& w : wanted) {
    const std::string* digest = known(w);
    if (digest == nullptr) {
      missing.push_back(w);
      continue;
    }
    const std::string& name = manifest_->tensors[w.first].name;
    if (w.second.is_all())
      out.add(name, detail::live_digest, *digest);
    else
      out.add_shard(name, w.second, detail::live_digest, *digest);
  }
  wanted = std::move(missing);
  // Requests of at most ~1 MiB each, so that any plan fits the publisher's request size.
  for (std::size_t first = 0; first < wanted.size();) {
    detail::WireWriter body;
    std::size_t last = first, bytes = 0;
    detail::WireWriter list;
    while (last < wanted.size() && bytes < (std::size_t{1} << 20)) {
      const std::string text = wanted[last].second.to_string();
      list.u64(wanted[last].first);
      list.str(text);
      bytes += 16 + text.size();
      ++last;
    }
    body.u64(last - first);
    body.bytes().insert(body.bytes().end(), list.bytes().begin(), list.bytes().end());
    detail::Reply reply;
    try {
      reply =
          co_await subscriber_->request(detail::RequestKind::digests, manifest_->publication, std::move(body.bytes()));
    } catch (...) {
      subscriber_->rethrow_located(manifest_->version, {});
    }
    subscriber_->check(reply.status(), reply.bytes(), manifest_->version);
    detail::WireReader r(reply.bytes(), "digests");
    if (r.u64() != last - first)
      throw Error(errc::invalid_argument, {.file = location_}, "the publisher answered another number of digests");
    for (std::size_t i = first; i < last; ++i) {
      const std::string& name = manifest_->tensors[wanted[i].first].name;
      std::string digest = r.str();
      if (wanted[i].second.is_all()) {
        if (!manifest_->tensors[wanted[i].first].digest.empty() && digest != manifest_->tensors[wanted[i].first].digest)
          throw Error(errc::checksum_mismatch, {.file = location_, .tensor = name},
                      "the publisher's memory no longer matches the digest it published: the trainer wrote to "
                      "a version it still offers");
        out.add(name, detail::live_digest, std::move(digest));
      } else {
        out.add_shard(name, wanted[i].second, detail::live_digest, std::move(digest));
      }
    }
    first = last;
  }
  co_return out;
}

asio::awaitable<void> PublishedSource::confirm() {
  detail::Reply reply;
  try {
    reply = co_await subscriber_->request(detail::RequestKind::confirm, manifest_->publication, {});
  } catch (...) {
    subscriber_->rethrow_located(manifest_->version, {});
  }
  subscriber_->check(reply.status(), reply.bytes(), manifest_->version);
}

void PublishedSource::finish(bool ok) noexcept {
  if (finished_) return;
  finished_ = true;
  try {
    std::vector<std::byte> message = subscriber_->head(detail::RequestKind::done, 0, manifest_->publication);
    detail::WireWriter flag;
    flag.u32(ok ? 1 : 0);
    message.insert(message.end(), flag.bytes().begin(), flag.bytes().end());
    detail::send_message(subscriber_->comm, subscriber_->publisher, detail::request_tag,
                         std::make_shared<const std::vector<std::byte>>(std::move(message)),
                         "the end of a read to the publisher", subscriber_->options.timeout, true);
  } catch (const std::exception& e) {
    log::warn("live subscriber: telling the publisher that version {} is done failed: {}",
              printable(manifest_->version), e.what());
  }
}

}  // namespace eredu::mpi
