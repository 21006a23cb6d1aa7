#include "eredu/io/pread_reader.hpp"

#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <list>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"
#include "page_cache_probe.hpp"
#include "read_piece.hpp"

namespace eredu::io {

using detail::Batch;
using detail::Next;
using detail::Piece;

namespace {
constexpr std::size_t direct_align = 4096;
bool aligned(std::uint64_t v) { return v % direct_align == 0; }
}  // namespace

struct PreadReader::Impl {
  struct BatchState {
    Batch batch;
    std::vector<Piece> pieces;
  };

  std::span<OpenFile> files;
  ReaderOptions options;
  std::mutex mutex;
  std::condition_variable wake;
  std::list<BatchState> batches;
  std::deque<Piece*> pending;
  std::vector<bool> direct_enabled;
  std::vector<detail::PageCacheProbe> probes;
  ReaderStats stats;
  bool stopping = false;
  std::vector<std::thread> workers;

  void worker() {
    std::unique_lock lock(mutex);
    for (;;) {
      wake.wait(lock, [&] { return stopping || !pending.empty(); });
      if (stopping) return;
      Piece* p = pending.front();
      pending.pop_front();
      ++p->batch->in_flight;
      const std::uint64_t pos = p->offset + p->done;
      std::byte* dst = p->dest + p->done;
      const std::uint64_t len = p->length - p->done;
      const auto& f = files[p->file];
      p->direct = f.direct && direct_enabled[p->file] && !p->buffered_only && aligned(pos) &&
                  aligned(reinterpret_cast<std::uintptr_t>(dst)) && aligned(len) &&
                  (options.direct == DirectMode::on || !probes[p->file].mostly_resident(pos, len));
      const int fd = p->direct ? f.direct.get() : f.buffered.get();
      ++stats.requests;
      ++stats.syscalls;
      stats.direct_requests += p->direct;
      lock.unlock();
      ssize_t n = ::pread(fd, dst, len, static_cast<off_t>(pos));
      long res = n < 0 ? -errno : static_cast<long>(n);
      res = detail::apply_fault(options.faults, *p, res);
      lock.lock();
      handle(*p, res);
    }
  }

  // Called with the mutex held; may drop it to run a completion.
  void handle(Piece& p, long res) {
    Batch& b = *p.batch;
    --b.in_flight;
    if (b.failure) {
      finish_piece(p);
      return;
    }
    ReadFailure failure;
    switch (detail::classify(p, res, files[p.file].path, failure, stats)) {
      case Next::finished:
        finish_piece(p);
        break;
      case Next::resubmit:
      case Next::requeue:
        pending.push_front(&p);
        wake.notify_one();
        break;
      case Next::retry_buffered:
        if (res == -EINVAL && direct_enabled[p.file]) {
          direct_enabled[p.file] = false;
          log::info("O_DIRECT read of {} refused (EINVAL): falling back to buffered reads for it",
                    files[p.file].path);
        }
        if (options.direct == DirectMode::on && res == -EINVAL) {
          fail_batch(b, {make_error_code(errc::direct_io_unsupported), {EINVAL, std::system_category()},
                         p.file, p.offset + p.done,
                         fmt::format("O_DIRECT read of {} refused and --direct on was asked", files[p.file].path)});
          finish_piece(p);
          break;
        }
        p.buffered_only = true;
        pending.push_front(&p);
        wake.notify_one();
        break;
      case Next::failed:
        fail_batch(b, std::move(failure));
        finish_piece(p);
        break;
    }
  }

  void fail_batch(Batch& b, ReadFailure failure) {
    if (!b.failure) b.failure = std::move(failure);
    for (auto it = pending.begin(); it != pending.end();) {
      if ((*it)->batch == &b) {
        it = pending.erase(it);
        --b.remaining;
      } else {
        ++it;
      }
    }
    if (b.remaining == 0 && b.done) complete(b);
  }

  void finish_piece(Piece& p) {
    Batch& b = *p.batch;
    if (--b.remaining == 0) complete(b);
  }

  void complete(Batch& b) {
    auto done = std::move(b.done);
    auto failure = std::move(b.failure);
    batches.remove_if([&b](const BatchState& s) { return &s.batch == &b; });
    done(std::move(failure));  // only posts to the handler's executor: safe under the lock
  }
};

PreadReader::PreadReader(std::span<OpenFile> files, const ReaderOptions& options)
    : impl_(std::make_unique<Impl>()) {
  if (options.depth == 0 || options.max_request == 0) {
    throw Error(errc::invalid_argument, {}, "reader depth and max request must be positive");
  }
  impl_->files = files;
  impl_->options = options;
  impl_->direct_enabled.assign(files.size(), options.direct != DirectMode::off);
  for (auto& f : files) {
    const bool probe = options.direct == DirectMode::automatic && f.direct;
    impl_->probes.emplace_back(probe ? f.buffered.get() : -1, probe ? f.size : 0);
  }
  for (unsigned i = 0; i < options.depth; ++i) impl_->workers.emplace_back([this] { impl_->worker(); });
}

PreadReader::~PreadReader() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  for (auto& w : impl_->workers) w.join();
  for (auto& s : impl_->batches) {
    auto failure = s.batch.failure ? std::move(*s.batch.failure)
                                   : ReadFailure{make_error_code(errc::cancelled), {}, 0, 0,
                                                 "the reader was destroyed before the read finished"};
    if (s.batch.done) s.batch.done(std::move(failure));
  }
}

void PreadReader::read(std::vector<ReadSegment> segments, ReadCallback done) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->stopping) {
    done(ReadFailure{make_error_code(errc::cancelled), {}, 0, 0, "reader shut down"});
    return;
  }
  auto& state = impl_->batches.emplace_back();
  state.batch.done = std::move(done);
  state.pieces = detail::split_segments(segments, &state.batch, impl_->options.max_request);
  state.batch.remaining = state.pieces.size();
  if (state.pieces.empty()) {
    impl_->complete(state.batch);
    return;
  }
  for (auto& p : state.pieces) impl_->pending.push_back(&p);
  impl_->wake.notify_all();
}

ReaderStats PreadReader::stats() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->stats;
}

std::size_t PreadReader::direct_alignment(std::uint32_t file) const noexcept {
  if (impl_->options.direct == DirectMode::off || file >= impl_->files.size()) return 0;
  return impl_->files[file].direct ? direct_align : 0;
}

std::string PreadReader::describe() const {
  return fmt::format("pread, {} threads, requests up to {} KiB", impl_->options.depth,
                     impl_->options.max_request >> 10);
}

}  // namespace eredu::io
