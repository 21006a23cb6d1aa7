#pragma once
/// \file
/// eredu::io::OpenFile: one checkpoint file opened for reading, buffered and direct.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "eredu/io/integrity/file_stamp.hpp"
#include "eredu/io/reading/file_system.hpp"
#include "eredu/io/reading/unique_fd.hpp"

namespace eredu::io {

/// On a file system eredu does not trust, an attribute refresh (a read reaching past the size
/// the kernel holds, an fstat) that finds the size a server's short reply shrank restored
/// drops every cached page of the file — the pages the page-cache guard looks for after a
/// read's kernel fallback. Guarded reads share `lock` until such a server shows itself, then
/// take it alone, as the source's attribute checks do from then on.
struct PageCacheGuardLock {
  std::shared_mutex lock;           ///< shared by guarded reads; alone once `serial`
  std::atomic<bool> serial{false};  ///< set when a fallback or a shrunk size was seen, never cleared

  /// What a guarded read holds from before its guard's first look at the page cache until
  /// after its last: the lock, shared until `serial`, then alone. Empty when
  /// default-constructed; move-only.
  class ReadHold {
   public:
    ReadHold() = default;
    /// Waits for `guard` as a read must (see ReadHold).
    explicit ReadHold(PageCacheGuardLock& guard) {
      if (guard.serial.load())
        alone_ = std::unique_lock(guard.lock);
      else
        shared_ = std::shared_lock(guard.lock);
    }

   private:
    std::shared_lock<std::shared_mutex> shared_;
    std::unique_lock<std::shared_mutex> alone_;
  };

  /// What an attribute check (an fstat: a getattr on FUSE) holds: nothing until `serial`,
  /// then the lock alone, so that no guarded read sees the pages it may drop go.
  std::unique_lock<std::shared_mutex> hold_for_check() {
    return serial.load() ? std::unique_lock(lock) : std::unique_lock<std::shared_mutex>();
  }
  /// Records that the file's server answered a read short; true only the first time (so the
  /// switch is logged once per file).
  bool go_serial() noexcept { return !serial.exchange(true); }
};

/// A checkpoint file's descriptors. `direct` is an O_DIRECT descriptor of the same file,
/// or empty where the file system refuses O_DIRECT or direct reads are off.
struct OpenFile {
  std::string path{};            ///< path as opened, for messages
  UniqueFd buffered{};           ///< O_RDONLY descriptor
  UniqueFd direct{};             ///< O_RDONLY | O_DIRECT descriptor, or empty
  std::uint64_t size = 0;        ///< size when opened
  FileStamp stamp{};             ///< times and links when opened (a rewrite seen later fails reads: file_changed)
  FileSystemInfo file_system{};  ///< the file system holding it
  bool read_with_pread = false;  ///< the source's reader policy sent it to the pread reader
  /// A remote object (`path` is its URL, redacted), read by ranged GETs: no descriptors; its
  /// ETag, not its attributes, proves it unchanged.
  bool remote = false;
  /// How the page-cache guard's reads of this file, and the source's checks of its
  /// attributes, exclude each other (see PageCacheGuardLock).
  std::unique_ptr<PageCacheGuardLock> guard = std::make_unique<PageCacheGuardLock>();
};

}  // namespace eredu::io
