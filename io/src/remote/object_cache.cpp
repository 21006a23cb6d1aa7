#include "eredu/io/remote/object_cache.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "eredu/core/error.hpp"
#include "eredu/io/integrity/sha256.hpp"
#include "eredu/io/reading/unique_fd.hpp"

// The directory holds, per entry, files named from h = SHA-256 of the URL (a name never comes
// from the URL itself, so no URL can reach outside the directory):
//   h.lock         flock(LOCK_EX) held by whoever fills, cleans or evicts the entry
//   h.E.data       the object's bytes; E is a hash of ETag and size, so a path handed out never
//                  holds another version's bytes (a changed object gets a new name)
//   h.meta         "url/etag/size/data" lines; written last: an entry is complete only when its
//                  meta names the data file and that file has the size recorded
//   h.tmp.P.N      a file being written by process P (data, then meta), renamed when complete
// The use time of an entry (for LRU) is its data file's mtime: set by the fill, refreshed by
// every hit. A filler killed mid-fill leaves a temp file and no meta; its lock dies with it, and
// the next holder of the lock removes the temp. Lock files can be removed (by the holder only),
// so a lock taken on a file no longer at its path is dropped and taken again.

namespace eredu::io {

namespace {

namespace fs = std::filesystem;

std::error_code sys_error(int e) { return {e, std::system_category()}; }

[[noreturn]] void throw_io(const fs::path& path, int e, const std::string& what) {
  throw Error(errc::io_error, {.file = path.string(), .os_error = sys_error(e)}, what);
}

std::string bytes_hash(const std::string& text) {
  return sha256_hex(std::as_bytes(std::span(text.data(), text.size())));
}

/// The names of one entry's files.
struct EntryNames {
  std::string hash;  // hex SHA-256 of the URL
  fs::path lock, meta;

  EntryNames(const fs::path& dir, std::string h)
      : hash(std::move(h)), lock(dir / (hash + ".lock")), meta(dir / (hash + ".meta")) {}
  static EntryNames of(const fs::path& dir, const std::string& url) { return {dir, bytes_hash(url)}; }

  /// The data file's name for one version of the object.
  std::string data_name(const std::string& etag, std::uint64_t size) const {
    return hash + "." + bytes_hash(fmt::format("{}\n{}", etag, size)).substr(0, 16) + ".data";
  }
};

/// What a meta file records.
struct Meta {
  std::string url, etag, data;
  std::uint64_t size = 0;
};

std::optional<std::string> read_small_file(const fs::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return std::nullopt;
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) return text;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > (1u << 20)) return std::nullopt;  // not a meta file of ours
  }
}

std::optional<Meta> read_meta(const fs::path& path) {
  const auto text = read_small_file(path);
  if (!text) return std::nullopt;
  Meta m;
  bool has_size = false;
  std::size_t at = 0;
  while (at < text->size()) {
    std::size_t end = text->find('\n', at);
    if (end == std::string::npos) return std::nullopt;  // a meta always ends in a newline
    const std::string_view line(text->data() + at, end - at);
    at = end + 1;
    const auto space = line.find(' ');
    if (space == std::string_view::npos) continue;
    const auto key = line.substr(0, space);
    const std::string value(line.substr(space + 1));
    if (key == "url") {
      m.url = value;
    } else if (key == "etag") {
      m.etag = value;
    } else if (key == "data") {
      m.data = value;
    } else if (key == "size") {
      try {
        std::size_t used = 0;
        m.size = std::stoull(value, &used);
        has_size = used == value.size();
      } catch (const std::exception&) {
        return std::nullopt;
      }
    }
  }
  if (!has_size || m.data.empty() || m.data.find('/') != std::string::npos) return std::nullopt;
  return m;
}

/// The data file a meta names when it exists with the recorded size (the entry is complete).
std::optional<fs::path> complete_data(const fs::path& dir, const Meta& m, struct stat* st_out = nullptr) {
  const fs::path data = dir / m.data;
  struct stat st {};
  if (::stat(data.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || static_cast<std::uint64_t>(st.st_size) != m.size) {
    return std::nullopt;
  }
  if (st_out) *st_out = st;
  return data;
}

/// The complete entry for `key` (same URL, ETag and size), if the directory has one.
std::optional<fs::path> lookup(const fs::path& dir, const EntryNames& names, const CacheKey& key) {
  const auto meta = read_meta(names.meta);
  if (!meta || meta->url != key.url || meta->etag != key.etag || meta->size != key.size ||
      meta->data != names.data_name(key.etag, key.size)) {
    return std::nullopt;
  }
  return complete_data(dir, *meta);
}

/// An exclusive flock on an entry's lock file, released on destruction (closing the descriptor).
class EntryLock {
 public:
  /// Blocks until held; `waited` tells whether another holder made it wait. Throws io_error.
  static EntryLock acquire(const fs::path& path, bool& waited) {
    waited = false;
    for (;;) {
      EntryLock lock(open_lock(path));
      if (::flock(lock.fd_.get(), LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK) throw_io(path, errno, "cannot lock a cache entry");
        waited = true;
        while (::flock(lock.fd_.get(), LOCK_EX) != 0) {
          if (errno != EINTR) throw_io(path, errno, "cannot lock a cache entry");
        }
      }
      if (lock.still_linked(path)) return lock;
    }
  }
  /// Takes the lock only if nobody holds it (nullopt otherwise, or when the file cannot be made).
  static std::optional<EntryLock> try_acquire(const fs::path& path) {
    EntryLock lock(UniqueFd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)));
    if (!lock.fd_ || ::flock(lock.fd_.get(), LOCK_EX | LOCK_NB) != 0 || !lock.still_linked(path)) return std::nullopt;
    return std::optional<EntryLock>(std::move(lock));
  }

 private:
  explicit EntryLock(UniqueFd fd) : fd_(std::move(fd)) {}

  static UniqueFd open_lock(const fs::path& path) {
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (!fd) throw_io(path, errno, "cannot open a cache lock file");
    return fd;
  }
  /// True when the locked file is still the one at `path`: a holder that removed it (eviction,
  /// cleaning) leaves us a lock nobody else will contend for.
  bool still_linked(const fs::path& path) const {
    struct stat held {
    }, now{};
    return ::fstat(fd_.get(), &held) == 0 && ::stat(path.c_str(), &now) == 0 && held.st_ino == now.st_ino &&
           held.st_dev == now.st_dev;
  }

  UniqueFd fd_;
};

/// Temp file names unique in this process (several caches may share a directory).
std::atomic<std::uint64_t> temp_counter{0};

fs::path temp_path(const fs::path& dir, const EntryNames& names) {
  return dir / fmt::format("{}.tmp.{}.{}", names.hash, ::getpid(), temp_counter.fetch_add(1));
}

/// Removes `path` when destroyed unless released: a temp file whose writing failed.
class RemoveOnFailure {
 public:
  explicit RemoveOnFailure(fs::path path) : path_(std::move(path)) {}
  ~RemoveOnFailure() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  RemoveOnFailure(const RemoveOnFailure&) = delete;
  RemoveOnFailure& operator=(const RemoveOnFailure&) = delete;
  void release() noexcept { path_.clear(); }

 private:
  fs::path path_;
};

UniqueFd create_temp(const fs::path& path) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd) throw_io(path, errno, "cannot create a cache file");
  return fd;
}

void sync_and_rename(int fd, const fs::path& from, const fs::path& to) {
  if (::fsync(fd) != 0) throw_io(from, errno, "cannot sync a cache file");
  if (::rename(from.c_str(), to.c_str()) != 0) throw_io(to, errno, "cannot rename a cache file into place");
}

void write_all(int fd, const std::string& text, const fs::path& path) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_io(path, errno, "cannot write a cache file");
    done += static_cast<std::size_t>(n);
  }
}

/// One entry's files as found in a directory listing.
struct Listed {
  std::vector<std::string> temps, data;  // names
  bool lock = false, meta = false;
};

bool is_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

/// The directory's entries by hash; names that are not the cache's own are left out (and alone).
std::map<std::string, Listed> list_entries(const fs::path& dir) {
  std::map<std::string, Listed> out;
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), &::closedir);
  if (!d) throw_io(dir, errno, "cannot list the cache directory");
  while (const dirent* e = ::readdir(d.get())) {
    const std::string_view name(e->d_name);
    if (name.size() < 65 || name[64] != '.' || !is_hex(name.substr(0, 64))) continue;
    const std::string hash(name.substr(0, 64));
    const std::string_view rest = name.substr(65);
    if (rest == "lock") {
      out[hash].lock = true;
    } else if (rest == "meta") {
      out[hash].meta = true;
    } else if (rest.starts_with("tmp.")) {
      out[hash].temps.emplace_back(name);
    } else if (rest.size() == 21 && rest.ends_with(".data") && is_hex(rest.substr(0, 16))) {
      out[hash].data.emplace_back(name);
    }
  }
  return out;
}

/// Under the entry's lock: removes the temp files (their writer died: a live one holds the lock)
/// and data files its meta does not name (left by a crash between the data and meta renames, or
/// replaced by a newer version). Returns the complete entry's meta, if any.
std::optional<Meta> clean_entry(const fs::path& dir, const EntryNames& names, const Listed& listed) {
  for (const auto& t : listed.temps) ::unlink((dir / t).c_str());
  auto meta = read_meta(names.meta);
  for (const auto& d : listed.data) {
    if (!meta || d != meta->data) ::unlink((dir / d).c_str());
  }
  if (meta && !complete_data(dir, *meta)) {
    ::unlink(names.meta.c_str());
    meta.reset();
  }
  return meta;
}

}  // namespace

struct ObjectCache::State {
  fs::path dir;
  std::uint64_t max_bytes = 0;
  std::atomic<std::uint64_t> hits{0}, fills{0}, waits{0}, evictions{0};

  /// Fills `key`'s entry under its lock (held by the caller); returns the data file.
  fs::path fill_entry(const EntryNames& names, const CacheKey& key, const Fill& fill) {
    const fs::path data = dir / names.data_name(key.etag, key.size);
    const fs::path temp = temp_path(dir, names);
    {
      RemoveOnFailure guard(temp);
      UniqueFd fd = create_temp(temp);
      fill(fd.get());
      struct stat st {};
      if (::fstat(fd.get(), &st) != 0) throw_io(temp, errno, "cannot stat a cache file");
      if (static_cast<std::uint64_t>(st.st_size) != key.size) {
        throw Error(
            errc::remote_error, {.file = key.url},
            fmt::format("the cache's copy of the object has {} bytes where the object has {}", st.st_size, key.size));
      }
      sync_and_rename(fd.get(), temp, data);
      guard.release();
    }
    const fs::path meta_temp = temp_path(dir, names);
    {
      RemoveOnFailure guard(meta_temp);
      UniqueFd fd = create_temp(meta_temp);
      write_all(
          fd.get(),
          fmt::format("url {}\netag {}\nsize {}\ndata {}\n", key.url, key.etag, key.size, data.filename().string()),
          meta_temp);
      sync_and_rename(fd.get(), meta_temp, names.meta);
      guard.release();
    }
    // The renames survive a crash once the directory is synced; a failure here loses nothing
    // but durability, so it is not an error.
    if (UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); d) ::fsync(d.get());
    return data;
  }

  /// Cleans abandoned files of entries nobody holds and, when bounded, removes the least
  /// recently used complete entries (never `keep`, never one whose lock is held) until the
  /// complete entries fit.
  void sweep(const std::string& keep) {
    struct Candidate {
      timespec used;
      std::string hash;
      std::uint64_t size;
    };
    std::vector<Candidate> complete;
    std::uint64_t total = 0;
    for (const auto& [hash, listed] : list_entries(dir)) {
      const EntryNames names(dir, hash);
      std::optional<Meta> meta = read_meta(names.meta);
      struct stat st {};
      const bool is_complete = meta && complete_data(dir, *meta, &st);
      const bool has_garbage = !listed.temps.empty() || listed.data.size() > (is_complete ? 1u : 0u) ||
                               (!is_complete && (listed.meta || listed.lock));
      if (has_garbage && hash != keep) {
        if (auto lock = EntryLock::try_acquire(names.lock)) {
          meta = clean_entry(dir, names, listed);
          if (!meta) ::unlink(names.lock.c_str());  // nothing left to guard; still held, so safe
        }
      }
      if (meta && complete_data(dir, *meta, &st)) {
        total += meta->size;
        complete.push_back({st.st_mtim, hash, meta->size});
      }
    }
    if (max_bytes == 0 || total <= max_bytes) return;
    std::sort(complete.begin(), complete.end(), [](const Candidate& a, const Candidate& b) {
      if (a.used.tv_sec != b.used.tv_sec) return a.used.tv_sec < b.used.tv_sec;
      if (a.used.tv_nsec != b.used.tv_nsec) return a.used.tv_nsec < b.used.tv_nsec;
      return a.hash < b.hash;
    });
    for (const Candidate& c : complete) {
      if (total <= max_bytes) break;
      if (c.hash == keep) continue;
      const EntryNames names(dir, c.hash);
      auto lock = EntryLock::try_acquire(names.lock);
      if (!lock) continue;  // being filled or evicted by someone else
      const auto meta = read_meta(names.meta);
      struct stat st {};
      if (!meta || !complete_data(dir, *meta, &st)) continue;  // gone meanwhile
      if (st.st_mtim.tv_sec != c.used.tv_sec || st.st_mtim.tv_nsec != c.used.tv_nsec) {
        continue;  // used (or refilled) since the listing: no longer the least recent
      }
      // The meta goes first: from then on nobody finds the entry; whoever opened its data file
      // keeps reading it (unlink, not truncate).
      ::unlink(names.meta.c_str());
      ::unlink((dir / meta->data).c_str());
      ::unlink(names.lock.c_str());
      total -= std::min(total, meta->size);
      evictions.fetch_add(1, std::memory_order_relaxed);
    }
  }

  /// A hit: refreshes the entry's use time and counts it. An entry evicted since it was found
  /// (the data file gone) is a miss; any other failure to touch it only ages it.
  std::optional<fs::path> hit(std::optional<fs::path> data) {
    if (!data || (::utimensat(AT_FDCWD, data->c_str(), nullptr, 0) != 0 && errno == ENOENT)) return std::nullopt;
    hits.fetch_add(1, std::memory_order_relaxed);
    return data;
  }
};

ObjectCache::ObjectCache(std::filesystem::path dir, std::uint64_t max_bytes) : state_(std::make_unique<State>()) {
  state_->dir = std::move(dir);
  state_->max_bytes = max_bytes;
  const fs::path& d = state_->dir;
  std::error_code ec;
  fs::create_directories(d, ec);
  if (ec) throw Error(errc::io_error, {.file = d.string(), .os_error = ec}, "cannot create the cache directory");
  if (!fs::is_directory(d, ec)) {
    throw Error(errc::io_error, {.file = d.string(), .os_error = sys_error(ENOTDIR)},
                "the cache path is not a directory");
  }
  // A probe file proves the directory writable now rather than at the first fill, mid-load.
  const fs::path probe = d / fmt::format(".probe.{}.{}", ::getpid(), temp_counter.fetch_add(1));
  UniqueFd fd(::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd)
    throw Error(errc::io_error, {.file = d.string(), .os_error = sys_error(errno)}, "cannot write the cache directory");
  fd.reset();
  ::unlink(probe.c_str());
  state_->sweep({});  // files a killed process left behind
}

ObjectCache::~ObjectCache() = default;

std::filesystem::path ObjectCache::get(const CacheKey& key, const Fill& fill) {
  State& s = *state_;
  const EntryNames names = EntryNames::of(s.dir, key.url);
  if (auto found = s.hit(lookup(s.dir, names, key))) return *found;
  fs::path data;
  {
    bool waited = false;
    const EntryLock lock = EntryLock::acquire(names.lock, waited);
    if (waited) s.waits.fetch_add(1, std::memory_order_relaxed);
    if (auto found = s.hit(lookup(s.dir, names, key))) return *found;
    // The lock is ours: temp files of this entry are a dead filler's, and data files other than
    // the new one are older versions (or a crash's leftovers, renamed without their meta).
    const auto all = list_entries(s.dir);
    const auto listed = all.find(names.hash);
    if (listed != all.end()) {
      for (const auto& t : listed->second.temps) ::unlink((s.dir / t).c_str());
    }
    data = s.fill_entry(names, key, fill);
    if (listed != all.end()) {
      for (const auto& d : listed->second.data) {
        if (d != data.filename()) ::unlink((s.dir / d).c_str());
      }
    }
    s.fills.fetch_add(1, std::memory_order_relaxed);
  }
  s.sweep(names.hash);
  return data;
}

std::optional<std::filesystem::path> ObjectCache::find(const CacheKey& key) {
  return state_->hit(lookup(state_->dir, EntryNames::of(state_->dir, key.url), key));
}

std::uint64_t ObjectCache::size_bytes() const {
  std::uint64_t total = 0;
  for (const auto& [hash, listed] : list_entries(state_->dir)) {
    if (!listed.meta) continue;
    const auto meta = read_meta(EntryNames(state_->dir, hash).meta);
    if (meta && complete_data(state_->dir, *meta)) total += meta->size;
  }
  return total;
}

CacheStats ObjectCache::stats() const {
  return {.hits = state_->hits.load(),
          .fills = state_->fills.load(),
          .waits = state_->waits.load(),
          .evictions = state_->evictions.load()};
}

const std::filesystem::path& ObjectCache::dir() const noexcept { return state_->dir; }

}  // namespace eredu::io
