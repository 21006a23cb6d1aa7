#include "eredu/io/reading/checkpoint_source.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <thread>

#include <fmt/format.h>

#include "../remote/remote_catalog.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"
#include "eredu/core/printable.hpp"
#include "eredu/core/trace.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "eredu/io/reading/pread_reader.hpp"
#include "eredu/io/reading/read_fault.hpp"
#include "eredu/io/reading/regular_file.hpp"
#include "eredu/io/reading/uring_reader.hpp"
#include "eredu/io/remote/remote_url.hpp"
#include "posix_values.hpp"
#include "routing_reader.hpp"

namespace eredu::io {

using detail::sys_error;

struct CheckpointSource::Plan {
  const TensorInfo* tensor = nullptr;
  std::vector<ByteRun> runs;  // dest offsets are positions within the selected bytes
  std::uint64_t total = 0;
  std::size_t alignment = 0;  // direct-read alignment of the tensor's file, 0 for none
};

struct ChunkStream::State {
  CheckpointSource::Plan plan;
  std::uint64_t position = 0;
  std::uint64_t chunk = 0;
};

namespace {

std::uint64_t align_down(std::uint64_t v, std::uint64_t a) { return v / a * a; }
std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

/// A reader's error (file, offset, errno) with the tensor it was reading named too.
Error with_tensor(const Error& e, const TensorInfo& tensor) {
  ErrorContext context = e.context();
  context.tensor = tensor.name;
  return Error(e.kind(), std::move(context), e.detail());
}

}  // namespace

CheckpointSource::CheckpointSource(asio::any_io_executor executor, const SourceOptions& options)
    : executor_(std::move(executor)), options_(options) {}

CheckpointSource::~CheckpointSource() {
  reader_.reset();  // drains the kernel's writes into pool memory first
  if (pool_ && pool_->in_use() != 0) {
    log::warn("checkpoint source destroyed while {} bytes of leases are still held", pool_->in_use());
  }
}

void validate(const SourceOptions& options) {
  validate(options.pool);
  validate(options.reader);
  validate(options.remote);
  if (options.chunk_bytes < 1) {
    throw Error(errc::invalid_argument, {},
                fmt::format("SourceOptions::chunk_bytes is 0; it must be at least 1 (chunks are clamped to 4 KiB "
                            "pages inside the budget)"));
  }
}

namespace {

// Opens one catalog file for reading: the same file (device and inode) whose header was
// parsed, at the same size, never blocking on a FIFO.
OpenFile open_checkpoint_file(const CheckpointFile& file, DirectMode direct, std::string& no_direct_reason) {
  OpenFile f;
  f.path = file.path;
  RegularFile opened = open_regular_file(file.path);
  if (!opened) {
    if (!opened.not_regular.empty()) {
      throw Error(
          errc::file_changed, {.file = file.path},
          fmt::format("the file is now {}; it was a regular file when its header was parsed", opened.not_regular));
    }
    throw Error(errc::io_error, {.file = file.path, .os_error = opened.error}, "cannot open");
  }
  const struct stat& st = opened.status;
  if (file.inode != 0 &&
      (static_cast<std::uint64_t>(st.st_dev) != file.device || static_cast<std::uint64_t>(st.st_ino) != file.inode)) {
    throw Error(errc::file_changed, {.file = file.path}, "the file was replaced after its header was parsed");
  }
  f.size = static_cast<std::uint64_t>(st.st_size);
  if (f.size != file.size) {
    throw Error(errc::file_changed, {.file = file.path},
                fmt::format("file is {} bytes but was {} bytes when its header was parsed", f.size, file.size));
  }
  f.stamp = FileStamp::of(st);
  // Same inode and size, yet rewritten in place since the parse: the header read may not be
  // the one these bytes belong to.
  if (file.stamp.known()) {
    if (const std::string_view why = file.stamp.rewritten(f.stamp); !why.empty())
      throw Error(errc::file_changed, {.file = file.path},
                  fmt::format("the file was rewritten after its header was parsed: {}", why));
  }
  f.file_system = file_system_of(opened.fd.get(), file.path);
  f.buffered = std::move(opened.fd);
  // A FUSE server's short reply in page-cache mode leaves zeros in the page cache that a
  // later buffered read or mapping delivers as the file's bytes: on a file system eredu does
  // not trust, data is read O_DIRECT (any alignment) whatever `direct` says, where it can be.
  const bool untrusted = !f.file_system.uring_trusted;
  if (direct != DirectMode::off || untrusted) {
    RegularFile d = open_regular_file(file.path, O_DIRECT);
    if (d && (d.status.st_dev != st.st_dev || d.status.st_ino != st.st_ino)) {
      throw Error(errc::file_changed, {.file = file.path}, "the file was replaced while it was being opened");
    }
    if (d) {
      f.direct = std::move(d.fd);
      // The header was parsed with buffered reads, whose readahead a FUSE server in
      // page-cache mode may have answered short, leaving zeros cached: drop them (the
      // reader's page-cache guard checks every direct read there anyway; this saves it work).
      if (untrusted) ::posix_fadvise(f.direct.get(), 0, 0, POSIX_FADV_DONTNEED);
    } else {
      const std::string why = d.error ? d.error.message() : std::string(d.not_regular);
      if (direct == DirectMode::off) return f;  // only tried for an untrusted file system
      if (direct == DirectMode::on) {
        throw Error(errc::direct_io_unsupported, {.file = file.path, .os_error = d.error},
                    "cannot open with O_DIRECT and --direct on was asked");
      }
      no_direct_reason = why;
    }
  }
  return f;
}

}  // namespace

std::unique_ptr<CheckpointSource> CheckpointSource::open(asio::any_io_executor executor,
                                                         const std::filesystem::path& path,
                                                         const SourceOptions& options) {
  validate(options);
  // The constructor is private, out of std::make_unique's reach; the pointer is owned at once.
  std::unique_ptr<CheckpointSource> source(new CheckpointSource(executor, options));
  if (is_remote(path.native())) {
    source->open_remote(path.native());
    return source;
  }
  source->catalog_ = open_catalog(path, {.confine_to = options.confine_to});
  std::size_t no_direct = 0;
  std::string no_direct_example;
  for (const auto& file : source->catalog_.files()) {
    std::string reason;
    source->files_.push_back(open_checkpoint_file(file, options.reader.direct, reason));
    if (!reason.empty() && no_direct++ == 0) no_direct_example = fmt::format("{} ({})", file.path, reason);
  }
  if (no_direct) {
    log::info("O_DIRECT unavailable for {} of {} files, e.g. {}: reading them buffered", no_direct,
              source->files_.size(), no_direct_example);
  }
  source->pool_ = std::make_unique<LeasePool>(executor, options.pool);
  source->reader_ = make_reader(executor, source->files_, *source->pool_, options.reader);
  return source;
}

void CheckpointSource::open_remote(const std::string& location) {
  remote_ = std::make_unique<detail::RemoteSession>(options_.remote);
  detail::RemoteCheckpoint checkpoint = detail::open_remote_catalog(*remote_, location);
  catalog_ = std::move(checkpoint.catalog);
  pool_ = std::make_unique<LeasePool>(executor_, options_.pool);
  if (remote_->cache) {
    // Whole objects into the cache (or found there with the same ETag), then read as local
    // files: a cache hit is a local io_uring load.
    const std::uint64_t fills_before = remote_->cache->stats().fills;
    for (std::size_t i = 0; i < checkpoint.objects.size(); ++i) {
      const detail::RemoteObject& object = checkpoint.objects[i];
      const std::filesystem::path local =
          remote_->cache->get(CacheKey{.url = object.display, .etag = object.etag, .size = object.size},
                              [&](int fd) { detail::download_object(*remote_->client, object, options_.remote, fd); });
      CheckpointFile file = catalog_.files()[i];
      file.path = local.string();
      file.inode = 0;
      file.stamp = {};
      std::string no_direct;
      files_.push_back(open_checkpoint_file(file, options_.reader.direct, no_direct));
    }
    const std::uint64_t fetched = remote_->cache->stats().fills - fills_before;
    log::info("{}: {} of {} object{} fetched into the cache {}, the rest found there", shown_location(location),
              fetched, files_.size(), files_.size() == 1 ? "" : "s", printable(remote_->cache->dir().string()));
    reader_ = make_reader(executor_, files_, *pool_, options_.reader);
    return;
  }
  for (const auto& object : checkpoint.objects) {
    OpenFile f;
    f.path = object.display;
    f.size = object.size;
    f.remote = true;
    files_.push_back(std::move(f));
  }
  reader_ = std::make_unique<detail::RemoteReader>(*remote_->client, std::move(checkpoint.objects),
                                                   options_.remote.part_bytes, options_.remote.concurrency);
  log::debug("{}: {}", shown_location(location), reader_->describe());
}

std::unique_ptr<Reader> CheckpointSource::make_reader(const asio::any_io_executor& executor, std::span<OpenFile> files,
                                                      LeasePool& pool, const ReaderOptions& options) {
  const ReaderKind kind = options.kind;
  // Which files io_uring may read: on a file system where it can report a failed read as
  // complete (FUSE in direct_io mode does, measured in docs/reliability.md), pread.
  std::size_t untrusted = 0;
  for (auto& f : files) {
    f.read_with_pread = kind == ReaderKind::pread ||
                        (options.uring_policy == UringPolicy::by_file_system && !f.file_system.uring_trusted);
    untrusted += f.read_with_pread;
  }
  std::unique_ptr<Reader> uring;
  std::string uring_missing;
  if (untrusted < files.size()) {
    try {
      // Registered as fixed buffers: the part of the pool the files' reads can use. The pool
      // hands out its lowest free block first, so staging never goes past the files' bytes plus
      // each lease's rounding; registering beyond that would pin pages no read uses, and the
      // first read waits for the pinning (0.73 s for a 256 MiB pool, for a 1 MiB file).
      std::uint64_t files_bytes = 0;
      for (const auto& f : files) files_bytes += f.size;
      constexpr std::uint64_t mib2 = std::uint64_t{2} << 20;  // whole 2 MiB: no partial block to log about
      const std::uint64_t usable = (files_bytes + files_bytes / 8 + (std::uint64_t{4} << 20) + mib2 - 1) / mib2 * mib2;
      std::span<std::byte> registrable = pool.memory();
      if (usable < registrable.size()) registrable = registrable.first(static_cast<std::size_t>(usable));
      auto ring = std::make_unique<UringReader>(executor, files, registrable, options);
      // An idle pool returns its pages only after the ring has let go of them.
      pool.set_release_hook(ring->pool_release_hook());
      uring = std::move(ring);
    } catch (const Error& e) {
      if (kind == ReaderKind::uring || e.kind() != errc::uring_unavailable) throw;
      log::info("io_uring unavailable ({}): using the pread reader", e.what());
      uring_missing = e.what();
      for (auto& f : files) f.read_with_pread = true;
      untrusted = files.size();
    }
  }
  for (const auto& f : files) {
    const std::string fs = f.file_system.describe();
    if (kind == ReaderKind::pread) {
      log::debug("{}: pread reader, as asked (on {})", f.path, fs);
    } else if (!uring_missing.empty()) {
      log::debug("{}: pread reader: io_uring is unavailable (on {})", f.path, fs);
    } else if (f.read_with_pread) {
      log::info(
          "{}: pread reader, not io_uring: the file is on {}, where io_uring can report a failed or short read "
          "as complete (ReaderOptions::uring_policy = every_file overrides)",
          f.path, fs);
    } else if (!f.file_system.uring_trusted) {
      log::warn(
          "{}: io_uring reader on {}, as asked (uring_policy = every_file), though io_uring can report a failed "
          "read there as complete",
          f.path, fs);
    } else {
      log::debug("{}: io_uring reader (on {}, a local file system)", f.path, fs);
    }
  }
  if (untrusted == 0) return uring;
  auto pread = std::make_unique<PreadReader>(files, options);
  if (!uring) return pread;
  std::vector<bool> use_pread;
  for (const auto& f : files) use_pread.push_back(f.read_with_pread);
  return std::make_unique<detail::RoutingReader>(std::move(uring), std::move(pread), std::move(use_pread));
}

void CheckpointSource::check_unchanged(const TensorInfo& tensor) const {
  const OpenFile& f = files_[tensor.file];
  if (f.remote) return;  // every ranged GET carried If-Match: a changed object already failed
  struct stat st {};
  // On FUSE this fstat is a getattr that may drop the file's cached pages (PageCacheGuardLock).
  const PageCacheGuardLock::Hold alone = f.guard->hold_for_check();
  if (::fstat(f.buffered.get(), &st) != 0) {
    throw Error(errc::io_error, {.file = f.path, .tensor = tensor.name, .os_error = sys_error(errno)}, "cannot stat");
  }
  if (static_cast<std::uint64_t>(st.st_size) != f.size) {
    throw Error(errc::file_changed, {.file = f.path, .tensor = tensor.name, .offset = tensor.offset},
                fmt::format("the file is now {} bytes; it was {} bytes when opened, and the tensor's bytes may not "
                            "be the ones read",
                            st.st_size, f.size));
  }
  if (const std::string_view why = f.stamp.rewritten(FileStamp::of(st)); !why.empty()) {
    throw Error(
        errc::file_changed, {.file = f.path, .tensor = tensor.name, .offset = tensor.offset},
        fmt::format("the file was modified while it was read, so the tensor's bytes may mix two versions: {}", why));
  }
}

CheckpointSource::Plan CheckpointSource::make_plan(const TensorReadRequest& request) const {
  Plan plan;
  plan.tensor = &catalog_.at(request.key);
  const auto& t = *plan.tensor;
  const auto& file = catalog_.file_of(t).path;
  if (auto why = request.selection.check(t.shape); !why.empty()) {
    throw Error(errc::invalid_selection, {.file = file, .tensor = t.name},
                fmt::format("selection {} of shape {}: {}", request.selection.to_string(), format_shape(t.shape), why));
  }
  if (!request.selection.is_all() && dtype_bits(t.dtype) % 8 != 0) {
    throw Error(errc::invalid_selection, {.file = file, .tensor = t.name},
                fmt::format("partial selections of {} (sub-byte elements) are not supported", dtype_name(t.dtype)));
  }
  if (auto why = selection_block_error(t.shape, t.dtype, request.selection); !why.empty()) {
    throw Error(errc::invalid_selection, {.file = file, .tensor = t.name},
                fmt::format("selection {} of shape {}: {}", request.selection.to_string(), format_shape(t.shape), why));
  }
  plan.runs = selection_runs(t.shape, t.dtype, request.selection);
  for (const auto& r : plan.runs) plan.total += r.length;
  plan.alignment = reader_->direct_alignment(t.file);
  return plan;
}

SourceCapabilities CheckpointSource::capabilities() const {
  SourceCapabilities caps;
  for (std::uint32_t f = 0; f < files_.size(); ++f) {
    caps.maps_pages = caps.maps_pages || files_[f].file_system.uring_trusted;
    caps.window_alignment = std::max(caps.window_alignment, reader_->direct_alignment(f));
  }
  caps.direct_windows = caps.window_alignment != 0;
  caps.request_bytes = remote_ && !remote_->cache ? options_.remote.part_bytes : options_.reader.max_request;
  caps.concurrency = remote_ && !remote_->cache ? options_.remote.concurrency : options_.reader.depth;
  caps.trusted_errors = true;
  return caps;
}

std::uint64_t CheckpointSource::selected_bytes(const TensorReadRequest& request) const {
  return make_plan(request).total;
}

asio::awaitable<Lease> CheckpointSource::read_chunk(const Plan& plan, std::uint64_t offset, std::uint64_t length) {
  const auto& t = *plan.tensor;
  if (length == 0) co_return Lease(StagingBuffer{}, 0, 0, &t, offset, plan.total);
  // Find the runs that overlap [offset, offset + length) of the selected bytes.
  auto first = std::upper_bound(plan.runs.begin(), plan.runs.end(), offset,
                                [](std::uint64_t v, const ByteRun& r) { return v < r.dest_offset; });
  --first;
  std::vector<ReadSegment> segments;
  std::size_t buffer_bytes = length;
  std::size_t view = 0;
  const std::uint64_t end = offset + length;
  const bool one_run = first->dest_offset + first->length >= end;
  const std::uint64_t file_off = t.offset + first->source_offset + (offset - first->dest_offset);
  std::uint64_t window_start = 0;
  if (one_run && plan.alignment) {
    // A page-aligned window around the bytes lets the reader use O_DIRECT.
    window_start = align_down(file_off, plan.alignment);
    const std::uint64_t window_end = align_up(file_off + length, plan.alignment);
    if (window_end - window_start <= pool_->budget()) {
      buffer_bytes = window_end - window_start;
      view = file_off - window_start;
    }
  }
  StagingBuffer buffer;
  const std::uint64_t waited_from = trace::enabled() ? trace::now_ns() : 0;
  try {
    buffer = co_await pool_->async_acquire(buffer_bytes, asio::use_awaitable);
    if (waited_from) {
      trace::record("wait for staging", "io", waited_from, trace::now_ns(),
                    fmt::format("{}: {} bytes", t.name, buffer_bytes));
    }
  } catch (const Error& e) {
    const auto& file = catalog_.file_of(t).path;
    if (e.kind() == errc::exceeds_budget) {
      throw Error(errc::exceeds_budget, {.file = file, .tensor = t.name},
                  fmt::format("needs {} bytes of staging but the budget is {} bytes: read it with "
                              "ReadPolicy::chunked (stream) or raise the budget",
                              buffer_bytes, pool_->budget()));
    }
    throw Error(errc::cancelled, {.file = file, .tensor = t.name}, "waiting for staging memory was cancelled");
  }
  const std::uint64_t read_from = trace::enabled() ? trace::now_ns() : 0;
  if (view || buffer_bytes != length) {
    co_await read_window(t, file_off, length, window_start, buffer.data(), buffer_bytes);
  } else {
    for (auto it = first; it != plan.runs.end() && it->dest_offset < end; ++it) {
      const std::uint64_t b = std::max(offset, it->dest_offset);
      const std::uint64_t e = std::min(end, it->dest_offset + it->length);
      segments.push_back(
          {t.file, t.offset + it->source_offset + (b - it->dest_offset), buffer.data() + (b - offset), e - b, e - b});
    }
    try {
      co_await reader_->async_read(std::move(segments), executor_, asio::use_awaitable);
    } catch (const Error& e) {
      throw with_tensor(e, t);
    }
  }
  check_unchanged(t);
  if (read_from) {
    trace::record("read tensor", "io", read_from, trace::now_ns(),
                  fmt::format("{}: bytes {}..{} of {}", t.name, offset, offset + length, plan.total));
  }
  co_return Lease(std::move(buffer), view, length, &t, offset, plan.total);
}

asio::awaitable<void> CheckpointSource::read_window(const TensorInfo& t, std::uint64_t file_off, std::uint64_t length,
                                                    std::uint64_t window_start, std::byte* window,
                                                    std::uint64_t window_bytes) {
  const std::uint64_t view = file_off - window_start;
  std::vector<ReadSegment> segments{{t.file, window_start, window, window_bytes, view + length}};
  std::exception_ptr failure;
  try {
    co_await reader_->async_read(std::move(segments), executor_, asio::use_awaitable);
  } catch (const Error& e) {
    // A direct-read window also covers bytes of the neighbouring tensors: a failure may lie
    // there, and must not be reported against this tensor. Read this tensor's bytes alone.
    if (e.kind() != errc::io_error) throw with_tensor(e, t);
    log::debug("{}: read of the aligned window around tensor '{}' failed ({}): reading its bytes alone",
               catalog_.file_of(t).path, t.name, e.what());
    failure = std::current_exception();
  }
  if (!failure) {
    // The window read the bytes around the selection too, up to the end of the file.
    const std::uint64_t file_end = std::min<std::uint64_t>(window_start + window_bytes, files_[t.file].size);
    alignment_bytes_.fetch_add(file_end - window_start - length, std::memory_order_relaxed);
    co_return;
  }
  std::vector<ReadSegment> exact{{t.file, file_off, window + view, length, length}};
  try {
    co_await reader_->async_read(std::move(exact), executor_, asio::use_awaitable);
  } catch (const Error& e) {
    throw with_tensor(e, t);
  }
}

namespace {

/// The page-aligned window around a plan's bytes: none unless they are one non-empty run of a
/// file with a direct-read alignment.
std::optional<DirectWindow> window_of(const TensorInfo& t, const std::vector<ByteRun>& runs, std::uint64_t total,
                                      std::uint64_t alignment) {
  if (runs.size() != 1 || total == 0 || !alignment) return std::nullopt;
  const std::uint64_t file_off = t.offset + runs.front().source_offset;
  const std::uint64_t start = align_down(file_off, alignment);
  return DirectWindow{file_off - start, align_up(file_off + total, alignment) - start};
}

}  // namespace

std::optional<DirectWindow> CheckpointSource::direct_window(const TensorReadRequest& request) const {
  const Plan plan = make_plan(request);
  const std::optional<DirectWindow> w = window_of(*plan.tensor, plan.runs, plan.total, plan.alignment);
  if (!w) return std::nullopt;
  const std::uint64_t start = plan.tensor->offset + plan.runs.front().source_offset - w->lead;
  return reader_->reads_direct(plan.tensor->file, start, w->bytes) ? w : std::nullopt;
}

asio::awaitable<void> CheckpointSource::read_window_into(std::unique_ptr<TensorReadRequest> owned,
                                                         std::span<std::byte> window) {
  const Plan plan = make_plan(*owned);
  const TensorInfo& t = *plan.tensor;
  const std::optional<DirectWindow> w = window_of(t, plan.runs, plan.total, plan.alignment);
  if (!w || window.size() != w->bytes || reinterpret_cast<std::uintptr_t>(window.data()) % plan.alignment != 0) {
    throw Error(errc::invalid_argument, {.file = catalog_.file_of(t).path, .tensor = t.name},
                fmt::format("a direct-read window of selection {} needs one run of a file read O_DIRECT and {} bytes "
                            "aligned to {}; got {} bytes at {}",
                            owned->selection.to_string(), w ? w->bytes : 0, plan.alignment, window.size(),
                            static_cast<const void*>(window.data())));
  }
  const std::uint64_t file_off = t.offset + plan.runs.front().source_offset;
  co_await read_window(t, file_off, plan.total, file_off - w->lead, window.data(), window.size());
  check_unchanged(t);
}

asio::awaitable<Lease> CheckpointSource::read_lease(std::unique_ptr<TensorReadRequest> owned) {
  const TensorReadRequest& request = *owned;
  Plan plan = make_plan(request);
  if (LeasePool::block_size(plan.total) > pool_->budget()) {
    throw Error(errc::exceeds_budget, {.file = catalog_.file_of(*plan.tensor).path, .tensor = plan.tensor->name},
                fmt::format("selection {} needs {} bytes but the staging budget is {} bytes: read it with "
                            "ReadPolicy::chunked (stream) or raise the budget",
                            request.selection.to_string(), plan.total, pool_->budget()));
  }
  Lease lease = co_await read_chunk(plan, 0, plan.total);
  co_return lease;
}

asio::awaitable<void> CheckpointSource::read_into(std::unique_ptr<TensorReadRequest> owned,
                                                  std::span<std::byte> destination) {
  Plan plan = make_plan(*owned);
  const auto& t = *plan.tensor;
  if (destination.size() != plan.total) {
    throw Error(errc::invalid_argument, {.file = catalog_.file_of(t).path, .tensor = t.name},
                fmt::format("destination holds {} bytes but the selection has {}", destination.size(), plan.total));
  }
  std::vector<ReadSegment> segments;
  for (const auto& r : plan.runs) {
    segments.push_back({t.file, t.offset + r.source_offset, destination.data() + r.dest_offset, r.length, r.length});
  }
  try {
    co_await reader_->async_read(std::move(segments), executor_, asio::use_awaitable);
  } catch (const Error& e) {
    throw with_tensor(e, t);
  }
  check_unchanged(t);
}

std::optional<MappedView> CheckpointSource::map_resident(const TensorReadRequest& request) const {
  Plan plan = make_plan(request);
  FaultInjector* faults = options_.reader.faults;
  if (!options_.map_resident || (faults && !faults->allow_mapping()) || plan.runs.size() != 1 || plan.total == 0) {
    return std::nullopt;
  }
  const TensorInfo& t = *plan.tensor;
  const OpenFile& file = files_[t.file];
  // The page cache of an untrusted file system can hold zeros where the file has bytes
  // (see open_checkpoint_file): its files are only read O_DIRECT, never mapped.
  if (!file.file_system.uring_trusted) return std::nullopt;
  std::optional<MappedView> mapped;
  try {
    mapped.emplace(file.buffered.get(), t.offset + plan.runs.front().source_offset, plan.total, file.path, t.name,
                   file.size, file.stamp);
  } catch (const Error& e) {
    // A file system without mmap, or no address space left: the pool path still works.
    log::debug("not mapping {}: {}", t.name, e.what());
    return std::nullopt;
  }
  MappedView& view = *mapped;
  // Sampled, as the reader's O_DIRECT choice is: a missed page is read in by the fault
  // (slower, still correct), and checking every page of a large tensor costs a copy's time.
  constexpr unsigned samples = 17;
  if (!view.looks_resident(samples)) return std::nullopt;
  if (faults) faults->on_map(t.file, t.offset + plan.runs.front().source_offset, plan.total);
  return mapped;
}

std::optional<MappedTensor> CheckpointSource::map_tensor(const TensorReadRequest& request) const {
  Plan plan = make_plan(request);
  FaultInjector* faults = options_.reader.faults;
  if ((faults && !faults->allow_mapping()) || plan.runs.size() != 1 || plan.total == 0) return std::nullopt;
  const TensorInfo& t = *plan.tensor;
  const OpenFile& file = files_[t.file];
  // As map_resident: an untrusted file system's page cache can hold zeros where the file
  // has bytes, and a weight mapped from it would serve them for as long as it lives.
  if (!file.file_system.uring_trusted) return std::nullopt;
  const std::uint64_t offset = t.offset + plan.runs.front().source_offset;
  try {
    std::shared_ptr<const MappedFile> mapped;
    {
      std::lock_guard lock(mapped_files_mutex_);
      if (mapped_files_.size() < files_.size()) mapped_files_.resize(files_.size());
      if (!mapped_files_[t.file]) mapped_files_[t.file] = std::make_shared<const MappedFile>(file);
      mapped = mapped_files_[t.file];
    }
    std::optional<MappedTensor> out;
    out.emplace(std::move(mapped), t.name, offset, plan.total);
    if (faults) faults->on_map(t.file, offset, plan.total);
    return out;
  } catch (const Error& e) {
    // No descriptor or address space left, or a file system without mmap: copy instead.
    log::debug("not mapping {} as weight storage: {}", t.name, e.what());
    return std::nullopt;
  }
}

ChunkStream CheckpointSource::stream(TensorReadRequest request) {
  auto state = std::make_unique<ChunkStream::State>();
  state->plan = make_plan(request);
  // Leave room for the direct-read window around each chunk.
  const std::uint64_t slack = 2 * LeasePool::alignment;
  std::uint64_t chunk = std::min<std::uint64_t>(options_.chunk_bytes,
                                                pool_->budget() > slack ? pool_->budget() - slack : pool_->budget());
  state->chunk = std::max<std::uint64_t>(LeasePool::alignment, chunk / LeasePool::alignment * LeasePool::alignment);
  return ChunkStream(this, std::move(state));
}

ChunkStream::ChunkStream(CheckpointSource* source, std::unique_ptr<State> state)
    : source_(source), state_(std::move(state)) {}
ChunkStream::ChunkStream(ChunkStream&&) noexcept = default;
ChunkStream& ChunkStream::operator=(ChunkStream&&) noexcept = default;
ChunkStream::~ChunkStream() = default;

std::uint64_t ChunkStream::total() const noexcept { return state_->plan.total; }
std::uint64_t ChunkStream::remaining() const noexcept { return state_->plan.total - state_->position; }

asio::awaitable<std::optional<Lease>> ChunkStream::next(CheckpointSource* source, State* state) {
  auto& s = *state;
  if (s.position >= s.plan.total) co_return std::nullopt;
  std::uint64_t length = std::min(s.chunk, s.plan.total - s.position);
  if (s.plan.runs.size() == 1 && s.plan.alignment && length < s.plan.total - s.position) {
    // End chunks on aligned file offsets, so every direct-read window after the first is
    // exactly one chunk (one request) instead of a chunk plus a page.
    const auto& run = s.plan.runs.front();
    const std::uint64_t file_pos = s.plan.tensor->offset + run.source_offset + (s.position - run.dest_offset);
    const std::uint64_t end = (file_pos + length) / s.plan.alignment * s.plan.alignment;
    if (end > file_pos) length = end - file_pos;
  }
  Lease lease = co_await source->read_chunk(s.plan, s.position, length);
  s.position += length;
  co_return std::optional<Lease>(std::move(lease));
}

void detail::start_open_thread(asio::any_io_executor executor, std::filesystem::path path, SourceOptions options,
                               UniqueFunction<void(std::exception_ptr, std::unique_ptr<CheckpointSource>)> done) {
  // Header parsing is blocking file I/O: keep it off the caller's event loop.
  std::thread([ex = std::move(executor), p = std::move(path), o = std::move(options), d = std::move(done)]() mutable {
    std::unique_ptr<CheckpointSource> source;
    std::exception_ptr error;
    try {
      source = CheckpointSource::open(ex, p, o);
    } catch (...) {
      error = std::current_exception();
    }
    d(error, std::move(source));
  }).detach();
}

}  // namespace eredu::io
