#pragma once
/// \file
/// eredu::mpi::Publisher: a trainer offers versions of its weights to subscribers (inference
/// ranks) over MPI, without copying them: each tensor's memory is attached to an MPI dynamic
/// window, and subscribers read exactly the bytes their shards select with MPI_Rget
/// (published_source.hpp). Subscribers swap to a version as to any checkpoint; the publisher
/// only answers their requests for manifests and digests.
///
/// \code
///   mpi::Communicator live = world.split(0, world.rank(), "live");   // the trainer and its subscribers
///   mpi::Publisher publisher(live);                                  // collective with every Subscriber
///   for (int step = 1;; ++step) {
///     train_step(weights);
///     mpi::Publication v = publisher.publish(fmt::format("step-{}", step), {}, tensors_of(weights));
///     v.wait_served(subscribers, std::chrono::minutes(1));          // every subscriber has its bytes
///   }                                                                // ~Publication withdraws
/// \endcode
///
/// A publication's memory belongs to the transport until withdraw() returns (or the
/// Publication is destroyed): the trainer must not write it before then. Withdrawing waits for
/// every subscriber that opened the version to say it is done reading, at most `linger`, so a
/// subscriber never reads memory the trainer has reused while it is still reading; a subscriber
/// that asks after the withdrawal gets version_withdrawn, and its swap fails on every rank.
///
/// Deltas: a version published against a base the publisher still offers carries, per tensor,
/// the blocks that changed, a sparse index of the values that changed, or the XOR with the
/// base, compressed; a subscriber holding
/// the base copies it and reads only those (publish(), PublishedSource::use_base). Its digests
/// are the full version's.
///
/// Digests: publish() computes each tensor's io::DigestKind::xxh3_128_blocks (XXH3-128 over
/// 64 KiB blocks, which a subscriber that keeps the blocks' digests updates by hashing only
/// the blocks a delta changes); a subscriber asks for the digests of
/// exactly the selections it reads, which the publisher hashes from its memory, and its swap
/// verifies each tensor where it lands against them (checksum_mismatch otherwise).
///
/// Threads: the publisher's requests are received by the MPI progress thread and answered on
/// a thread of its own, so hashing never holds the progress thread.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "eredu/core/dtype.hpp"
#include "eredu/core/selection.hpp"
#include "eredu/core/shape.hpp"
#include "eredu/mpi/communicator.hpp"
#include "eredu/mpi/live_transport.hpp"

namespace eredu::mpi {

namespace detail {
struct PublisherState;
struct PublicationState;
}  // namespace detail

/// Copies `runs` of a tensor the host cannot address into `out` (each run's bytes
/// [source_offset, + length) of the tensor to [dest_offset, + length) of `out`), all of one reply
/// or hashing piece at once, so that a copier can batch them (a column shard's rows as one
/// strided copy). PublishedTensor::copy_out. May throw; a BackendError reaches the subscriber.
using CopyOut = std::function<void(std::span<const ByteRun> runs, std::span<std::byte> out)>;

/// One tensor a publisher offers: the bytes stay the caller's memory.
struct PublishedTensor {
  std::string name{};                  ///< its name (a checkpoint tensor's name)
  DType dtype{};                       ///< its element type
  Shape shape{};                       ///< its shape
  std::span<const std::byte> bytes{};  ///< its bytes, row-major, exactly dtype × shape (empty with copy_out)
  /// Instead of `bytes`, for memory the host cannot address (a CUDA device tensor:
  /// nccl::published_tensor): the tensor is staged, one subscriber's read at a time (see
  /// Publisher::publish).
  CopyOut copy_out{};
};

/// Settings of a publisher.
struct PublisherOptions {
  /// How long withdraw() waits for subscribers that opened a version and have not said they
  /// are done reading it.
  std::chrono::milliseconds linger{std::chrono::seconds(60)};
  /// The longest a reply waits for its subscriber to take it.
  std::chrono::milliseconds reply_timeout{std::chrono::seconds(60)};
  /// The granule of deltas: a version published against an offered base is compared with it
  /// in blocks of this many bytes (see Publisher::publish). 0: never deltas.
  std::size_t delta_block = std::size_t{64} << 10;
  /// How subscribers read: the same on the publisher and every subscriber of its group.
  LiveTransport transport = LiveTransport::two_sided;
  /// Whether a tensor most of whose values changed (the drift of an RL step) may go as its
  /// XOR with the base, compressed. Off by default: it pays only where the link is slower
  /// than the subscriber's decompression, about 0.3 GB/s per rank (two jobs over TCP). Over
  /// shared memory, a 256 MiB drift update took 4.4× the full one (docs/performance.md).
  bool xor_deltas = false;
};

/// One version offered by a Publisher (see file comment). Move-only; destruction withdraws it.
class Publication {
 public:
  /// No publication.
  Publication() noexcept;
  Publication(Publication&&) noexcept;
  Publication& operator=(Publication&&) noexcept;
  Publication(const Publication&) = delete;
  Publication& operator=(const Publication&) = delete;
  /// Withdraws it (see withdraw()).
  ~Publication();

  /// Its version tag.
  const std::string& version() const noexcept;
  /// Subscribers that said they finished reading it successfully.
  int served() const;
  /// Subscribers that said they gave up on it (a failed read, digest or vote).
  int failed() const;
  /// Blocks until `subscribers` subscribers have said they are done (successfully or not), or
  /// `timeout`; true when they have.
  bool wait_served(int subscribers, std::chrono::milliseconds timeout) const;
  /// Stops offering it: subscribers that ask for it later get version_withdrawn. Returns once
  /// every subscriber that opened it has said it is done, or after PublisherOptions::linger;
  /// the memory is then the caller's again. Idempotent; never throws.
  void withdraw() noexcept;

 private:
  friend class Publisher;
  Publication(std::shared_ptr<detail::PublisherState> owner, std::shared_ptr<detail::PublicationState> state) noexcept;
  std::shared_ptr<detail::PublisherState> owner_;
  std::shared_ptr<detail::PublicationState> state_;
};

/// The trainer's side of live updates (see file comment).
class Publisher {
 public:
  /// Joins `group` as its publisher: makes the window with every Subscriber of the group
  /// (collective and blocking, within the group's timeout) and starts answering requests.
  /// `group` must outlive the publisher. Throws CollectiveError.
  explicit Publisher(Communicator& group, PublisherOptions options = {});
  /// Withdraws every publication, stops answering, and frees the window with the subscribers
  /// (collective: every Subscriber of the group is destroyed too).
  ~Publisher();
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  /// Offers `tensors` as `version`, whose base is `base` (empty:
  /// none), until the Publication is withdrawn. Hashes every tensor (xxh3_128_blocks) on the calling
  /// thread and attaches its memory to the window.
  ///
  /// Deltas: when `base` is a version this publisher still offers, each tensor of the same
  /// name, dtype and shape in it is compared block by block (PublisherOptions::delta_block).
  /// A subscriber that holds the base then reads only what changed
  /// (PublishedSource::use_base), as whichever is smaller: the changed blocks, read from this
  /// version's memory, or a sparse index of the changed values (4-byte index and value each),
  /// which the publication builds in memory of its own. Where both are more than half its
  /// bytes and PublisherOptions::xor_deltas is on, the XOR with the base's bytes, in byte
  /// planes, compressed with zstd (1 MiB chunks compressed in parallel), if that is at most
  /// half. Otherwise, or for a new tensor, it goes whole; a base no longer offered gives a
  /// version every subscriber reads whole.
  ///
  /// Staged tensors (PublishedTensor::copy_out): nothing of them is attached to the window.
  /// Each read of one is a request the publisher answers with a copy of exactly the bytes asked
  /// (under either transport), so staging is one reply's bytes, at most
  /// SubscriberOptions::part_size per read; hashing copies them out in pieces of 8 MiB per
  /// hashing thread. They always go whole, never as a delta.
  ///
  /// Throws Error(invalid_argument) for an empty or already offered version tag, a tensor
  /// name given twice, bytes that are not dtype × shape, or both bytes and copy_out;
  /// CollectiveError when MPI refuses the memory; what a copy_out throws while hashing.
  Publication publish(std::string version, std::string base, std::vector<PublishedTensor> tensors);

  /// True while `version` is offered (published and not withdrawn).
  bool offered(const std::string& version) const;

  /// This rank in the group (the rank subscribers name).
  int rank() const noexcept;

 private:
  void mark_delta(detail::PublicationState& p, const std::string& version);
  std::shared_ptr<detail::PublisherState> state_;
};

}  // namespace eredu::mpi
