#include "reader_core.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"
#include "eredu/core/trace.hpp"

namespace eredu::io::detail {
namespace {
bool aligned(std::uint64_t v) { return v % ReaderCore::direct_align == 0; }
}  // namespace

ReaderCore::ReaderCore(std::span<OpenFile> f, const ReaderOptions& o) : files(f), options(o) {
  validate(options);
  direct_enabled_.assign(files.size(), options.direct != DirectMode::off);
  // Files on untrusted file systems are read O_DIRECT whatever the mode (see want_direct).
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (!files[i].file_system.uring_trusted && files[i].direct) direct_enabled_[i] = true;
  }
  probes_.reserve(files.size());
  for (auto& file : files) {
    // Only `automatic` asks the page cache, and the page-cache guard of an untrusted file
    // system; the mapping costs address space, nothing else.
    const bool probe = (options.direct == DirectMode::automatic || !file.file_system.uring_trusted) && file.direct;
    probes_.emplace_back(probe ? file.buffered.get() : -1, probe ? file.size : 0);
  }
  drops_ = std::make_unique<DropState[]>(files.size());
}

bool ReaderCore::guarded(const Piece& p) const noexcept {
  // Unmapped (FUSE in direct_io mode refuses shared mappings) means no page cache behind
  // the file's reads, hence no fallback to guard against.
  return p.direct && !files[p.file].file_system.uring_trusted && probes_[p.file].mapped();
}

ReaderCore::CacheTicket ReaderCore::guard_before(std::uint32_t file, std::uint64_t pos, std::uint64_t len) {
  DropState& d = drops_[file];
  if (probes_[file].first_resident(pos, len)) {
    // Whole pages, the partial ones at both ends included: POSIX_FADV_DONTNEED keeps a
    // partial page. Another guarded read whose fallback used one of these pages sees the
    // generation move and trusts nothing of its result.
    const std::uint64_t begin = pos / direct_align * direct_align;
    const std::uint64_t end = (pos + len + direct_align - 1) / direct_align * direct_align;
    d.running.fetch_add(1);
    d.generation.fetch_add(1);
    ::posix_fadvise(files[file].buffered.get(), static_cast<off_t>(begin), static_cast<off_t>(end - begin),
                    POSIX_FADV_DONTNEED);
    d.generation.fetch_add(1);
    d.running.fetch_sub(1);
  }
  // The generation first: a drop that began before it is then still seen running.
  CacheTicket t;
  t.generation = d.generation.load();
  t.drops_running = d.running.load() != 0;
  return t;
}

std::uint64_t ReaderCore::guard_after(std::uint32_t file, const CacheTicket& ticket, std::uint64_t pos, std::uint64_t n,
                                      bool& cached) const {
  const std::optional<std::uint64_t> first = probes_[file].first_resident(pos, n);
  cached = first.has_value();
  const DropState& d = drops_[file];
  if (ticket.drops_running || d.generation.load() != ticket.generation) return 0;  // pages may have gone
  if (!first) return n;
  // The kernel's fallback began at the first byte the server did not send and left every
  // page it copied from cached: the bytes before the first cached page came from the server.
  return *first > pos ? std::min(n, *first - pos) : 0;
}

bool ReaderCore::size_shrunk(std::uint32_t file) const noexcept {
  struct statx sx {};
  const int fd = files[file].buffered.get();
  if (::statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_SIZE, &sx) != 0) return false;
  return (sx.stx_mask & STATX_SIZE) && sx.stx_size < files[file].size;
}

std::uint64_t ReaderCore::trusted_after_guarded_read(std::uint32_t file, const CacheTicket& ticket, std::uint64_t pos,
                                                     std::uint64_t n, std::uint64_t requested, bool& cached) const {
  std::uint64_t trusted = guard_after(file, ticket, pos, n, cached);
  if (!cached && size_shrunk(file)) {
    trusted = 0;
    cached = true;
  }
  if (!cached && trusted == n && n == requested) files[file].guard->answered_in_full();
  if (cached && files[file].guard->go_serial())
    log::info(
        "{}: the server answered a read short in page-cache mode: reading the file one request at a time from "
        "now on",
        files[file].path);
  return trusted;
}

void ReaderCore::on_cache_suspect(Piece& p, bool cached) {
  Batch& b = *p.batch;
  if (b.failure) {
    finish_piece(p);
    return;
  }
  if (++p.cache_retries > max_cache_retries) {
    const std::uint64_t at = p.offset + p.done;
    fail(b, {make_error_code(errc::io_error),
             {},
             p.file,
             at,
             fmt::format("{}: {} direct reads in a row at offset {} may have been completed from the page cache, which "
                         "on {} can hold zeros after a server's short reply; refusing to deliver them",
                         files[p.file].path, p.cache_retries, at, files[p.file].file_system.describe())});
    finish_piece(p);
    return;
  }
  if (cached) p.request_limit = std::max<std::uint64_t>(1, p.submitted / 2);
  pending.push_front(&p);
}

void ReaderCore::add(const std::vector<ReadSegment>& segments, ReadCallback done, BatchId id) {
  auto& state = batches_.emplace_back();
  state.batch.id = id;
  state.batch.done = std::move(done);
  state.pieces = split_segments(segments, &state.batch, options.max_request);
  state.batch.remaining = state.pieces.size();
  if (state.pieces.empty()) {
    complete(state.batch);
    return;
  }
  for (auto& p : state.pieces) pending.push_back(&p);
}

Batch* ReaderCore::find(BatchId id) noexcept {
  if (id == 0) return nullptr;
  for (auto& s : batches_)
    if (s.batch.id == id) return &s.batch;
  return nullptr;
}

std::span<Piece> ReaderCore::pieces_of(Batch& b) noexcept {
  for (auto& s : batches_)
    if (&s.batch == &b) return s.pieces;
  return {};
}

void ReaderCore::cancel(Batch& b) {
  const std::span<Piece> pieces = pieces_of(b);
  const std::uint32_t file = pieces.empty() ? 0 : pieces.front().file;
  const std::uint64_t offset = pieces.empty() ? 0 : pieces.front().offset;
  fail(b, {make_error_code(errc::cancelled), {}, file, offset, "the read was cancelled"});
  if (b.remaining == 0) complete(b);  // nothing of it was in flight
}

bool ReaderCore::want_direct(const Piece& p, std::uint64_t pos, const std::byte* dst, std::uint64_t len) {
  if (!files[p.file].direct || !direct_enabled_[p.file] || p.buffered_only) return false;
  // On FUSE, NFS and the like, O_DIRECT goes to the server for any offset and length, and
  // keeps the kernel's page cache out: a FUSE server's short reply in page-cache mode makes
  // the kernel cache zeros after it, which a later read would deliver as the file's bytes.
  if (!files[p.file].file_system.uring_trusted) return true;
  if (!aligned(pos) || !aligned(reinterpret_cast<std::uintptr_t>(dst)) || !aligned(len)) return false;
  if (options.direct == DirectMode::on) return true;
  return !probes_[p.file].mostly_resident(pos, len);
}

void ReaderCore::on_result(Piece& p, long res, bool fault_applied) {
  Batch& b = *p.batch;
  if (b.failure) {
    finish_piece(p);
    return;
  }
  if (!fault_applied) res = apply_fault(options.faults, p, res);
  if (p.issued_ns) {
    trace::record("read", "io", p.issued_ns, trace::now_ns(),
                  fmt::format("{} offset {} asked {} got {}{}", files[p.file].path, p.offset + p.done, p.submitted, res,
                              p.direct ? " O_DIRECT" : ""));
    p.issued_ns = 0;
  }
  if (res > 0) p.cache_retries = 0;
  ReadFailure failure;
  Next next;
  {
    std::lock_guard lock(stats_mutex_);
    next = classify(p, res, files[p.file].path, failure, stats_);
  }
  const bool untrusted = !files[p.file].file_system.uring_trusted;
  if (untrusted && res > 0 && next == Next::retry_buffered) next = Next::resubmit;  // stay direct (see want_direct)
  if (untrusted && res > 0 && next == Next::resubmit && !p.direct) {
    // A short buffered read there means the server said the file ended (FUSE page-cache
    // mode), and the kernel may now hold zeros for what follows: never read on into them.
    fail(b, {make_error_code(errc::unexpected_eof),
             {},
             p.file,
             p.offset + p.done,
             fmt::format("{} returned {} bytes where {} were asked at offset {}, before the end of the file: on {} "
                         "a short buffered read means the server ended the file there, and the page cache may hold "
                         "zeros after it (read it with O_DIRECT: direct automatic or on)",
                         files[p.file].path, res, p.submitted, p.offset + p.done - static_cast<std::uint64_t>(res),
                         files[p.file].file_system.describe())});
    finish_piece(p);
    return;
  }
  switch (next) {
    case Next::finished:
      finish_piece(p);
      return;
    case Next::resubmit:
    case Next::requeue:
      pending.push_front(&p);
      return;
    case Next::retry_buffered:
      if (res == -EINVAL) {
        if (options.direct == DirectMode::on) {
          fail(b, {make_error_code(errc::direct_io_unsupported),
                   {EINVAL, std::system_category()},
                   p.file,
                   p.offset + p.done,
                   fmt::format("O_DIRECT read of {} refused (EINVAL) and --direct on was asked", files[p.file].path)});
          finish_piece(p);
          return;
        }
        if (direct_enabled_[p.file]) {
          direct_enabled_[p.file] = false;
          log::info("O_DIRECT read of {} refused (EINVAL): falling back to buffered reads for it", files[p.file].path);
        }
      }
      p.buffered_only = true;
      pending.push_front(&p);
      return;
    case Next::failed:
      fail(b, std::move(failure));
      finish_piece(p);
      return;
  }
}

void ReaderCore::fail(Batch& b, ReadFailure failure) {
  if (!b.failure) b.failure = std::move(failure);
  // Pieces not yet issued never will be: account them as finished now.
  for (auto it = pending.begin(); it != pending.end();) {
    if ((*it)->batch == &b) {
      it = pending.erase(it);
      --b.remaining;
    } else {
      ++it;
    }
  }
}

void ReaderCore::fail_all(const ReadFailure& failure) {
  for (auto& s : batches_) fail(s.batch, failure);
}

void ReaderCore::finish_piece(Piece& p) {
  Batch& b = *p.batch;
  if (--b.remaining == 0) complete(b);
}

void ReaderCore::complete(Batch& b) {
  auto done = std::move(b.done);
  auto failure = std::move(b.failure);
  batches_.remove_if([&b](const BatchState& s) { return &s.batch == &b; });
  done(failure ? to_exception(*failure) : nullptr);  // posts to the handler's executor; never runs it here
}

void ReaderCore::cancel_all() {
  pending.clear();
  for (auto& s : batches_) {
    auto failure =
        s.batch.failure
            ? std::move(*s.batch.failure)
            : ReadFailure{
                  make_error_code(errc::cancelled), {}, 0, 0, "the reader was destroyed before the read finished"};
    if (s.batch.done) s.batch.done(to_exception(failure));
  }
  batches_.clear();
}

std::exception_ptr ReaderCore::to_exception(const ReadFailure& f) const {
  const errc kind = f.code.category() == error_category() ? static_cast<errc>(f.code.value()) : errc::io_error;
  return std::make_exception_ptr(Error(
      kind,
      {.file = f.file < files.size() ? files[f.file].path : std::string{}, .offset = f.offset, .os_error = f.os_error},
      f.detail));
}

std::size_t ReaderCore::direct_alignment(std::uint32_t file) const noexcept {
  // Direct reads of an untrusted file system need no alignment (want_direct), so no window.
  if (file >= files.size() || !files[file].file_system.uring_trusted) return 0;
  if (options.direct == DirectMode::off) return 0;
  return files[file].direct ? direct_align : 0;
}

bool ReaderCore::reads_direct(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const noexcept {
  if (direct_alignment(file) == 0 || !direct_enabled_[file]) return false;
  if (options.direct == DirectMode::on) return true;
  return !probes_[file].mostly_resident(offset, length);
}

void ReaderCore::count_request(Piece& p, bool fixed_buffer) {
  p.issued_ns = trace::enabled() ? trace::now_ns() : 0;
  std::lock_guard lock(stats_mutex_);
  ++stats_.requests;
  stats_.direct_requests += p.direct;
  stats_.fixed_buffer_requests += fixed_buffer;
}

void ReaderCore::count_cache_redo() {
  std::lock_guard lock(stats_mutex_);
  ++stats_.cache_redone;
}

void ReaderCore::count_syscall() {
  std::lock_guard lock(stats_mutex_);
  ++stats_.syscalls;
}

ReaderStats ReaderCore::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

}  // namespace eredu::io::detail

namespace eredu::io {

BatchId Reader::new_batch_id() noexcept {
  static std::atomic<BatchId> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

void validate(const ReaderOptions& o) {
  auto bad = [](const std::string& what) { throw Error(errc::invalid_argument, {}, what); };
  if (o.depth < 1 || o.depth > ReaderOptions::max_depth) {
    bad(fmt::format("ReaderOptions::depth is {}; it must be 1..{}", o.depth, ReaderOptions::max_depth));
  }
  if (o.max_request < 1 || o.max_request > ReaderOptions::max_request_limit) {
    bad(fmt::format("ReaderOptions::max_request is {} bytes; it must be 1..{}", o.max_request,
                    ReaderOptions::max_request_limit));
  }
  if (o.kind != ReaderKind::automatic && o.kind != ReaderKind::uring && o.kind != ReaderKind::pread) {
    bad(fmt::format("ReaderOptions::kind is {}; it must be automatic, uring or pread", static_cast<int>(o.kind)));
  }
  if (o.direct != DirectMode::automatic && o.direct != DirectMode::on && o.direct != DirectMode::off) {
    bad(fmt::format("ReaderOptions::direct is {}; it must be automatic, on or off", static_cast<int>(o.direct)));
  }
  if (o.uring_policy != UringPolicy::by_file_system && o.uring_policy != UringPolicy::every_file) {
    bad(fmt::format("ReaderOptions::uring_policy is {}; it must be by_file_system or every_file",
                    static_cast<int>(o.uring_policy)));
  }
}

}  // namespace eredu::io
