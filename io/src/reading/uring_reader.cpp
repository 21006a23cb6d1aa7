#include "eredu/io/reading/uring_reader.hpp"

#include <liburing.h>
#include <sys/eventfd.h>

#include <asio/bind_executor.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/post.hpp>
#include <asio/strand.hpp>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <exception>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"
#include "posix_values.hpp"
#include "reader_core.hpp"

namespace eredu::io {

using detail::Piece;

namespace {

using detail::sys_error;

constexpr std::size_t direct_align = detail::ReaderCore::direct_align;
constexpr std::size_t max_iovec = std::size_t{1} << 30;  // io_uring's limit per fixed buffer
constexpr unsigned max_small_requests = 64;
// Reads of one piece io_uring cancels in a row before it fails: see Impl::handle.
constexpr unsigned max_worker_refusals = 8;

}  // namespace

struct UringReader::Impl : std::enable_shared_from_this<UringReader::Impl> {
  asio::strand<asio::any_io_executor> strand;
  detail::ReaderCore core;  // used on the strand only (and in shutdown)
  io_uring ring{};
  bool ring_ready = false;
  UniqueFd event_fd;
  asio::posix::stream_descriptor event_desc;
  bool files_registered = false;
  std::span<std::byte> pool_memory;  // registered lazily, on the first read into it
  bool registration_tried = false;   // since setup or the last release (strand only)
  std::byte* reg_base = nullptr;
  std::atomic<std::size_t> reg_bytes{0};  // read by registered_bytes() on any thread
  unsigned in_flight = 0;
  std::uint64_t in_flight_bytes = 0;
  unsigned submit_failures = 0;
  bool closed = false;
  bool armed = false;            // an eventfd wait is queued on the loop
  bool workers_refused = false;  // io-wq could not start a thread: no more IOSQE_ASYNC
  // Reader::cancel asks the kernel to cancel a batch's reads in flight (IORING_OP_ASYNC_CANCEL),
  // unless EREDU_URING_CANCEL_IN_FLIGHT=0 (then they finish: for measuring the difference).
  bool cancel_in_flight = true;

  Impl(asio::any_io_executor ex, std::span<OpenFile> f, const ReaderOptions& o)
      : strand(asio::make_strand(ex)), core(f, o), event_desc(ex) {}

  ~Impl() {
    if (ring_ready) io_uring_queue_exit(&ring);
  }

  void setup(std::span<std::byte> staging) {
    if (const char* off = std::getenv("EREDU_DISABLE_URING"); off && *off && *off != '0') {
      throw Error(errc::uring_unavailable, {}, "io_uring disabled by EREDU_DISABLE_URING");
    }
    unsigned entries = max_small_requests;
    while (entries < core.options.depth) entries *= 2;
    if (int r = io_uring_queue_init(entries, &ring, 0); r < 0) {
      throw Error(errc::uring_unavailable, {.os_error = sys_error(-r)}, "io_uring_setup failed");
    }
    ring_ready = true;
    if (const char* v = std::getenv("EREDU_URING_CANCEL_IN_FLIGHT"); v && *v == '0') cancel_in_flight = false;
    int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (efd < 0) throw Error(errc::uring_unavailable, {.os_error = sys_error(errno)}, "eventfd failed");
    event_fd.reset(efd);
    if (int r = io_uring_register_eventfd(&ring, efd); r < 0) {
      throw Error(errc::uring_unavailable, {.os_error = sys_error(-r)}, "io_uring_register_eventfd failed");
    }
    const int watched = ::dup(efd);
    if (watched < 0) {
      // Out of descriptors (RLIMIT_NOFILE): with ReaderKind::automatic the pread reader,
      // which needs none of its own, reads instead.
      throw Error(errc::uring_unavailable, {.os_error = sys_error(errno)}, "dup of the io_uring eventfd failed");
    }
    event_desc.assign(watched);
    register_files();
    // The pool's memory is registered when the first read into it is submitted, not here:
    // registering pins (and so populates) every page, and most loads never stage anything.
    pool_memory = staging;
  }

  void register_files() {
    // Slot 2i is file i's buffered descriptor, 2i+1 its direct one (-1: a sparse slot).
    std::vector<int> fds;
    for (auto& f : core.files) {
      fds.push_back(f.buffered.get());
      fds.push_back(f.direct ? f.direct.get() : -1);
    }
    if (fds.empty()) return;
    int r = io_uring_register_files(&ring, fds.data(), static_cast<unsigned>(fds.size()));
    files_registered = r == 0;
    if (!files_registered) log::debug("io_uring_register_files failed ({}): using plain descriptors", -r);
  }

  void register_buffers(std::span<std::byte> memory) {
    std::size_t want = memory.size();
    if (core.options.max_registered_bytes) want = std::min(want, core.options.max_registered_bytes);
    want = want / direct_align * direct_align;
    int last_error = 0;
    // Try the whole pool first, however small; halve on failure down to 1 MiB.
    while (want > 0) {
      std::vector<iovec> iov;
      for (std::size_t off = 0; off < want; off += max_iovec) {
        iov.push_back({memory.data() + off, std::min(max_iovec, want - off)});
      }
      int r = io_uring_register_buffers(&ring, iov.data(), static_cast<unsigned>(iov.size()));
      if (r == 0) {
        reg_base = memory.data();
        reg_bytes.store(want, std::memory_order_relaxed);
        break;
      }
      last_error = -r;
      if (want <= (std::size_t{1} << 20)) break;
      want = want / 2 / direct_align * direct_align;
    }
    if (reg_bytes.load(std::memory_order_relaxed) < memory.size()) {
      log::info(
          "registered {:.1f} of {:.1f} MiB of staging memory as io_uring fixed buffers{}; the rest is "
          "read into unregistered memory (raise `ulimit -l` to register all)",
          static_cast<double>(reg_bytes.load(std::memory_order_relaxed)) / (1 << 20),
          static_cast<double>(memory.size()) / (1 << 20),
          last_error ? fmt::format(" ({})", sys_error(last_error).message()) : std::string{});
    }
  }

  // --- everything below runs on the strand (or in the destructor) ---

  void start(std::vector<ReadSegment> segments, ReadCallback done, BatchId id) {
    if (closed) {
      done(core.to_exception(detail::ReadFailure{make_error_code(errc::cancelled), {}, 0, 0, "reader shut down"}));
      return;
    }
    core.add(segments, std::move(done), id);
    drive();
  }

  // Reader::cancel on the strand: the batch's queued pieces are dropped unread; the kernel is
  // asked to cancel its reads in flight (a read it already runs, a page-cache copy or a
  // direct read in the block layer, finishes: their results are then dropped too).
  void cancel(BatchId id) {
    detail::Batch* b = core.find(id);
    if (!b || b->failure) return;
    std::vector<Piece*> running;
    for (Piece& p : core.pieces_of(*b))
      if (p.in_flight) running.push_back(&p);
    core.cancel(*b);  // completes the batch now when nothing of it is in flight
    if (running.empty() || !cancel_in_flight || closed) return;
    for (Piece* p : running) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (!sqe) {
        io_uring_submit(&ring);
        core.count_syscall();
        sqe = io_uring_get_sqe(&ring);
        if (!sqe) break;  // the reads left run to their end
      }
      io_uring_prep_cancel(sqe, p, 0);
      io_uring_sqe_set_data(sqe, nullptr);  // its own completion is skipped in reap()
    }
    io_uring_submit(&ring);
    core.count_syscall();
  }

  // Submits and reaps until neither makes progress: page-cache hits complete inside the
  // submit call, so they are handled here without a round trip through the event loop.
  void drive() {
    try {
      for (;;) {
        bool submitted = submit_pending();
        unsigned reaped = reap();
        if (!submitted && reaped == 0) break;
      }
    } catch (...) {
      // The reads still in flight must be reaped whoever catches this.
      if (in_flight > 0 && !armed && !closed) arm();
      throw;
    }
    // Wait on the eventfd only while the kernel holds requests: an idle reader must not
    // keep its io_context's run() from returning.
    if (in_flight > 0 && !armed && !closed) arm();
  }

  bool submit_pending() {
    unsigned queued = 0;
    const auto& options = core.options;
    const std::uint64_t byte_limit = std::uint64_t{options.depth} * options.max_request;
    while (!core.pending.empty()) {
      Piece* p = core.pending.front();
      const auto len = static_cast<unsigned>(p->length - p->done);
      // `depth` device-sized requests, or more small ones (a column selection's rows) as
      // long as they carry no more bytes than `depth` large ones would.
      const bool room =
          in_flight < options.depth || (in_flight < max_small_requests && in_flight_bytes + len <= byte_limit);
      if (!room) break;
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (!sqe) break;
      core.pending.pop_front();
      const std::uint64_t pos = p->offset + p->done;
      std::byte* dst = p->dest + p->done;
      p->submitted = len;
      in_flight_bytes += len;
      p->direct = core.want_direct(*p, pos, dst, len);
      const auto& f = core.files[p->file];
      int fd = p->direct ? f.direct.get() : f.buffered.get();
      if (files_registered) fd = static_cast<int>(2 * p->file + (p->direct ? 1 : 0));
      if (!registration_tried && core.options.register_buffers && !pool_memory.empty() && dst >= pool_memory.data() &&
          dst < pool_memory.data() + pool_memory.size()) {
        registration_tried = true;
        register_buffers(pool_memory);
      }
      const std::size_t registered = reg_bytes.load(std::memory_order_relaxed);
      const bool fixed_buf = registered > 0 && dst >= reg_base && dst + len <= reg_base + registered &&
                             (dst - reg_base) / max_iovec == (dst + len - 1 - reg_base) / max_iovec;
      if (fixed_buf) {
        io_uring_prep_read_fixed(sqe, fd, dst, len, pos, static_cast<int>((dst - reg_base) / max_iovec));
      } else {
        io_uring_prep_read(sqe, fd, dst, len, pos);
      }
      if (files_registered) sqe->flags |= IOSQE_FIXED_FILE;
      // A buffered read of cached data is a memcpy done inside io_uring_enter on this thread;
      // punted to io-wq, the requests in flight copy on several cores at once.
      if (!p->direct && core.options.parallel_buffered_copies && !workers_refused) sqe->flags |= IOSQE_ASYNC;
      io_uring_sqe_set_data(sqe, p);
      p->in_flight = true;
      ++in_flight;
      ++queued;
      core.count_request(*p, fixed_buf);
    }
    if (queued == 0 && io_uring_sq_ready(&ring) == 0) return false;
    int r = io_uring_submit(&ring);
    core.count_syscall();
    if (r < 0) {
      // The entries stay in the submission queue; retry from the loop unless the ring is
      // broken for good.
      if (++submit_failures > 1000)
        fail_everything(-r);
      else
        asio::post(strand, [self = shared_from_this()] {
          if (!self->closed) self->drive();
        });
      return false;
    }
    submit_failures = 0;
    return queued > 0;
  }

  unsigned reap() {
    io_uring_cqe* cqes[64];
    unsigned total = 0;
    // Every reaped completion is handled and consumed even if handling one throws (an
    // allocation describing a failure): one left unconsumed would be handled again, and one
    // consumed unhandled would leave `in_flight` for shutdown() to wait on for ever. The first
    // exception then leaves through the event loop, as the command's failure.
    std::exception_ptr failure;
    while (unsigned n = io_uring_peek_batch_cqe(&ring, cqes, 64)) {
      for (unsigned i = 0; i < n; ++i) {
        auto* p = static_cast<Piece*>(io_uring_cqe_get_data(cqes[i]));
        int res = cqes[i]->res;
        if (!p) continue;  // an IORING_OP_ASYNC_CANCEL's own completion (see cancel())
        try {
          handle(*p, res);
        } catch (...) {
          if (!failure) failure = std::current_exception();
        }
      }
      io_uring_cq_advance(&ring, n);
      total += n;
    }
    if (failure) std::rethrow_exception(failure);
    return total;
  }

  void handle(Piece& p, long res) {
    --in_flight;
    in_flight_bytes -= p.submitted;
    p.in_flight = false;
    // Besides a cancelled batch's reads (cancel()), io_uring cancels a request it queued for its worker
    // threads (io-wq) when it cannot start one (RLIMIT_NPROC, a pids limit). Such reads are
    // issued again without IOSQE_ASYNC, which most complete without a worker (page-cache
    // copies inline, O_DIRECT through the block layer); a read that still needs one fails.
    // A read of a cancelled batch (cancel()) ends here, whatever its result.
    if (res == -ECANCELED && !closed && !p.batch->failure) {
      if (!workers_refused) {
        workers_refused = true;
        log::warn(
            "io_uring could not start a worker thread for a read (threads are limited by RLIMIT_NPROC or a "
            "container's pids limit): reading without its workers");
      }
      if (p.requeues < max_worker_refusals) {
        res = -EAGAIN;  // requeued at the front, as an interrupted read is
      } else {
        core.fail(*p.batch,
                  {make_error_code(errc::resource_exhausted), sys_error(ECANCELED), p.file, p.offset + p.done,
                   fmt::format("io_uring cancelled a read of {} bytes at offset {} of {} {} times in a row: it cannot "
                               "start the worker thread the read needs (threads are limited by RLIMIT_NPROC or a "
                               "container's pids limit)",
                               p.length - p.done, p.offset + p.done, core.files[p.file].path, p.requeues + 1)});
      }
    }
    core.on_result(p, res);
  }

  void fail_everything(int error) {
    log::warn("io_uring submission keeps failing ({}): failing every pending read", sys_error(error).message());
    closed = true;
    core.fail_all({make_error_code(errc::io_error), sys_error(error), 0, 0, "io_uring_submit failed repeatedly"});
  }

  void arm() {
    armed = true;
    event_desc.async_wait(asio::posix::stream_descriptor::wait_read,
                          asio::bind_executor(strand, [self = shared_from_this()](std::error_code ec) {
                            self->armed = false;
                            if (ec || self->closed) return;
                            std::uint64_t value;
                            while (::read(self->event_fd.get(), &value, sizeof value) > 0) {}
                            self->drive();
                          }));
  }

  // Drops the fixed-buffer registration (so the pool may return its pages), then calls
  // `release`. On the strand: no submission runs meanwhile, and the next read into the pool
  // registers it again.
  void release_registration(UniqueFunction<bool()> release) {
    if (reg_bytes.load(std::memory_order_relaxed) > 0 && ring_ready) {
      if (int r = io_uring_unregister_buffers(&ring); r < 0) {
        log::debug("io_uring_unregister_buffers failed ({}): keeping the staging pages", sys_error(-r).message());
        return;
      }
      reg_base = nullptr;
      reg_bytes.store(0, std::memory_order_relaxed);
    }
    registration_tried = false;
    release();
  }

  void shutdown() {
    closed = true;
    if (in_flight > 0) io_uring_submit(&ring);
    while (in_flight > 0) {
      io_uring_cqe* cqe = nullptr;
      __kernel_timespec ts{5, 0};
      int r = io_uring_wait_cqe_timeout(&ring, &cqe, &ts);
      if (r == -EINTR) continue;
      if (r == -ETIME) {
        log::warn("still waiting for {} io_uring reads to finish before freeing their memory", in_flight);
        continue;
      }
      if (r < 0) break;
      const bool read = io_uring_cqe_get_data(cqe) != nullptr;  // not a cancel's own completion
      io_uring_cqe_seen(&ring, cqe);
      if (read) --in_flight;
    }
    core.cancel_all();
    std::error_code ignored;
    event_desc.close(ignored);
  }
};

UringReader::UringReader(asio::any_io_executor executor, std::span<OpenFile> files, std::span<std::byte> pool_memory,
                         const ReaderOptions& options)
    : impl_(std::make_shared<Impl>(std::move(executor), files, options)) {
  impl_->setup(pool_memory);
}

UringReader::~UringReader() { impl_->shutdown(); }

void UringReader::read(std::vector<ReadSegment> segments, ReadCallback done, BatchId id) {
  asio::post(impl_->strand, [self = impl_, segs = std::move(segments), d = std::move(done), id]() mutable {
    self->start(std::move(segs), std::move(d), id);
  });
}

void UringReader::cancel(BatchId id) {
  // After the read's own post (one strand, in order): the batch is known by then.
  asio::post(impl_->strand, [self = impl_, id] {
    if (!self->closed) self->cancel(id);
  });
}

ReaderStats UringReader::stats() const { return impl_->core.stats(); }

std::size_t UringReader::direct_alignment(std::uint32_t file) const noexcept {
  return impl_->core.direct_alignment(file);
}

bool UringReader::reads_direct(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const noexcept {
  return impl_->core.reads_direct(file, offset, length);
}

std::size_t UringReader::registered_bytes() const noexcept { return impl_->reg_bytes.load(std::memory_order_relaxed); }

LeasePool::ReleaseHook UringReader::pool_release_hook() {
  return [weak = std::weak_ptr<Impl>(impl_)](UniqueFunction<bool()> release) {
    std::shared_ptr<Impl> self = weak.lock();
    if (!self) return;  // the reader is gone: nothing of it is registered any more
    asio::post(self->strand, [self, release = std::move(release)]() mutable {
      if (self->closed) {
        release();  // shut down: no more submissions, nothing in flight
        return;
      }
      self->release_registration(std::move(release));
    });
  };
}

std::string UringReader::describe() const {
  std::size_t direct_files = 0;
  const auto& options = impl_->core.options;
  for (auto& f : impl_->core.files) direct_files += f.direct ? 1 : 0;
  return fmt::format("io_uring, depth {}, requests up to {} KiB, {} MiB fixed buffers, O_DIRECT {} ({} of {} files)",
                     options.depth, options.max_request >> 10, registered_bytes() >> 20,
                     options.direct == DirectMode::off  ? "off"
                     : options.direct == DirectMode::on ? "on"
                                                        : "auto",
                     direct_files, impl_->core.files.size());
}

}  // namespace eredu::io
