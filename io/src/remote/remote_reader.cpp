// RemoteReader: batches of segments as ranged GETs of parts (see remote_reader.hpp). One mutex
// guards the queue and the batches; the client's callbacks (on its thread) and read()/cancel()
// (on any thread) take it. A batch's callback runs outside it.
#include "remote_reader.hpp"

#include <sys/mman.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "eredu/core/error.hpp"
#include "eredu/io/remote/remote_url.hpp"

namespace eredu::io::detail {

namespace {
#ifdef MADV_POPULATE_WRITE
constexpr int populate_write = MADV_POPULATE_WRITE;
#else
constexpr int populate_write = 23;  // Linux 5.14's value; older kernels answer EINVAL
#endif
}  // namespace

namespace {

std::string host_of(const std::vector<RemoteObject>& objects) {
  for (const auto& o : objects) {
    if (o.url.empty()) continue;
    try {
      const RemoteUrl u = parse_remote_url(o.url);
      return u.port ? fmt::format("{}:{}", u.host, u.port) : u.host;
    } catch (const Error&) {
      return "?";
    }
  }
  return "no host";
}

}  // namespace

struct RemoteReader::State : std::enable_shared_from_this<State> {
  struct Batch;
  // One ranged GET of a segment (at most part_bytes).
  struct Part {
    std::shared_ptr<Batch> batch;
    std::uint32_t file = 0;
    std::uint64_t offset = 0;
    std::byte* dest = nullptr;
    std::uint64_t length = 0;
    std::uint64_t required = 0;  // bytes that must come (the rest may lie past the object's end)
  };
  struct Batch {
    BatchId id = 0;
    ReadCallback done;
    std::exception_ptr failure;
    std::size_t in_flight = 0;
    std::size_t queued = 0;
    std::vector<RequestId> requests;  // in flight
  };

  State(HttpClient& c, std::vector<RemoteObject> o, std::size_t part, unsigned conc)
      : client(c), objects(std::move(o)), part_bytes(part), concurrency(conc), host(host_of(objects)) {}

  HttpClient& client;
  const std::vector<RemoteObject> objects;
  const std::size_t part_bytes;
  const unsigned concurrency;
  const std::string host;

  std::mutex mutex;
  std::condition_variable idle;  // batches became empty (the destructor waits for it)
  std::deque<Part> queue;
  std::unordered_map<BatchId, std::shared_ptr<Batch>> batches;
  unsigned in_flight = 0;
  unsigned completing = 0;  // callbacks taken out of their batches and not yet returned

  std::atomic<std::uint64_t> n_requests{0}, n_bytes{0}, n_short{0};

  std::string display(std::uint32_t file) const {
    const RemoteObject& o = objects[file];
    return o.display.empty() ? o.url : o.display;
  }

  // Fails `b` (first failure wins), stops its parts in flight and drops its queued ones.
  void fail(Batch& b, std::exception_ptr e) {
    if (b.failure) return;
    b.failure = std::move(e);
    for (RequestId r : b.requests) client.cancel(r);
    if (b.queued) {
      std::erase_if(queue, [&](const Part& p) { return p.batch.get() == &b; });
      b.queued = 0;
    }
  }

  // Takes `b` out when nothing of it is in flight or queued; returns its callback, which the
  // caller runs through complete() once the mutex is released.
  ReadCallback finish_if_done(const std::shared_ptr<Batch>& b, std::exception_ptr& failure) {
    if (b->in_flight || b->queued) return {};
    batches.erase(b->id);
    failure = b->failure;
    ++completing;
    return std::move(b->done);
  }

  // Runs a batch's callback (without the mutex), then lets a waiting destructor go on.
  void complete(ReadCallback done, std::exception_ptr failure) {
    done(std::move(failure));
    std::lock_guard lock(mutex);
    if (--completing == 0 && batches.empty()) idle.notify_all();
  }

  bool quiet() const { return batches.empty() && completing == 0; }

  // Issues queued parts while fewer than `concurrency` are in flight. Under the mutex.
  void pump() {
    while (in_flight < concurrency && !queue.empty()) {
      Part p = std::move(queue.front());
      queue.pop_front();
      Batch& b = *p.batch;
      --b.queued;
      const RemoteObject& o = objects[p.file];
      const RequestId rid = HttpClient::new_request_id();
      ++in_flight;
      ++b.in_flight;
      b.requests.push_back(rid);
      RangeGet get{.url = o.url,
                   .offset = p.offset,
                   .dest = std::span(p.dest, static_cast<std::size_t>(p.length)),
                   .if_match = o.etag,
                   .signer = o.signer,
                   .allow_short = true};
      // get() only posts to the client's thread: the callback never runs under this mutex.
      client.get(
          std::move(get),
          [self = shared_from_this(), p, rid](std::exception_ptr e, RangeResult r) mutable {
            self->part_done(p, rid, std::move(e), r);
          },
          rid);
    }
  }

  void part_done(const Part& p, RequestId rid, std::exception_ptr e, const RangeResult& r) {
    n_requests.fetch_add(e ? 1 : r.attempts, std::memory_order_relaxed);
    ReadCallback done;
    std::exception_ptr failure;
    {
      std::lock_guard lock(mutex);
      --in_flight;
      Batch& b = *p.batch;
      --b.in_flight;
      std::erase(b.requests, rid);
      if (e) {
        fail(b, rewrap(p, std::move(e)));
      } else {
        n_bytes.fetch_add(r.bytes, std::memory_order_relaxed);
        if (r.bytes < p.length) n_short.fetch_add(1, std::memory_order_relaxed);
        if (r.bytes < p.required) {
          fail(b, std::make_exception_ptr(
                      Error(errc::unexpected_eof, {.file = display(p.file), .offset = p.offset + r.bytes},
                            fmt::format("the object ended after {} bytes, {} were expected from offset {}", r.bytes,
                                        p.required, p.offset))));
        }
      }
      done = finish_if_done(p.batch, failure);
      pump();
    }
    if (done) complete(std::move(done), failure);
  }

  // The client's error, naming the object as the reader's user knows it (the s3:// form).
  std::exception_ptr rewrap(const Part& p, std::exception_ptr e) const {
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      ErrorContext c = err.context();
      c.file = display(p.file);
      if (!c.offset) c.offset = p.offset;
      return std::make_exception_ptr(Error(err.kind(), std::move(c), err.detail()));
    } catch (...) {
      return std::current_exception();
    }
  }

  void cancel(Batch& b) {
    fail(b, std::make_exception_ptr(Error(errc::cancelled, {.file = host}, "the read was cancelled")));
  }
};

RemoteReader::RemoteReader(HttpClient& client, std::vector<RemoteObject> objects, std::size_t part_bytes,
                           unsigned concurrency)
    : state_(std::make_shared<State>(client, std::move(objects), std::max<std::size_t>(part_bytes, 1),
                                     std::clamp(concurrency, 1u, client.options().max_transfers))) {}

RemoteReader::~RemoteReader() {
  std::unique_lock lock(state_->mutex);
  for (auto& [id, b] : state_->batches) state_->cancel(*b);
  // Batches cancelled with nothing in flight complete here; the others when their GETs end.
  std::vector<std::pair<ReadCallback, std::exception_ptr>> now;
  for (auto it = state_->batches.begin(); it != state_->batches.end();) {
    auto b = (it++)->second;
    std::exception_ptr failure;
    if (ReadCallback done = state_->finish_if_done(b, failure)) now.emplace_back(std::move(done), failure);
  }
  lock.unlock();
  for (auto& [done, failure] : now) state_->complete(std::move(done), failure);
  lock.lock();
  state_->idle.wait(lock, [&] { return state_->quiet(); });
}

void RemoteReader::read(std::vector<ReadSegment> segments, ReadCallback done, BatchId id) {
  State& s = *state_;
  auto b = std::make_shared<State::Batch>();
  b->id = id ? id : new_batch_id();
  b->done = std::move(done);
  std::exception_ptr refused;
  std::vector<State::Part> parts;
  for (const ReadSegment& seg : segments) {
    if (seg.file >= s.objects.size() || s.objects[seg.file].url.empty()) {
      refused = std::make_exception_ptr(Error(errc::invalid_argument, {.offset = seg.offset},
                                              fmt::format("file {} is not a remote object", seg.file)));
      break;
    }
    const RemoteObject& o = s.objects[seg.file];
    const std::uint64_t required = seg.required ? std::min(seg.required, seg.length) : seg.length;
    if (seg.offset + required > o.size) {
      refused = std::make_exception_ptr(Error(
          errc::unexpected_eof, {.file = s.display(seg.file), .offset = std::max(seg.offset, o.size)},
          fmt::format("the object is {} bytes; {} bytes were asked from offset {}", o.size, required, seg.offset)));
      break;
    }
    // Bytes past the object's end need not be read (a window wider than its required part).
    const std::uint64_t length = std::min(seg.length, o.size > seg.offset ? o.size - seg.offset : 0);
    for (std::uint64_t at = 0; at < length; at += s.part_bytes) {
      const std::uint64_t n = std::min<std::uint64_t>(s.part_bytes, length - at);
      const std::uint64_t need = required > at ? std::min(n, required - at) : 0;
      parts.push_back(State::Part{b, seg.file, seg.offset + at, seg.dest + at, n, need});
    }
  }
  if (refused || parts.empty()) {
    b->done(refused);
    return;
  }
  {
    std::lock_guard lock(s.mutex);
    b->queued = parts.size();
    s.batches[b->id] = b;
    for (auto& p : parts) s.queue.push_back(std::move(p));
    s.pump();
  }
  // The client's thread copies each body into its destination, and fresh tensor storage makes
  // it take a page fault per 4 KiB as well (a third of its time, measured with perf): fault the
  // pages in here meanwhile, from the end backwards while the bodies land from the start, so
  // two threads share the work. Page tables only: no byte changes, so it is harmless even where
  // the batch has already completed. Kernels before 5.14 lack MADV_POPULATE_WRITE: skipped.
  const std::uintptr_t page = 4096;
  for (auto seg = segments.rbegin(); seg != segments.rend(); ++seg) {
    const auto begin = (reinterpret_cast<std::uintptr_t>(seg->dest) + page - 1) / page * page;
    const auto end = (reinterpret_cast<std::uintptr_t>(seg->dest) + seg->length) / page * page;
    constexpr std::uintptr_t step = std::uintptr_t{2} << 20;
    for (std::uintptr_t hi = end; hi > begin;) {
      const std::uintptr_t lo = hi - begin > step ? hi - step : begin;
      if (::madvise(reinterpret_cast<void*>(lo), hi - lo, populate_write) != 0) break;
      hi = lo;
    }
  }
}

void RemoteReader::cancel(BatchId id) {
  State& s = *state_;
  ReadCallback done;
  std::exception_ptr failure;
  {
    std::lock_guard lock(s.mutex);
    auto it = s.batches.find(id);
    if (it == s.batches.end()) return;
    auto b = it->second;
    s.cancel(*b);
    done = s.finish_if_done(b, failure);
  }
  if (done) s.complete(std::move(done), failure);
}

ReaderStats RemoteReader::stats() const {
  ReaderStats r;
  r.requests = state_->n_requests.load(std::memory_order_relaxed);
  r.bytes = state_->n_bytes.load(std::memory_order_relaxed);
  r.short_reads = state_->n_short.load(std::memory_order_relaxed);
  return r;
}

std::string RemoteReader::describe() const {
  const State& s = *state_;
  return fmt::format("http: {} object(s) on {}, parts of {} bytes, up to {} in flight", s.objects.size(), s.host,
                     s.part_bytes, s.concurrency);
}

}  // namespace eredu::io::detail
