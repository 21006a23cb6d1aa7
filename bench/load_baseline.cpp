// Baselines for bench/load.sh: the physical limits an `eredu load` into CPU tensors is
// measured against (see "What fast means here" in DESIGN.md). Each mode prints one JSON line
// with mode, bytes, seconds, gb_per_s (1e9 bytes/s), threads and peak_rss_bytes.
//
//   populated-pread FILE  (a) the one-copy limit: pread of the whole file into a buffer that was
//                         populated first (untimed), in 4 MiB pieces over N threads. What a load
//                         into recycled, resident storage cannot beat.
//   populate BYTES        (b) the populate limit: first touch of BYTES of fresh anonymous memory
//                         on N threads. What a first load into fresh storage cannot beat.
//   malloc-pread FILE     (c) a naive loader: malloc(size) and one sequential pread loop, one
//                         thread; the page faults happen inside the kernel's copy.
//   blocks FILE           (e) the strongest simple scheme seen (Run:ai Model Streamer's): one
//                         fresh malloc buffer of the file's size, the file cut into one
//                         contiguous range per thread, each thread read()ing its range in
//                         2 MiB blocks on its own descriptor; the kernel faults each page of
//                         the buffer as it copies into it. --block B changes the block size.
//   mapped-widen FILE     (d) the conversion limit: the file's bytes, read through a mapping of
//                         the page cache as bf16, widened to f32 into a populated buffer twice
//                         the size (untimed populate), 4 MiB pieces over N threads, AVX2 with
//                         streaming stores where the CPU has it; three passes, the mean of
//                         passes 2-3 reported. What a bf16->f32 load into recycled storage
//                         cannot beat, at N threads.
//
// "First touch" writes one byte per 4 KiB page rather than memsetting every byte: the page
// fault (the kernel zeroing a page, and on these VMs the host backing it again) is the cost a
// loader cannot avoid, while filling the bytes is the copy it does anyway and is measured by (a).
// With THP in "madvise" mode a plain mapping gets 4 KiB pages; --hugepages asks for 2 MiB ones
// (populate: MADV_HUGEPAGE, then MADV_POPULATE_WRITE per 2 MiB, as eredu's storage pool did).
// --cold (file modes) drops the page cache first (as root: sync, then echo 3 into
// /proc/sys/vm/drop_caches), untimed; the JSON line then says "cold":true.
//
// usage: load_baseline populated-pread FILE [--threads N] [--hugepages]
//        load_baseline populate BYTES [--threads N] [--hugepages]     (BYTES: 512M, 4G, 4294967296)
//        load_baseline malloc-pread FILE [--cold]
//        load_baseline blocks FILE [--threads N] [--block B] [--cold]
//        load_baseline mapped-widen FILE [--threads N] [--hugepages]
#include <fcntl.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

namespace {

constexpr std::size_t page_bytes = 4096;
constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;
constexpr std::size_t piece_bytes = std::size_t{4} << 20;      // the parallel pread request size
constexpr std::size_t max_pread_bytes = std::size_t{1} << 30;  // a naive loop's largest request

/// Prints "load_baseline: WHAT: strerror (errno N)" (errno omitted when 0) and exits with 1.
[[noreturn]] void fail(const std::string& what, int err) {
  if (err != 0) {
    fmt::print(stderr, "load_baseline: {}: {} (errno {})\n", what, std::strerror(err), err);
  } else {
    fmt::print(stderr, "load_baseline: {}\n", what);
  }
  std::exit(1);
}

/// Prints the usage and exits with 2.
[[noreturn]] void usage() {
  std::fputs(
      "usage: load_baseline populated-pread FILE [--threads N] [--hugepages]\n"
      "       load_baseline populate BYTES [--threads N] [--hugepages]\n"
      "       load_baseline malloc-pread FILE [--cold]\n"
      "       load_baseline blocks FILE [--threads N] [--block B] [--cold]\n"
      "       load_baseline mapped-widen FILE [--threads N] [--hugepages]\n",
      stderr);
  std::exit(2);
}

/// Parses a byte count such as 4294967296, 512M, 4G or 4GiB (binary units, as `eredu gen`).
std::uint64_t parse_bytes(std::string_view text) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0 || digits > 19) fail(fmt::format("'{}' is not a byte count (e.g. 512M, 4G)", text), 0);
  std::uint64_t value = std::stoull(std::string(text.substr(0, digits)));
  std::string unit(text.substr(digits));
  if (unit.ends_with("iB") || unit.ends_with("ib"))
    unit.resize(unit.size() - 2);
  else if (unit.size() > 1 && (unit.back() == 'B' || unit.back() == 'b'))
    unit.pop_back();
  int shift = 0;
  if (unit.empty() || unit == "B" || unit == "b")
    shift = 0;
  else if (unit == "K" || unit == "k")
    shift = 10;
  else if (unit == "M" || unit == "m")
    shift = 20;
  else if (unit == "G" || unit == "g")
    shift = 30;
  else if (unit == "T" || unit == "t")
    shift = 40;
  else
    fail(fmt::format("'{}' is not a byte count (e.g. 512M, 4G)", text), 0);
  if (value > (UINT64_MAX >> shift)) fail(fmt::format("'{}' does not fit in 64 bits", text), 0);
  return value << shift;
}

/// Peak resident set of this process so far, in bytes.
std::uint64_t peak_rss_bytes() {
  rusage usage{};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) fail("getrusage", errno);
  return static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

/// Seconds on the steady clock, for intervals.
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Quotes a string for JSON (paths may hold quotes, backslashes or control characters).
std::string json_quoted(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

/// Prints the one JSON line of a mode's result.
void print_result(std::string_view mode, const std::optional<std::string>& path, std::uint64_t bytes, double seconds,
                  unsigned threads, bool hugepages, bool cold = false) {
  std::string path_field = path ? fmt::format("\"path\":{},", json_quoted(*path)) : std::string();
  fmt::print(
      "{{\"mode\":\"{}\",{}\"bytes\":{},\"seconds\":{:.6f},\"gb_per_s\":{:.4f},\"threads\":{},"
      "\"hugepages\":{},\"cold\":{},\"peak_rss_bytes\":{}}}\n",
      mode, path_field, bytes, seconds, static_cast<double>(bytes) / seconds / 1e9, threads,
      hugepages ? "true" : "false", cold ? "true" : "false", peak_rss_bytes());
}

/// Empties the page cache (untimed) so the next read comes from the disk: sync, then
/// "3" into /proc/sys/vm/drop_caches, which needs root.
void drop_caches() {
  ::sync();
  const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd < 0) fail("--cold needs root: cannot open /proc/sys/vm/drop_caches", errno);
  const bool ok = ::write(fd, "3", 1) == 1;
  const int err = errno;
  ::close(fd);
  if (!ok) fail("writing /proc/sys/vm/drop_caches", err);
}

/// A private anonymous mapping, unmapped when it goes out of scope.
class AnonMapping {
 public:
  /// Maps `bytes` of fresh memory (no page is touched); with `hugepages`, a 2 MiB-aligned
  /// region advised MADV_HUGEPAGE.
  AnonMapping(std::size_t bytes, bool hugepages) : size_(bytes) {
    if (bytes == 0) fail("cannot map 0 bytes", 0);
    // Over-map by one huge page so an aligned start exists; the slack is never touched.
    map_size_ = hugepages ? bytes + huge_page_bytes : bytes;
    void* p = ::mmap(nullptr, map_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fail(fmt::format("mmap of {} bytes of anonymous memory", map_size_), errno);
    base_ = static_cast<char*>(p);
    data_ = base_;
    if (hugepages) {
      auto addr = reinterpret_cast<std::uintptr_t>(base_);
      data_ = base_ + ((huge_page_bytes - addr % huge_page_bytes) % huge_page_bytes);
      if (::madvise(data_, bytes, MADV_HUGEPAGE) != 0) fail("madvise(MADV_HUGEPAGE)", errno);
    }
  }
  /// Unmaps the whole region.
  ~AnonMapping() { ::munmap(base_, map_size_); }
  AnonMapping(const AnonMapping&) = delete;
  AnonMapping& operator=(const AnonMapping&) = delete;

  /// The first usable byte (2 MiB-aligned with huge pages).
  char* data() const { return data_; }
  /// The usable size requested.
  std::size_t size() const { return size_; }

 private:
  char* base_ = nullptr;
  char* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t map_size_ = 0;
};

/// A file opened read-only, closed when it goes out of scope.
class ReadOnlyFile {
 public:
  /// Opens `path` and reads its size.
  explicit ReadOnlyFile(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(fmt::format("open {}", path_), errno);
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail(fmt::format("fstat {}", path_), errno);
    if (!S_ISREG(st.st_mode)) fail(fmt::format("{} is not a regular file", path_), 0);
    if (st.st_size == 0) fail(fmt::format("{} is empty", path_), 0);
    size_ = static_cast<std::size_t>(st.st_size);
  }
  /// Closes the descriptor.
  ~ReadOnlyFile() { ::close(fd_); }
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  /// Reads exactly [offset, offset + n) into dst; returns 0, the errno of a failed pread, or
  /// -1 when the file ended early. Safe to call from several threads at once.
  int read_exact(char* dst, std::size_t n, std::uint64_t offset) const {
    for (std::size_t done = 0; done < n;) {
      ssize_t got = ::pread(fd_, dst + done, n - done, static_cast<off_t>(offset + done));
      if (got < 0) {
        if (errno == EINTR) continue;
        return errno;
      }
      if (got == 0) return -1;
      done += static_cast<std::size_t>(got);
    }
    return 0;
  }

  /// Exits with a message naming the file, the offset and the error of a failed read_exact.
  [[noreturn]] void fail_read(int err, std::uint64_t offset) const {
    if (err < 0) fail(fmt::format("pread {} at offset {}: unexpected end of file (did it shrink?)", path_, offset), 0);
    fail(fmt::format("pread {} at offset {}", path_, offset), err);
  }

  /// The path it was opened with, for messages and the result line.
  const std::string& path() const { return path_; }
  /// The file's size in bytes when it was opened.
  std::size_t size() const { return size_; }
  /// The open descriptor (owned by this object).
  int descriptor() const { return fd_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::size_t size_ = 0;
};

/// The first error seen by parallel readers; later pieces see it and skip their work.
struct FirstError {
  std::atomic<bool> failed{false};
  std::mutex mutex;
  int err = 0;
  std::uint64_t offset = 0;

  /// Records (err, offset) unless an earlier error was recorded.
  void record(int e, std::uint64_t off) {
    std::lock_guard lock(mutex);
    if (failed.load(std::memory_order_relaxed)) return;
    err = e;
    offset = off;
    failed.store(true, std::memory_order_release);
  }
};

/// Threads for the parallel modes: the TBB arena, allowed to have exactly `threads` of them.
class Pool {
 public:
  /// Creates the arena and brings its workers up, so that thread start-up is not timed.
  explicit Pool(unsigned threads)
      : threads_(threads),
        control_(oneapi::tbb::global_control::max_allowed_parallelism, threads),
        arena_(static_cast<int>(threads)) {
    arena_.execute([&] {
      oneapi::tbb::parallel_for(0u, threads_ * 64, [](unsigned) {
        volatile unsigned spin = 0;
        for (unsigned i = 0; i < 10000; ++i) spin = spin + 1;
      });
    });
  }

  /// Runs `body(begin, end)` over [0, n) split into ranges of at least `grain`, on the arena.
  template <class Body>
  void parallel(std::size_t n, std::size_t grain, Body&& body) {
    arena_.execute([&] {
      oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<std::size_t>(0, n, grain),
                                [&](const oneapi::tbb::blocked_range<std::size_t>& r) { body(r.begin(), r.end()); });
    });
  }

  /// Like parallel(), one index per task: for pieces that each take a long syscall.
  template <class Body>
  void each(std::size_t n, Body&& body) {
    arena_.execute([&] {
      oneapi::tbb::parallel_for(
          oneapi::tbb::blocked_range<std::size_t>(0, n, 1),
          [&](const oneapi::tbb::blocked_range<std::size_t>& r) {
            for (std::size_t i = r.begin(); i != r.end(); ++i) body(i);
          },
          oneapi::tbb::simple_partitioner());
    });
  }

  /// The number of threads the arena runs on.
  unsigned threads() const { return threads_; }

 private:
  unsigned threads_;
  oneapi::tbb::global_control control_;
  oneapi::tbb::task_arena arena_;
};

/// Writes one byte to every 4 KiB page of `mem` on the pool's threads. The volatile stores keep
/// the compiler from dropping writes to memory it sees nobody read.
void touch_pages(Pool& pool, const AnonMapping& mem) {
  const std::size_t pages = (mem.size() + page_bytes - 1) / page_bytes;
  volatile char* base = mem.data();
  pool.parallel(pages, huge_page_bytes / page_bytes, [&](std::size_t begin, std::size_t end) {
    for (std::size_t p = begin; p != end; ++p) base[p * page_bytes] = 1;
  });
}

/// The options shared by the modes.
struct Options {
  std::string mode;
  std::string target;  // FILE or BYTES
  unsigned threads = 0;
  bool hugepages = false;
  bool cold = false;                         // drop the page cache first (file modes)
  std::size_t block = std::size_t{2} << 20;  // blocks: bytes per read() call
  bool threads_given = false;
};

/// Parses argv into Options; exits with the usage on anything unexpected.
Options parse_options(int argc, char** argv) {
  if (argc < 3) usage();
  Options o{.mode = argv[1], .target = argv[2]};
  o.threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 3; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      char* end = nullptr;
      unsigned long n = std::strtoul(argv[++i], &end, 10);
      if (*end != '\0' || n == 0 || n > 4096) fail(fmt::format("--threads wants a count, not '{}'", argv[i]), 0);
      o.threads = static_cast<unsigned>(n);
      o.threads_given = true;
    } else if (a == "--hugepages") {
      o.hugepages = true;
    } else if (a == "--cold") {
      o.cold = true;
    } else if (a == "--block" && i + 1 < argc) {
      const std::uint64_t b = parse_bytes(argv[++i]);
      if (b == 0 || b > (std::uint64_t{1} << 30))
        fail(fmt::format("--block wants 1 byte to 1 GiB, not '{}'", argv[i]), 0);
      o.block = static_cast<std::size_t>(b);
    } else {
      fmt::print(stderr, "load_baseline: unexpected argument '{}'\n", a);
      usage();
    }
  }
  return o;
}

/// (a) Populates a file-sized buffer on all threads (untimed), then times pread of the whole
/// file into it in 4 MiB pieces spread over the threads.
int run_populated_pread(const Options& o) {
  ReadOnlyFile file(o.target);
  AnonMapping buffer(file.size(), o.hugepages);
  Pool pool(o.threads);
  touch_pages(pool, buffer);
  const std::size_t pieces = (file.size() + piece_bytes - 1) / piece_bytes;
  FirstError error;
  double t0 = now_seconds();
  pool.each(pieces, [&](std::size_t i) {
    if (error.failed.load(std::memory_order_acquire)) return;
    const std::uint64_t offset = std::uint64_t{i} * piece_bytes;
    const std::size_t n = std::min(piece_bytes, file.size() - static_cast<std::size_t>(offset));
    if (int err = file.read_exact(buffer.data() + offset, n, offset); err != 0) error.record(err, offset);
  });
  double seconds = now_seconds() - t0;
  if (error.failed.load(std::memory_order_acquire)) file.fail_read(error.err, error.offset);
  print_result("populated-pread", file.path(), file.size(), seconds, pool.threads(), o.hugepages);
  return 0;
}

/// Faults `mem` in 2 MiB at a time with MADV_POPULATE_WRITE on the pool's threads (a write per
/// page where the kernel lacks it): how eredu's storage pool populated huge-page blocks.
void populate_write(Pool& pool, const AnonMapping& mem) {
  const std::size_t chunks = (mem.size() + huge_page_bytes - 1) / huge_page_bytes;
  pool.each(chunks, [&](std::size_t c) {
    char* p = mem.data() + c * huge_page_bytes;
    const std::size_t n = std::min(huge_page_bytes, mem.size() - c * huge_page_bytes);
#ifdef MADV_POPULATE_WRITE
    if (::madvise(p, n, MADV_POPULATE_WRITE) == 0) return;
#endif
    volatile char* v = p;
    for (std::size_t off = 0; off < n; off += page_bytes) v[off] = 1;
  });
}

/// (b) Times the first touch of BYTES of fresh anonymous memory on the threads: a write per
/// 4 KiB page, or with --hugepages MADV_POPULATE_WRITE per 2 MiB of a MADV_HUGEPAGE region.
int run_populate(const Options& o) {
  const std::uint64_t bytes = parse_bytes(o.target);
  Pool pool(o.threads);
  AnonMapping mem(static_cast<std::size_t>(bytes), o.hugepages);
  double t0 = now_seconds();
  if (o.hugepages)
    populate_write(pool, mem);
  else
    touch_pages(pool, mem);
  double seconds = now_seconds() - t0;
  print_result("populate", std::nullopt, bytes, seconds, pool.threads(), o.hugepages);
  return 0;
}

/// Releases memory from malloc.
struct FreeDeleter {
  /// Calls free.
  void operator()(char* p) const { std::free(p); }
};

/// (c) Times malloc of the file's size plus one sequential pread loop into it, on one thread.
int run_malloc_pread(const Options& o) {
  ReadOnlyFile file(o.target);
  if (o.cold) drop_caches();
  double t0 = now_seconds();
  std::unique_ptr<char, FreeDeleter> buffer(static_cast<char*>(std::malloc(file.size())));
  if (!buffer) fail(fmt::format("malloc of {} bytes for {}", file.size(), file.path()), ENOMEM);
  for (std::uint64_t offset = 0; offset < file.size();) {
    const std::size_t n = std::min(max_pread_bytes, file.size() - static_cast<std::size_t>(offset));
    if (int err = file.read_exact(buffer.get() + offset, n, offset); err != 0) file.fail_read(err, offset);
    offset += n;
  }
  double seconds = now_seconds() - t0;
  print_result("malloc-pread", file.path(), file.size(), seconds, 1, false, o.cold);
  return 0;
}

/// (e) The Run:ai Model Streamer scheme: times malloc of the file's size, then N threads, each
/// with its own descriptor, read() their contiguous 1/N of the file in `block`-byte calls
/// straight into the buffer (the kernel faults its fresh pages as it copies). Threads are
/// started before the clock.
int run_blocks(const Options& o) {
  ReadOnlyFile file(o.target);
  const unsigned threads = o.threads;
  std::vector<int> fds;
  for (unsigned t = 0; t < threads; ++t) {
    const int fd = ::open(file.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(fmt::format("open {}", file.path()), errno);
    fds.push_back(fd);
  }
  if (o.cold) drop_caches();
  // Ranges cut on block boundaries, so every read() but the last of a range is a whole block.
  const std::size_t blocks = (file.size() + o.block - 1) / o.block;
  const std::size_t per = (blocks + threads - 1) / threads;
  std::atomic<unsigned> ready{0};
  std::atomic<bool> go{false};
  std::unique_ptr<char, FreeDeleter> buffer;
  FirstError error;
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {}
      const std::uint64_t begin = std::min<std::uint64_t>(file.size(), std::uint64_t{t} * per * o.block);
      const std::uint64_t end = std::min<std::uint64_t>(file.size(), std::uint64_t{t + 1} * per * o.block);
      if (begin >= end) return;
      if (::lseek(fds[t], static_cast<off_t>(begin), SEEK_SET) < 0) {
        error.record(errno, begin);
        return;
      }
      for (std::uint64_t at = begin; at < end && !error.failed.load(std::memory_order_relaxed);) {
        const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(o.block, end - at));
        const ssize_t got = ::read(fds[t], buffer.get() + at, want);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
          error.record(got < 0 ? errno : -1, at);
          return;
        }
        at += static_cast<std::uint64_t>(got);
      }
    });
  }
  while (ready.load() != threads) {}
  const double t0 = now_seconds();
  buffer.reset(static_cast<char*>(std::malloc(file.size())));
  if (!buffer) fail(fmt::format("malloc of {} bytes for {}", file.size(), file.path()), ENOMEM);
  go.store(true, std::memory_order_release);
  for (auto& w : workers) w.join();
  const double seconds = now_seconds() - t0;
  for (int fd : fds) ::close(fd);
  if (error.failed.load(std::memory_order_acquire)) file.fail_read(error.err, error.offset);
  print_result("blocks", file.path(), file.size(), seconds, threads, false, o.cold);
  return 0;
}

/// bf16 -> f32 of n elements with plain stores: the portable path and the vector loop's tail.
void widen_scalar(const std::uint16_t* in, std::uint32_t* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = std::uint32_t{in[i]} << 16;
}

#if defined(__x86_64__)
/// bf16 -> f32 with AVX2, 16 elements a step, streaming stores (out is 32-byte aligned).
__attribute__((target("avx2"))) void widen_avx2(const std::uint16_t* in, std::uint32_t* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i + 8),
                        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16));
  }
  widen_scalar(in + i, out + i, n - i);
  _mm_sfence();
}
#endif

/// (d) Times bf16 -> f32 widening of the file's bytes from a mapping of the page cache into a
/// populated buffer, over the threads.
int run_mapped_widen(const Options& o) {
  ReadOnlyFile file(o.target);
  const std::size_t elements = file.size() / 2;
  AnonMapping out(elements * 4, o.hugepages);
  Pool pool(o.threads);
  touch_pages(pool, out);
  bool avx2 = false;
#if defined(__x86_64__)
  avx2 = __builtin_cpu_supports("avx2");
#endif
  const std::size_t piece_elements = piece_bytes / 2;
  const std::size_t pieces = (elements + piece_elements - 1) / piece_elements;
  auto* dst = reinterpret_cast<std::uint32_t*>(out.data());
  // Three passes in one process, the mean of passes 2 and 3 reported (their median): the way
  // `eredu load --repeat 3` is read, so both sides write to memory in the same (recycled) state.
  std::vector<double> passes;
  for (int pass = 0; pass < 3; ++pass) {
    double t0 = now_seconds();
    void* p = ::mmap(nullptr, file.size(), PROT_READ, MAP_SHARED, file.descriptor(), 0);
    if (p == MAP_FAILED) fail(fmt::format("mmap {}", file.path()), errno);
    const auto* in = static_cast<const std::uint16_t*>(p);
    pool.each(pieces, [&](std::size_t i) {
      const std::size_t first = i * piece_elements, n = std::min(piece_elements, elements - first);
      char* const map_begin = static_cast<char*>(p) + first * 2 / page_bytes * page_bytes;
      const std::size_t map_bytes = static_cast<std::size_t>(static_cast<char*>(p) + (first + n) * 2 - map_begin);
#ifdef MADV_POPULATE_READ
      // One call maps the piece's pages rather than a fault per few pages (advisory).
      ::madvise(map_begin, map_bytes, MADV_POPULATE_READ);
#endif
#if defined(__x86_64__)
      if (avx2)
        widen_avx2(in + first, dst + first, n);
      else
        widen_scalar(in + first, dst + first, n);
#else
      widen_scalar(in + first, dst + first, n);
#endif
      // Unmap the piece's pages once read, as a loader must to keep its RSS bounded (the
      // pages stay in the page cache).
      ::madvise(map_begin, map_bytes / page_bytes * page_bytes, MADV_DONTNEED);
    });
    ::munmap(p, file.size());
    passes.push_back(now_seconds() - t0);
  }
  const double seconds = (passes[1] + passes[2]) / 2;
  print_result(avx2 ? "mapped-widen-avx2" : "mapped-widen", file.path(), elements * 2, seconds, pool.threads(),
               o.hugepages);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse_options(argc, argv);
  if (o.mode == "populated-pread") return run_populated_pread(o);
  if (o.mode == "populate") return run_populate(o);
  if (o.mode == "mapped-widen") return run_mapped_widen(o);
  if (o.mode == "blocks") return run_blocks(o);
  if (o.mode == "malloc-pread") {
    // It models a naive loader, so it has nothing to tune.
    if (o.threads_given || o.hugepages) fail("malloc-pread runs on one thread with plain malloc (only --cold)", 0);
    return run_malloc_pread(o);
  }
  fmt::print(stderr, "load_baseline: unknown mode '{}'\n", o.mode);
  usage();
}
