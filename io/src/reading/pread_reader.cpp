#include "eredu/io/reading/pread_reader.hpp"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <new>
#include <thread>

#include <fmt/format.h>

#include "eredu/core/completion.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"
#include "eredu/core/trace.hpp"
#include "reader_core.hpp"

namespace eredu::io {

using detail::Piece;

namespace {

/// A batch's callback as the workers hold it. Called, it never throws: it runs on a worker
/// thread, inside the reader core's bookkeeping, where an exception would end the process or
/// strand the batch's other pieces. Destroyed without having been called (an exception
/// unwound past the batch, most likely std::bad_alloc), it reports out_of_memory, so that the
/// read's owner is never left waiting.
class SureCallback {
 public:
  explicit SureCallback(ReadCallback inner) : inner_(std::move(inner)) {}
  SureCallback(SureCallback&&) noexcept = default;
  SureCallback& operator=(SureCallback&&) = delete;
  SureCallback(const SureCallback&) = delete;
  SureCallback& operator=(const SureCallback&) = delete;
  ~SureCallback() {
    if (inner_) call(out_of_memory_error());
  }

  void operator()(std::exception_ptr error) noexcept { call(std::move(error)); }

 private:
  void call(std::exception_ptr error) noexcept {
    ReadCallback inner = std::move(inner_);
    inner_ = ReadCallback{};
    try {
      inner(typed_failure(std::move(error)));
    } catch (const std::exception& e) {
      // The callback could not even hand the result on (no memory to post it): what was
      // waiting for it is lost, but this worker and the other batches go on.
      try {
        log::warn("the pread reader could not deliver a read's result: {}", e.what());
      } catch (...) {}
    } catch (...) {}
  }

  ReadCallback inner_;
};

}  // namespace

struct PreadReader::Impl {
  Impl(std::span<OpenFile> files, const ReaderOptions& options) : core(files, options) {}

  std::mutex mutex;  // guards `core` and `stopping`
  std::condition_variable wake;
  detail::ReaderCore core;
  bool stopping = false;
  std::vector<std::thread> workers;

  // A worker thread's body: nothing may escape it (std::terminate). The reader core's
  // bookkeeping allocates only to describe a failure (a read error's message, a trace
  // record); such an allocation failing is logged and the worker goes on.
  void run(unsigned index) noexcept {
    try {
      trace::name_this_thread(fmt::format("pread worker {}", index));
    } catch (...) {}
    for (;;) {
      try {
        worker();
        return;
      } catch (const std::exception& e) {
        try {
          log::warn("a pread worker failed while finishing a read: {}", e.what());
        } catch (...) {}
      } catch (...) {}
    }
  }

  void worker() {
    std::unique_lock lock(mutex);
    for (;;) {
      wake.wait(lock, [&] { return stopping || !core.pending.empty(); });
      if (stopping) return;
      Piece* p = core.pending.front();
      core.pending.pop_front();
      const std::uint64_t pos = p->offset + p->done;
      std::byte* dst = p->dest + p->done;
      std::uint64_t len = p->length - p->done;
      if (p->request_limit) len = std::min(len, p->request_limit);
      p->submitted = len;
      p->direct = core.want_direct(*p, pos, dst, len);
      const auto& f = core.files[p->file];
      const int fd = p->direct ? f.direct.get() : f.buffered.get();
      const bool guarded = core.guarded(*p);
      core.count_request(*p, false);
      core.count_syscall();
      const std::uint32_t file = p->file;
      lock.unlock();
      long res = 0;
      std::uint64_t trusted = 0;
      bool cached = false;
      {
        // See PageCacheGuardLock: one at a time until the server has answered a few reads in
        // full, and for good once it answered one short.
        PageCacheGuardLock::Hold hold;
        if (guarded) {
          hold = f.guard->hold_for_read();
          // Waiting may have outlasted the reader or the batch: a slow server must not
          // hold a shutdown (a signal) for one read per waiting worker, one after another.
          lock.lock();
          if (stopping) return;  // the destructor completes every batch
          if (p->batch->failure) {
            core.on_result(*p, 0, true);  // finishes the piece of a failed batch
            if (!core.pending.empty()) wake.notify_one();
            continue;
          }
          lock.unlock();
        }
        detail::ReaderCore::CacheTicket ticket;
        if (guarded) ticket = core.guard_before(file, pos, len);
        const ssize_t n = ::pread(fd, dst, len, static_cast<off_t>(pos));
        res = n < 0 ? -errno : static_cast<long>(n);
        trusted = res > 0 ? static_cast<std::uint64_t>(res) : 0;
        if (guarded && res > 0) trusted = core.trusted_after_guarded_read(file, ticket, pos, trusted, len, cached);
      }
      // Bytes past `trusted` may be the page cache's, not the server's: those are read again.
      const bool suspect = res > 0 && trusted < static_cast<std::uint64_t>(res);
      long result = suspect ? static_cast<long>(trusted) : res;
      // The injector is consulted before the lock is taken again: one that blocks (the
      // Python tests' read gate) must hold only this worker, not the loop submitting reads.
      // The piece is this worker's alone until on_result.
      if (!(suspect && trusted == 0)) result = apply_fault(core.options.faults, *p, result);
      lock.lock();
      if (suspect) {
        core.count_cache_redo();
        if (trusted == 0) {
          core.on_cache_suspect(*p, cached);
        } else {
          core.on_result(*p, result, true);
        }
      } else {
        // A guarded read answered in full: let the next one be longer again.
        if (guarded && p->request_limit && static_cast<std::uint64_t>(res) == len) {
          p->request_limit = p->request_limit >= core.options.max_request / 2 ? 0 : p->request_limit * 2;
        }
        core.on_result(*p, result, true);
      }
      if (!core.pending.empty()) wake.notify_one();
    }
  }
};

PreadReader::PreadReader(std::span<OpenFile> files, const ReaderOptions& options)
    : impl_(std::make_unique<Impl>(files, options)) {
  const unsigned wanted = std::min(options.depth, ReaderOptions::max_pread_threads);
  impl_->workers.reserve(wanted);
  std::error_code failure;
  for (unsigned i = 0; i < wanted; ++i) {
    try {
      impl_->workers.emplace_back([this, i] { impl_->run(i); });
    } catch (const std::system_error& e) {
      // Out of threads or address space (a small `ulimit -v`, RLIMIT_NPROC, a container's
      // pids limit): fewer workers read as correctly, only with less parallelism.
      failure = e.code();
      break;
    } catch (const std::bad_alloc&) {
      failure = std::make_error_code(std::errc::not_enough_memory);
      break;
    }
  }
  if (impl_->workers.empty()) {
    throw Error(errc::resource_exhausted, {.os_error = failure},
                fmt::format("the pread reader cannot start any of its {} worker threads (threads are limited by "
                            "RLIMIT_NPROC or a container's pids limit, and each needs address space for its stack)",
                            wanted));
  }
  if (impl_->workers.size() < wanted) {
    log::warn("the pread reader started {} of its {} worker threads ({}): reading with fewer", impl_->workers.size(),
              wanted, failure.message());
  }
}

PreadReader::~PreadReader() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  for (auto& w : impl_->workers) w.join();  // each finishes the pread it is in
  impl_->core.cancel_all();
}

void PreadReader::read(std::vector<ReadSegment> segments, ReadCallback done, BatchId id) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->stopping) {
    done(impl_->core.to_exception(detail::ReadFailure{make_error_code(errc::cancelled), {}, 0, 0, "reader shut down"}));
    return;
  }
  impl_->core.add(segments, SureCallback(std::move(done)), id);
  impl_->wake.notify_all();
}

void PreadReader::cancel(BatchId id) {
  // Queued pieces go at once; a worker in a pread finishes it, then finds the batch failed.
  std::lock_guard lock(impl_->mutex);
  if (detail::Batch* b = impl_->core.find(id)) impl_->core.cancel(*b);
}

ReaderStats PreadReader::stats() const { return impl_->core.stats(); }

std::size_t PreadReader::direct_alignment(std::uint32_t file) const noexcept {
  return impl_->core.direct_alignment(file);
}

bool PreadReader::reads_direct(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const noexcept {
  return impl_->core.reads_direct(file, offset, length);
}

std::string PreadReader::describe() const {
  return fmt::format("pread, {} threads, requests up to {} KiB", impl_->workers.size(),
                     impl_->core.options.max_request >> 10);
}

}  // namespace eredu::io
