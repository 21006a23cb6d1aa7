#pragma once
/// \file
/// eredu::mpi::Communicator: an owned MPI communicator — a group of ranks that collectives run
/// over — with a name for messages, a timeout for every wait, and what eredu knows about each
/// peer (its world rank and process id) to say which rank is gone when a collective times out.
///
/// \code
///   mpi::Communicator world = mpi::Communicator::world(env);             // a duplicate of MPI_COMM_WORLD
///   const int tp_size = 2;
///   mpi::Communicator tp = world.split(world.rank() / tp_size, world.rank(), "tp");  // {0,1}, {2,3}
///   mpi::Communicator dp = world.split(world.rank() % tp_size, world.rank(), "dp");  // {0,2}, {1,3}
/// \endcode
///
/// Every collective of a communicator is started by the progress thread in the order it was
/// submitted, which MPI requires to be the same on every rank: submit collectives of one
/// communicator from one thread (or one strand), in the same order on every rank.
///
/// Failures are CollectiveError(collective_error) naming the operation, the group and the
/// ranks concerned: an MPI error (MPI_ERRORS_RETURN is set on every communicator), a wait that
/// outlived the timeout — the message then names the peers on this host whose process has
/// exited — or any collective on a communicator made unusable by an earlier failure (after a
/// timeout the ranks no longer agree on which collective comes next).

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <asio/async_result.hpp>
#include <asio/system_executor.hpp>

#include "eredu/core/completion.hpp"
#include "eredu/core/detail/handler_delivery.hpp"
#include "eredu/mpi/environment.hpp"

namespace eredu::mpi {

namespace detail {
struct CommState;
}

/// Settings of a communicator (split copies its parent's).
struct CommunicatorOptions {
  /// The longest a collective may wait for the group once started; then it fails with
  /// CollectiveError(collective_error) and the communicator becomes unusable.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

/// Settings of a rendezvous between two separately started jobs (Communicator::accept and
/// Communicator::connect).
struct RendezvousOptions {
  /// The longest accept waits for another job to connect, and connect for the service to be
  /// offered; then CollectiveError(timed_out). The joined communicator's collectives then
  /// have the group's timeout.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  /// The joined communicator's name; empty: the service's.
  std::string name{};
};

/// What eredu knows about one rank of a communicator.
struct Peer {
  int world_rank = -1;     ///< its rank in MPI_COMM_WORLD
  std::int64_t pid = 0;    ///< its process id
  std::uint64_t host = 0;  ///< a hash of its host name (same value: same host)
  /// Its PID namespace (an inode number; 0: unknown): its pid means something here only where
  /// this and `host` equal ours.
  std::uint64_t pid_namespace = 0;
};

/// An owned MPI communicator (see file comment). Move-only; the MPI communicator is freed on
/// the progress thread once the collectives submitted before the destructor have finished.
class Communicator {
 public:
  /// No communicator (valid() is false).
  Communicator() noexcept;
  Communicator(Communicator&& other) noexcept;
  Communicator& operator=(Communicator&& other) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  /// Frees the communicator after its collectives (never blocks); a communicator left unusable
  /// by a timeout is not freed (a collective may still use it inside MPI).
  ~Communicator();

  /// Every rank of the job: a duplicate of MPI_COMM_WORLD (so eredu's collectives never mix
  /// with the application's own traffic on it), named "world". Collective and blocking: every
  /// rank calls it, at setup. Throws CollectiveError.
  static Communicator world(Environment& env, CommunicatorOptions options = {});

  /// The ranks of this communicator that pass the same `color`, ordered by `key` (ties: by
  /// rank here), as MPI_Comm_split; a negative color joins no group and returns an empty
  /// communicator. Collective and blocking: every rank of this communicator calls it, in the same
  /// order relative to its other collectives. The ranks first exchange their colors within the
  /// timeout, so a dead rank fails the split instead of hanging it. Throws CollectiveError.
  Communicator split(int color, int key, std::string name) const;

  /// Offers this job to another one started separately, under the name `service`, and waits
  /// for it to connect: returns the communicator of both jobs, this group's ranks first (rank 0
  /// here is rank 0 there). Collective and blocking over `group`, as connect is over the other
  /// job's group. The name goes through MPI's name server (MPI_Publish_name): with OpenMPI,
  /// start `ompi-server -r FILE` and launch both jobs with `mpirun --ompi-server file:FILE`.
  /// Needs MPI_THREAD_MULTIPLE (EnvironmentOptions::required): MPI's accept has no timeout,
  /// and eredu bounds it from another thread. Throws CollectiveError: timed_out when no job
  /// connected within the timeout, collective_error when MPI refused (no name server, the
  /// name offered already).
  static Communicator accept(Environment& env, const Communicator& group, const std::string& service,
                             RendezvousOptions options = {});
  /// Joins the job that offers `service` (see accept): returns the communicator of both jobs,
  /// the accepting job's ranks first, then this group's. Waits for the name to be offered
  /// within the timeout. Collective and blocking over `group`; needs MPI_THREAD_MULTIPLE.
  /// Throws CollectiveError (timed_out, collective_error).
  static Communicator connect(Environment& env, const Communicator& group, const std::string& service,
                              RendezvousOptions options = {});

  /// True when this handle owns a communicator.
  bool valid() const noexcept { return state_ != nullptr; }
  /// This process's rank in the communicator.
  int rank() const noexcept;
  /// Ranks in the communicator.
  int size() const noexcept;
  /// Its name ("world", "tp").
  const std::string& name() const noexcept;
  /// Each rank's world rank, process id and host.
  const std::vector<Peer>& peers() const noexcept;
  /// The current timeout of its waits.
  std::chrono::milliseconds timeout() const noexcept;
  /// Changes the timeout of collectives submitted from now on.
  void set_timeout(std::chrono::milliseconds timeout) noexcept;
  /// False once a collective failed or timed out on it: every later collective fails at once.
  bool usable() const noexcept;
  /// The native communicator, for inspection (MPI_Comm_compare, say). Calling MPI on it while
  /// eredu's collectives run needs MPI_THREAD_MULTIPLE (see environment.hpp).
  MPI_Comm native() const noexcept;

  /// Gathers every rank's `contribution` (all of the same size) into one buffer, in rank
  /// order. Returns that buffer at once and the Completion of the gather; the buffer must not
  /// be read before the completion has succeeded. The buffers belong to the operation (and to
  /// MPI after a timeout), never to the caller. `patient` marks a wait that may be long (ranks
  /// arriving minutes apart, as in a vote): the progress thread then sleeps between polls.
  /// `timeout` replaces the communicator's for this gather. Never throws: a failure fails the
  /// completion (CollectiveError).
  std::pair<std::shared_ptr<const std::vector<std::byte>>, Completion> all_gather_bytes(
      std::vector<std::byte> contribution, std::optional<std::chrono::milliseconds> timeout = std::nullopt,
      bool patient = false);

  /// A Completion once every rank has reached it (MPI_Ibarrier). Never throws.
  Completion barrier(std::optional<std::chrono::milliseconds> timeout = std::nullopt);

  /// Waits until every rank has called it.
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr)`: null once every rank arrived; CollectiveError(collective_error)
  /// on an MPI error, after the timeout, or when the communicator is unusable.
  ///
  /// @par Per-Operation Cancellation
  /// none (an MPI rank cannot leave a barrier; the timeout bounds the wait).
  ///
  /// The communicator must outlive the operation.
  template <asio::completion_token_for<void(std::exception_ptr)> Token>
  auto async_barrier(Token&& token) {
    return asio::async_initiate<Token, void(std::exception_ptr)>(
        [](auto handler, Communicator* self) {
          self->barrier().on_complete(eredu::detail::deliver_on_handler_executor<std::exception_ptr>(
              std::move(handler), asio::system_executor()));
        },
        token, this);
  }

  /// The shared state (for the library's backend).
  const std::shared_ptr<detail::CommState>& state() const noexcept { return state_; }

 private:
  explicit Communicator(std::shared_ptr<detail::CommState> state) noexcept : state_(std::move(state)) {}
  void release() noexcept;

  std::shared_ptr<detail::CommState> state_;
};

}  // namespace eredu::mpi
