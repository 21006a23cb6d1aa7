#pragma once
// The MPI operations live updates make (private to eredu::mpi): tagged messages and one-sided
// reads from a dynamic window, each submitted to the progress thread like a collective, so the
// application's threads never call MPI and every wait has a timeout. The publisher and its
// subscribers share one communicator and one dynamic window over it; the publisher attaches a
// version's tensors to the window (their memory, not a copy) and subscribers read them with
// MPI_Rget inside a passive-target epoch (MPI_Win_lock_all) opened when the window is made.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "eredu/core/completion.hpp"
#include "eredu/core/selection.hpp"
#include "progress.hpp"

namespace eredu::mpi::detail {

/// A dynamic window over a communicator (MPI_Win_create_dynamic), freed collectively.
class LiveWindow {
 public:
  /// Makes the window on every rank of `comm` (collective and blocking): first a barrier
  /// within the communicator's timeout, so a missing rank fails here instead of hanging inside
  /// MPI_Win_create_dynamic. `lock_all`: open a shared passive-target epoch to every rank (a
  /// subscriber's reads). Throws CollectiveError.
  LiveWindow(std::shared_ptr<CommState> comm, bool lock_all);
  /// Frees the window after a barrier (collective); when that barrier fails, or the group is
  /// unusable, the window is left to MPI (freeing would wait for the missing rank).
  ~LiveWindow();
  LiveWindow(const LiveWindow&) = delete;
  LiveWindow& operator=(const LiveWindow&) = delete;

  /// Exposes `memory` for reads; returns its displacement (its address). Blocking, on the
  /// progress thread. Throws CollectiveError.
  MPI_Aint attach(std::span<const std::byte> memory);
  /// Ends the exposure of `memory` (attached before). Blocking, on the progress thread.
  void detach(std::span<const std::byte> memory) noexcept;
  /// Reads `runs` (source offsets relative to `base` on rank `target`, destination offsets
  /// relative to `destination`) into `destination`, as one MPI_Rget with an indexed target
  /// datatype; runs that do not fill `destination` in order (a delta's blocks) get an indexed
  /// origin datatype too. `what` names it in a timeout's message. Never throws.
  Completion read(int target, MPI_Aint base, std::vector<ByteRun> runs, std::span<std::byte> destination,
                  std::string what, std::chrono::milliseconds timeout);

  /// The communicator's state.
  const std::shared_ptr<CommState>& comm() const noexcept { return comm_; }

 private:
  std::shared_ptr<CommState> comm_;
  MPI_Win win_ = MPI_WIN_NULL;
  bool locked_ = false;
};

/// A message's bytes: allocated unzeroed (a receive writes them, and a reply of 16 MiB would
/// otherwise be zeroed first), then sized to what came.
class MessageBuffer {
 public:
  /// No bytes.
  MessageBuffer() = default;
  /// Room for `capacity` bytes, none of them yet the message's.
  explicit MessageBuffer(std::size_t capacity)
      : data_(std::make_unique_for_overwrite<std::byte[]>(capacity)), capacity_(capacity) {}
  /// Takes `other`'s bytes; `other` is left empty (capacity 0), never a size without memory.
  MessageBuffer(MessageBuffer&& other) noexcept
      : data_(std::move(other.data_)),
        capacity_(std::exchange(other.capacity_, 0)),
        size_(std::exchange(other.size_, 0)) {}
  /// Takes `other`'s bytes, as the move constructor does.
  MessageBuffer& operator=(MessageBuffer&& other) noexcept {
    data_ = std::move(other.data_);
    capacity_ = std::exchange(other.capacity_, 0);
    size_ = std::exchange(other.size_, 0);
    return *this;
  }

  /// Where a receive writes.
  std::byte* data() noexcept { return data_.get(); }
  /// The most a receive may write.
  std::size_t capacity() const noexcept { return capacity_; }
  /// Records how many bytes the message had (at most capacity()).
  void set_size(std::size_t size) noexcept { size_ = std::min(size, capacity_); }
  /// The message.
  std::span<const std::byte> bytes() const noexcept { return {data_.get(), size_}; }

 private:
  std::unique_ptr<std::byte[]> data_;
  std::size_t capacity_ = 0;
  std::size_t size_ = 0;
};

/// Sends `bytes` to `dest` with `tag` (MPI_Isend). `watch_dest`: fail as soon as `dest` is
/// seen to have exited (a subscriber's message to its publisher), not at the timeout; that
/// makes the group unusable, as a timeout does. Never throws.
Completion send_message(const std::shared_ptr<CommState>& comm, int dest, int tag,
                        std::shared_ptr<const std::vector<std::byte>> bytes, std::string what,
                        std::chrono::milliseconds timeout, bool watch_dest = false);
/// Sends `message`'s bytes to `dest` with `tag` (MPI_Isend). Never throws.
Completion send_message(const std::shared_ptr<CommState>& comm, int dest, int tag,
                        std::shared_ptr<const MessageBuffer> message, std::string what,
                        std::chrono::milliseconds timeout);

/// Sends `memory` to `dest` with `tag` straight from where it lies (no copy, so MPI may copy it
/// once, into the receiver). The caller keeps it unchanged until the completion finishes.
/// Never throws.
Completion send_memory(const std::shared_ptr<CommState>& comm, int dest, int tag, std::span<const std::byte> memory,
                       std::string what, std::chrono::milliseconds timeout);

/// A receive posted on the progress thread, cancellable while it waits.
struct PostedReceive {
  MessageBuffer buffer;                    ///< the message, once completed
  MPI_Request request = MPI_REQUEST_NULL;  ///< set on the progress thread when started
  bool cancel_requested = false;           ///< read on the progress thread
};

/// Receives one message of at most `capacity` bytes from `source` (MPI_ANY_SOURCE allowed)
/// with `tag`. `patient`: a long wait (a publisher's request loop) that must not hold the
/// progress thread spinning. Never throws.
std::pair<std::shared_ptr<PostedReceive>, Completion> receive_message(const std::shared_ptr<CommState>& comm,
                                                                      int source, int tag, std::size_t capacity,
                                                                      std::string what,
                                                                      std::chrono::milliseconds timeout, bool patient);
/// The same, into `buffer` (a message of at most its capacity).
std::pair<std::shared_ptr<PostedReceive>, Completion> receive_message(const std::shared_ptr<CommState>& comm,
                                                                      int source, int tag, MessageBuffer buffer,
                                                                      std::string what,
                                                                      std::chrono::milliseconds timeout, bool patient);

/// Cancels `receive` if it still waits (MPI_Cancel, on the progress thread); its completion
/// then finishes. Never throws.
void cancel_receive(const std::shared_ptr<CommState>& comm, const std::shared_ptr<PostedReceive>& receive);

}  // namespace eredu::mpi::detail
