#pragma once
/// \file
/// eredu::io::ObjectCache: an opt-in local cache of whole remote objects, shared by processes.
///
/// An object is kept under a name derived from its URL (never its credentials) together with its
/// ETag and size; it is written under a temporary name and renamed when complete, so a reader
/// never sees half an object. Processes share the directory through file locks (flock): one
/// fills an entry, the others wait for it; an entry whose ETag differs from the object's current
/// one is refilled. The directory's size is bounded: the least recently used entries are removed
/// past it (an entry another process holds open stays readable: it is unlinked, not truncated).

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace eredu::io {

/// One object's identity in the cache: its URL (redacted: no query) and its ETag and size.
struct CacheKey {
  std::string url{};       ///< redacted URL (remote_url.hpp); names the entry
  std::string etag{};      ///< the object's current ETag; an entry with another is stale
  std::uint64_t size = 0;  ///< the object's size
};

/// Counters of one cache (tests, logs).
struct CacheStats {
  std::uint64_t hits = 0;       ///< lookups served by a complete entry
  std::uint64_t fills = 0;      ///< entries this process filled
  std::uint64_t waits = 0;      ///< lookups that waited for another process's fill
  std::uint64_t evictions = 0;  ///< entries removed to stay under the bound
};

/// See the file comment. Thread-safe.
class ObjectCache {
 public:
  /// Opens (creates) the cache directory `dir`, bounded to `max_bytes` (0: unbounded). Throws
  /// Error(io_error) naming the directory when it cannot be created or written.
  ObjectCache(std::filesystem::path dir, std::uint64_t max_bytes);
  ~ObjectCache();
  ObjectCache(const ObjectCache&) = delete;
  ObjectCache& operator=(const ObjectCache&) = delete;

  /// Writes the whole object into the file descriptor `fd` (opened for writing, empty), or throws
  /// (the partial entry is removed and the error passes through).
  using Fill = std::function<void(int fd)>;

  /// The path of a complete local copy of `key`: an existing entry with the same ETag and size
  /// (a hit: its use time is refreshed), or one made now by `fill` under the entry's lock while
  /// other processes wait. Evicts least recently used entries past the bound afterwards (never
  /// the one returned). A copy whose size differs from key.size after `fill` is
  /// Error(remote_error).
  std::filesystem::path get(const CacheKey& key, const Fill& fill);

  /// The path of a complete entry for `key` without filling, or nullopt.
  std::optional<std::filesystem::path> find(const CacheKey& key);

  /// Bytes of complete entries now in the directory.
  std::uint64_t size_bytes() const;
  /// Counters so far.
  CacheStats stats() const;
  /// The directory.
  const std::filesystem::path& dir() const noexcept;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace eredu::io
