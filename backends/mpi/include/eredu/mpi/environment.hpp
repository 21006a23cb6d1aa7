#pragma once
/// \file
/// eredu::mpi::Environment: MPI's lifetime in a process — MPI_Init_thread when it starts,
/// MPI_Finalize when it ends — the thread level eredu needs, checked at start, and the one
/// progress thread that makes every MPI call eredu makes.
///
/// \code
///   int main(int argc, char** argv) {
///     mpi::Environment mpi(argc, argv);               // MPI_THREAD_SERIALIZED or better, or it throws
///     mpi::Communicator world = mpi::Communicator::world(mpi);
///     mpi::Communicator tp = world.split(world.rank() / 2, world.rank(), "tp");  // pairs of ranks
///     ...                                             // communicators go before the environment
///   }
/// \endcode
///
/// Threads, and the level asked for: eredu's collectives are non-blocking MPI calls
/// (MPI_Iallreduce, MPI_Iallgather, MPI_Ialltoall) started and tested (MPI_Testsome) by one
/// progress thread, so no thread of the application ever waits inside MPI, and a finished
/// collective completes its eredu::Completion from that thread (a coroutine awaiting it resumes
/// on its own Asio executor). MPI is initialized on the constructing thread and finalized on the
/// destroying one, while the progress thread is not running; between the two, only the progress
/// thread calls MPI. That is MPI_THREAD_SERIALIZED: several threads call MPI, never at once.
/// An application that makes MPI calls of its own while eredu's collectives run needs
/// MPI_THREAD_MULTIPLE: ask for it with EnvironmentOptions::required (Debian's OpenMPI 4.1
/// provides it).
///
/// Failures: every communicator eredu creates returns errors (MPI_ERRORS_RETURN) rather than
/// aborting the job, and every wait has a timeout (CommunicatorOptions). A collective that timed
/// out may still be running inside MPI, so its buffers stay alive and its group is marked
/// unusable; MPI_Finalize is then skipped (it would wait for the dead peer), with one warning.
/// Since OpenMPI's MPI_Finalize can wait for good for a process that skips it, the processes
/// of a job that made a world communicator agree first (one all-reduce over MPI_COMM_WORLD as
/// their Environments end): either all finalize or none does. The agreement waits as
/// MPI_Finalize would for a process still at work, and ends as soon as a process of this host
/// has exited; so every process of such a job must end MPI through an Environment.

#include <chrono>
#include <memory>

namespace eredu::mpi {

namespace detail {
class Progress;
}

/// MPI's thread support levels, in increasing order.
enum class ThreadLevel {
  single,      ///< MPI_THREAD_SINGLE: one thread in the whole process
  funneled,    ///< MPI_THREAD_FUNNELED: only the thread that initialized MPI calls it
  serialized,  ///< MPI_THREAD_SERIALIZED: any thread calls MPI, never two at once (eredu's need)
  multiple,    ///< MPI_THREAD_MULTIPLE: any thread, at any time
};

/// "MPI_THREAD_SERIALIZED", for messages.
const char* thread_level_name(ThreadLevel level) noexcept;

/// How the progress thread polls. While a collective is in flight it polls (MPI_Testsome) and
/// yields the CPU between polls, as MPI_Wait does under `mpi_yield_when_idle`; while only
/// patient operations are in flight (a vote waiting for slower ranks' loads), it sleeps between
/// polls instead, so a rank that waits minutes for its peers costs almost no CPU — after a
/// short spinning phase, since a vote whose ranks are all ready completes within microseconds.
struct ProgressOptions {
  /// How long the thread keeps polling without sleeping once a patient operation starts or
  /// any operation progresses: a vote cast when the other ranks have voted completes at an
  /// urgent collective's latency instead of a sleep's (a sleep is ≥ 50 µs, the kernel's timer
  /// slack). Costs at most this much of one core per vote.
  std::chrono::microseconds patient_spin{1000};
  /// Longest sleep between two polls while only patient operations are in flight; sleeps
  /// double from 1 µs up to it. Also bounds how late a patient operation notices completion.
  std::chrono::microseconds max_patient_sleep{200};
  /// How long the thread keeps polling for new work, yielding the CPU in between, after its
  /// last operation finished, before it sleeps on a condition variable: a step that issues
  /// collectives back to back (an all_reduce after every row-parallel layer) then starts each
  /// one without a thread wake-up, tens of microseconds on a busy core, a tenth of a 1 MiB
  /// all_reduce. Zero sleeps at once.
  std::chrono::microseconds idle_spin{200};
};

/// What an Environment asks of MPI.
struct EnvironmentOptions {
  /// The thread level eredu refuses to run below (see file comment).
  ThreadLevel required = ThreadLevel::serialized;
  /// The progress thread's polling.
  ProgressOptions progress;
};

/// MPI's lifetime in this process (see file comment). One at a time per process; neither
/// copyable nor movable (communicators point to it). Every Communicator must be destroyed
/// before it.
class Environment {
 public:
  /// Initializes MPI with MPI_Init_thread (or adopts an MPI the application initialized
  /// itself, which it then finalizes itself), checks the thread level, and starts the progress
  /// thread. Throws CollectiveError(collective_error) when MPI provides less than
  /// `options.required`, when MPI was already finalized, or when another Environment is alive.
  Environment(int& argc, char**& argv, EnvironmentOptions options = {});
  /// The same without the command line (MPI_Init_thread(nullptr, nullptr, ...)).
  explicit Environment(EnvironmentOptions options = {});
  /// Agrees with the job's other processes whether all finalize (file comment), stops the
  /// progress thread (after the operations already started have finished or timed out), then
  /// finalizes MPI if this object initialized it, no collective is still running inside MPI,
  /// and every process agreed. Errors are logged, not thrown.
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;

  /// The level MPI provides (at least the one required).
  ThreadLevel provided() const noexcept { return provided_; }
  /// This process's rank in MPI_COMM_WORLD.
  int world_rank() const noexcept { return world_rank_; }
  /// Processes in MPI_COMM_WORLD.
  int world_size() const noexcept { return world_size_; }
  /// True when this object called MPI_Init_thread (and so calls MPI_Finalize).
  bool initialized_here() const noexcept { return initialized_here_; }
  /// True while a collective that timed out is still inside MPI (a peer never joined it): the
  /// destructor then skips MPI_Finalize, which would wait for it.
  bool has_stuck_collectives() const noexcept;

  /// True when the process runs under a launcher (mpirun / mpiexec of OpenMPI or MPICH, PMIx,
  /// Slurm's PMI), judged from the environment variables they set; false for a plain process
  /// (MPI would then run it as a singleton group of one).
  static bool launched_by_mpirun() noexcept;

  /// The progress thread (for the library's communicators and backend).
  const std::shared_ptr<detail::Progress>& progress() const noexcept { return progress_; }

 private:
  void start(int* argc, char*** argv, const EnvironmentOptions& options);

  std::shared_ptr<detail::Progress> progress_;
  ThreadLevel provided_ = ThreadLevel::single;
  int world_rank_ = 0;
  int world_size_ = 1;
  bool initialized_here_ = false;
};

}  // namespace eredu::mpi
