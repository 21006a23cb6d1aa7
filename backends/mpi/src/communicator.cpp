#include "eredu/mpi/communicator.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <climits>
#include <csignal>
#include <cstring>
#include <functional>
#include <tuple>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "progress.hpp"
#include "rendezvous.hpp"

namespace eredu::mpi {
namespace {

/// What each rank tells the others when a communicator is made: enough to say, after a
/// timeout, which of them has exited.
struct PeerRecord {
  std::int32_t color = 0;
  std::int32_t key = 0;
  std::int32_t world_rank = 0;
  std::int32_t reserved = 0;
  std::int64_t pid = 0;
  std::uint64_t host = 0;
  std::uint64_t pid_namespace = 0;
};

/// The inode of this process's PID namespace (0 where /proc does not say): containers that
/// share a host name (Docker's host network) but not their pids differ here.
std::uint64_t pid_namespace() {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_ino);
}

/// FNV-1a of the host name: equal on every process of one host, and independent of the
/// standard library's hash (which may differ between builds).
std::uint64_t host_hash() {
  std::array<char, 256> name{};
  if (gethostname(name.data(), name.size() - 1) != 0) return 0;
  std::uint64_t h = 14695981039346656037ull;
  for (const char* p = name.data(); *p; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
  return h;
}

PeerRecord my_record(int color, int key) {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);  // only used on the progress thread (see gather_records)
  return {.color = color,
          .key = key,
          .world_rank = world_rank,
          .pid = getpid(),
          .host = host_hash(),
          .pid_namespace = pid_namespace()};
}

/// Blocks the calling thread until `done` finishes; rethrows its failure.
void wait_for(const Completion& done) { done.get(); }

/// Gathers every rank's PeerRecord over `state`'s communicator (within its timeout).
std::vector<PeerRecord> gather_records(const std::shared_ptr<detail::CommState>& state, int color, int key,
                                       const char* operation) {
  auto records = std::make_shared<std::vector<PeerRecord>>(static_cast<std::size_t>(state->size));
  auto mine = std::make_shared<PeerRecord>();
  detail::OperationSpec spec;
  spec.operation = operation;
  spec.what = "the exchange of ranks, colors and process ids";
  spec.watch_all = true;
  spec.keep = std::make_shared<std::pair<decltype(records), decltype(mine)>>(records, mine);
  spec.start = [records = records.get(), mine = mine.get(), color, key](MPI_Comm comm,
                                                                        std::vector<MPI_Request>& requests) {
    *mine = my_record(color, key);
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = MPI_Iallgather(mine, sizeof(PeerRecord), MPI_BYTE, records->data(), sizeof(PeerRecord), MPI_BYTE,
                                  comm, &request);
    if (rc == MPI_SUCCESS) requests.push_back(request);
    return rc;
  };
  wait_for(state->progress->submit(state, std::move(spec)));
  return *records;
}

Peer peer_of(const PeerRecord& r) {
  return {.world_rank = r.world_rank, .pid = r.pid, .host = r.host, .pid_namespace = r.pid_namespace};
}

std::vector<Peer> peers_of(const std::vector<PeerRecord>& records) {
  std::vector<Peer> peers;
  for (const PeerRecord& r : records) peers.push_back(peer_of(r));
  return peers;
}

const std::string empty_name;
const std::vector<Peer> no_peers;

}  // namespace

Communicator::Communicator() noexcept = default;

Communicator::Communicator(Communicator&& other) noexcept : state_(std::move(other.state_)) {}

Communicator& Communicator::operator=(Communicator&& other) noexcept {
  if (this != &other) {
    release();
    state_ = std::move(other.state_);
  }
  return *this;
}

Communicator::~Communicator() { release(); }

void Communicator::release() noexcept {
  if (!state_) return;
  std::shared_ptr<detail::CommState> state = std::move(state_);
  if (state->comm == MPI_COMM_NULL) return;
  try {
    detail::OperationSpec spec;
    spec.operation = "free";
    spec.what = "freeing the communicator";
    spec.cleanup = true;
    // A window or handle that shares the state may still submit work after this (a Python
    // object released late): it then finds no communicator, rather than a freed one.
    spec.start = [s = state.get()](MPI_Comm comm, std::vector<MPI_Request>&) {
      MPI_Comm doomed = comm;
      const int rc = MPI_Comm_free(&doomed);
      s->freed = true;  // on the progress thread, the only one that starts work on it
      return rc;
    };
    // Queued behind the communicator's collectives: MPI frees it once they have started, and
    // the handle itself no longer waits for anything.
    state->progress->submit(state, std::move(spec));
  } catch (...) {
    // A destructor cannot report it: the communicator is leaked, which MPI_Finalize tolerates.
  }
}

Communicator Communicator::world(Environment& env, CommunicatorOptions options) {
  auto state = std::make_shared<detail::CommState>();
  state->progress = env.progress();
  state->name = "world";
  state->timeout_ms.store(options.timeout.count());
  detail::OperationSpec dup;
  dup.operation = "create";
  dup.what = "duplicating MPI_COMM_WORLD";
  dup.start = [s = state.get()](MPI_Comm, std::vector<MPI_Request>&) {
    MPI_Comm comm = MPI_COMM_NULL;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    if (rc != MPI_SUCCESS) return rc;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &s->rank);
    MPI_Comm_size(comm, &s->size);
    s->comm = comm;
    return MPI_SUCCESS;
  };
  wait_for(state->progress->submit(state, std::move(dup)));
  state->peers = peers_of(gather_records(state, 0, state->rank, "create"));
  state->progress->note_world(state->peers);
  return Communicator(std::move(state));
}

Communicator Communicator::split(int color, int key, std::string name) const {
  if (!state_) throw Error(errc::invalid_argument, {}, fmt::format("split of an empty communicator into '{}'", name));
  const std::vector<PeerRecord> table = gather_records(state_, color < 0 ? -1 : color, key, "split");
  // MPI_Comm_split's order: the ranks of one color sorted by key, ties by rank in the parent.
  std::vector<int> members;
  for (int r = 0; r < state_->size; ++r)
    if (color >= 0 && table[static_cast<std::size_t>(r)].color == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return table[static_cast<std::size_t>(a)].key < table[static_cast<std::size_t>(b)].key;
  });

  auto state = std::make_shared<detail::CommState>();
  state->progress = state_->progress;
  state->name = std::move(name);
  state->timeout_ms.store(state_->timeout_ms.load());
  detail::OperationSpec spec;
  spec.operation = "split";
  spec.what = fmt::format("splitting into '{}'", state->name);
  spec.start = [s = state.get(), color, key](MPI_Comm parent, std::vector<MPI_Request>&) {
    MPI_Comm comm = MPI_COMM_NULL;
    const int rc = MPI_Comm_split(parent, color < 0 ? MPI_UNDEFINED : color, key, &comm);
    if (rc != MPI_SUCCESS) return rc;
    if (comm != MPI_COMM_NULL) {
      MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
      MPI_Comm_rank(comm, &s->rank);
      MPI_Comm_size(comm, &s->size);
      s->comm = comm;
    }
    return MPI_SUCCESS;
  };
  spec.keep = state;
  wait_for(state_->progress->submit(state_, std::move(spec)));  // on the parent's queue
  if (color < 0 || state->comm == MPI_COMM_NULL) return Communicator();
  if (static_cast<std::size_t>(state->size) != members.size())
    throw detail::collective_failure(
        *state, "split",
        fmt::format("MPI made a group of {} ranks where the exchanged colors give {}", state->size, members.size()));
  for (int m : members) state->peers.push_back(peer_of(table[static_cast<std::size_t>(m)]));
  return Communicator(std::move(state));
}

namespace {

/// Communicator::accept and Communicator::connect.
Communicator join(Environment& env, const Communicator& group, const std::string& service,
                  const RendezvousOptions& options, detail::JoinSide side,
                  const std::function<Communicator(std::shared_ptr<detail::CommState>)>& wrap) {
  const char* const operation = side == detail::JoinSide::accept ? "accept" : "connect";
  if (!group.valid())
    throw Error(errc::invalid_argument, {}, fmt::format("{} of '{}' over an empty communicator", operation, service));
  if (env.provided() < ThreadLevel::multiple)
    throw CollectiveError(errc::collective_error, {.operation = operation, .group = group.name()},
                          fmt::format("joining another job needs MPI_THREAD_MULTIPLE (EnvironmentOptions::required), "
                                      "and MPI was started with {}",
                                      thread_level_name(env.provided())));
  // The other job closes its TCP connections when it exits, maybe as this one still writes to
  // them: a write then raises SIGPIPE, which would kill this process where an error is due.
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
  // A private duplicate: the blocking steps run on it beside the progress thread, which must
  // never have the group's own collectives on it at the same time.
  Communicator local = group.split(0, group.rank(), group.name());
  const MPI_Comm merged = detail::join_jobs(local, side, service, options.timeout);
  auto state = std::make_shared<detail::CommState>();
  state->progress = env.progress();
  state->name = options.name.empty() ? service : options.name;
  state->timeout_ms.store(group.timeout().count());
  state->comm = merged;  // before any operation on it: the progress thread sees it through the queue
  MPI_Comm_rank(merged, &state->rank);
  MPI_Comm_size(merged, &state->size);
  Communicator joined = wrap(state);
  state->peers = peers_of(gather_records(state, 0, state->rank, operation));
  return joined;
}

}  // namespace

Communicator Communicator::accept(Environment& env, const Communicator& group, const std::string& service,
                                  RendezvousOptions options) {
  return join(env, group, service, options, detail::JoinSide::accept,
              [](std::shared_ptr<detail::CommState> s) { return Communicator(std::move(s)); });
}

Communicator Communicator::connect(Environment& env, const Communicator& group, const std::string& service,
                                   RendezvousOptions options) {
  return join(env, group, service, options, detail::JoinSide::connect,
              [](std::shared_ptr<detail::CommState> s) { return Communicator(std::move(s)); });
}

int Communicator::rank() const noexcept { return state_ ? state_->rank : -1; }
int Communicator::size() const noexcept { return state_ ? state_->size : 0; }
const std::string& Communicator::name() const noexcept { return state_ ? state_->name : empty_name; }
const std::vector<Peer>& Communicator::peers() const noexcept { return state_ ? state_->peers : no_peers; }

std::chrono::milliseconds Communicator::timeout() const noexcept {
  return std::chrono::milliseconds(state_ ? state_->timeout_ms.load() : 0);
}

void Communicator::set_timeout(std::chrono::milliseconds timeout) noexcept {
  if (state_) state_->timeout_ms.store(timeout.count());
}

bool Communicator::usable() const noexcept {
  if (!state_) return false;
  return !state_->progress->is_broken(*state_);
}

MPI_Comm Communicator::native() const noexcept { return state_ ? state_->comm : MPI_COMM_NULL; }

std::pair<std::shared_ptr<const std::vector<std::byte>>, Completion> Communicator::all_gather_bytes(
    std::vector<std::byte> contribution, std::optional<std::chrono::milliseconds> timeout, bool patient) {
  if (!state_)
    return {nullptr, Completion::failed(std::make_exception_ptr(
                         Error(errc::invalid_argument, {}, "all_gather_bytes on an empty communicator")))};
  auto in = std::make_shared<std::vector<std::byte>>(std::move(contribution));
  auto out = std::make_shared<std::vector<std::byte>>(in->size() * static_cast<std::size_t>(state_->size));
  if (in->size() > static_cast<std::size_t>(INT_MAX))
    return {out, Completion::failed(std::make_exception_ptr(detail::collective_failure(
                     *state_, "all_gather", fmt::format("{} bytes per rank is more than MPI counts", in->size()))))};
  detail::OperationSpec spec;
  spec.operation = "all_gather";
  spec.what = fmt::format("{} bytes per rank", in->size());
  spec.watch_all = true;
  spec.timeout = timeout.value_or(std::chrono::milliseconds(0));
  spec.patient = patient;
  spec.keep = std::make_shared<std::pair<decltype(in), decltype(out)>>(in, out);
  spec.start = [in = in.get(), out = out.get()](MPI_Comm comm, std::vector<MPI_Request>& requests) {
    MPI_Request request = MPI_REQUEST_NULL;
    const int n = static_cast<int>(in->size());
    const int rc = MPI_Iallgather(in->data(), n, MPI_BYTE, out->data(), n, MPI_BYTE, comm, &request);
    if (rc == MPI_SUCCESS) requests.push_back(request);
    return rc;
  };
  Completion done = state_->progress->submit(state_, std::move(spec));
  return {std::move(out), std::move(done)};
}

Completion Communicator::barrier(std::optional<std::chrono::milliseconds> timeout) {
  if (!state_)
    return Completion::failed(
        std::make_exception_ptr(Error(errc::invalid_argument, {}, "barrier on an empty communicator")));
  detail::OperationSpec spec;
  spec.operation = "barrier";
  spec.what = "the barrier";
  spec.watch_all = true;
  spec.timeout = timeout.value_or(std::chrono::milliseconds(0));
  spec.start = [](MPI_Comm comm, std::vector<MPI_Request>& requests) {
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = MPI_Ibarrier(comm, &request);
    if (rc == MPI_SUCCESS) requests.push_back(request);
    return rc;
  };
  return state_->progress->submit(state_, std::move(spec));
}

}  // namespace eredu::mpi
