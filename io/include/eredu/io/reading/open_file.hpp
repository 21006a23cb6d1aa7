#pragma once
/// \file
/// eredu::io::OpenFile: one checkpoint file opened for reading, buffered and direct.

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "eredu/io/integrity/file_stamp.hpp"
#include "eredu/io/reading/file_system.hpp"
#include "eredu/io/reading/unique_fd.hpp"

namespace eredu::io {

/// On a file system eredu does not trust, an attribute refresh (a read reaching past the size
/// the kernel holds, an fstat) that finds the size a server's short reply shrank restored
/// drops every cached page of the file — the pages the page-cache guard looks for after a
/// read's kernel fallback. So guarded reads of a file take this lock alone until its server has
/// answered `reads_to_trust` of them in full, then share it; once it answers one short, they
/// take it alone for good. The source's attribute checks take it alone whenever reads do.
/// (Reads that shared it from the start let one read's refresh drop the zero pages another
/// read's fallback had copied before that read's guard looked, when a server answers short
/// from its first reply: wrong bytes, seen in CI.)
struct PageCacheGuardLock {
  /// Guarded reads a file's server must answer in full, one at a time, before they may share
  /// the lock.
  static constexpr unsigned reads_to_trust = 4;

  /// The lock as a guarded read or an attribute check holds it: alone, shared, or not at
  /// all (default-constructed, moved from, or a check while reads share it). Move-only.
  class Hold {
   public:
    Hold() = default;
    Hold(Hold&& other) noexcept : guard_(std::exchange(other.guard_, nullptr)), alone_(other.alone_) {}
    Hold& operator=(Hold&& other) noexcept {
      if (this != &other) {
        release();
        guard_ = std::exchange(other.guard_, nullptr);
        alone_ = other.alone_;
      }
      return *this;
    }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold() { release(); }
    /// Whether this holds the lock alone.
    bool alone() const noexcept { return guard_ != nullptr && alone_; }
    /// Whether this holds the lock at all.
    bool held() const noexcept { return guard_ != nullptr; }

   private:
    friend struct PageCacheGuardLock;
    Hold(PageCacheGuardLock* guard, bool alone) noexcept : guard_(guard), alone_(alone) {}
    void release() noexcept {
      if (!guard_) return;
      {
        const std::lock_guard lock(guard_->mutex_);
        if (alone_)
          guard_->alone_ = false;
        else
          --guard_->sharing_;
      }
      guard_->released_.notify_all();
      guard_ = nullptr;
    }
    PageCacheGuardLock* guard_ = nullptr;
    bool alone_ = false;
  };

  /// Waits as a guarded read must, from before its guard's first look at the page cache until
  /// after its last: for the lock alone while `serial()`, else shared. Which one is decided
  /// when the lock is taken, so a read that waited through the trial shares it if the trial
  /// ended meanwhile.
  Hold hold_for_read() { return take(true); }
  /// Waits as an attribute check (an fstat: a getattr on FUSE) must: for the lock alone while
  /// `serial()`, so that no guarded read sees the pages the check may drop go; else holds
  /// nothing.
  Hold hold_for_check() { return take(false); }
  /// Records a guarded read its server answered in full, called under the read's hold: the
  /// `reads_to_trust`-th of a server that never answered short lets reads share the lock.
  void answered_in_full() {
    {
      const std::lock_guard lock(mutex_);
      if (answered_short_ || full_answers_ >= reads_to_trust || ++full_answers_ < reads_to_trust) return;
    }
    released_.notify_all();  // readers waiting to be alone may now share it
  }
  /// Records that the file's server answered a read short: its reads go one at a time for
  /// good. True only the first time (so the switch is logged once per file).
  bool go_serial() {
    const std::lock_guard lock(mutex_);
    return !std::exchange(answered_short_, true);
  }
  /// Whether guarded reads take the lock alone: on trial, or for good once the server
  /// answered short.
  bool serial() const {
    const std::lock_guard lock(mutex_);
    return serial_locked();
  }

 private:
  bool serial_locked() const noexcept { return answered_short_ || full_answers_ < reads_to_trust; }
  Hold take(bool share_when_trusted) {
    std::unique_lock lock(mutex_);
    released_.wait(lock, [&] { return !alone_ && (!serial_locked() || sharing_ == 0); });
    if (serial_locked()) {
      alone_ = true;
      return Hold(this, true);
    }
    if (!share_when_trusted) return Hold();
    ++sharing_;
    return Hold(this, false);
  }

  mutable std::mutex mutex_;          // guards every member below
  std::condition_variable released_;  // a hold was released, or reads may now share
  unsigned sharing_ = 0;              // reads holding the lock shared
  bool alone_ = false;                // a read or a check holds it alone
  bool answered_short_ = false;       // a fallback or a shrunk size was seen; never cleared
  unsigned full_answers_ = 0;         // guarded reads answered in full while on trial
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
