#include "rendezvous.hpp"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/collective_error.hpp"
#include "eredu/io/integrity/digest.hpp"
#include "progress.hpp"

namespace eredu::mpi::detail {
namespace {

using Clock = std::chrono::steady_clock;

/// How long a rank waits for MPI's accept and connect once both sides have agreed to join (the
/// other side is then on its way in), beyond what is left of the timeout.
constexpr std::chrono::milliseconds join_grace{10'000};

/// Between two lookups of a name the other job publishes.
constexpr std::chrono::milliseconds poll_interval{20};

const char* const name_server_hint =
    "both jobs need one MPI name server: start `ompi-server --no-daemonize -r FILE` and launch each job with "
    "`mpirun --ompi-server file:FILE`";

/// One blocking MPI sequence on a helper thread. The thread is detached: when it outlives its
/// wait, MPI still holds it and the caller leaves it there rather than wait forever.
struct Step {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  int rc = MPI_SUCCESS;
  std::string failed_call{};
  MPI_Comm merged = MPI_COMM_NULL;

  bool wait_until(Clock::time_point deadline) {
    std::unique_lock lock(mutex);
    return cv.wait_until(lock, deadline, [&] { return done; });
  }
};

/// What the side's first rank tells the others before they block in MPI.
struct RootStatus {
  std::int32_t ok = 0;
  std::int32_t timed_out = 0;
  char message[1024] = {};
};

/// Accepts (or connects) over `comm` and merges the intercommunicator, the accepting side's
/// ranks first.
void join_step(Step& s, bool accept, MPI_Comm comm, const std::string& port) {
  MPI_Comm inter = MPI_COMM_NULL;
  auto fail = [&](int rc, const char* call) {
    s.rc = rc;
    s.failed_call = call;
  };
  int rc = accept ? MPI_Comm_accept(port.c_str(), MPI_INFO_NULL, 0, comm, &inter)
                  : MPI_Comm_connect(port.c_str(), MPI_INFO_NULL, 0, comm, &inter);
  if (rc != MPI_SUCCESS) return fail(rc, accept ? "MPI_Comm_accept" : "MPI_Comm_connect");
  MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
  MPI_Comm merged = MPI_COMM_NULL;
  if ((rc = MPI_Intercomm_merge(inter, accept ? 0 : 1, &merged)) != MPI_SUCCESS) return fail(rc, "MPI_Intercomm_merge");
  MPI_Comm_set_errhandler(merged, MPI_ERRORS_RETURN);
  // The merged communicator is all either job keeps: the intercommunicator goes at once.
  if ((rc = MPI_Comm_disconnect(&inter)) != MPI_SUCCESS) return fail(rc, "MPI_Comm_disconnect");
  s.merged = merged;
}

std::shared_ptr<Step> start_detached(std::function<void(Step&)> body) {
  auto step = std::make_shared<Step>();
  std::thread([step, body = std::move(body)] {
    body(*step);
    std::lock_guard lock(step->mutex);
    step->done = true;
    step->cv.notify_all();
  }).detach();
  return step;
}

/// Looks `name` up until it is published or `deadline` passes; the last MPI error otherwise.
int lookup_until(const std::string& name, char* value, Clock::time_point deadline) {
  int rc = MPI_SUCCESS;
  while ((rc = MPI_Lookup_name(name.c_str(), MPI_INFO_NULL, value)) != MPI_SUCCESS && Clock::now() < deadline)
    std::this_thread::sleep_for(poll_interval);
  return rc;
}

/// 16 hex digits naming `text` (XXH3-128's first half): the same in every build.
std::string tag_of(const std::string& text) {
  return io::digest_hex(io::DigestKind::xxh3_128, std::as_bytes(std::span(text))).substr(0, 16);
}

/// A connector's name for one attempt, unlike any other process's, before or after.
std::string fresh_nonce() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::random_device random;
  return tag_of(
      fmt::format("{}/{}/{}/{}/{}", host, ::getpid(), Clock::now().time_since_epoch().count(), random(), random()));
}

}  // namespace

// MPI_Comm_accept and MPI_Comm_connect wait forever for the other side, and neither can be
// cancelled (a process cannot even connect to its own port to release its accept: OpenMPI 4.1
// deadlocks). So the first ranks of the two sides agree through the name server before either
// calls them, each step a lookup that is polled within the timeout:
//   acceptor: opens a port P and publishes it as SERVICE;
//   connector: looks SERVICE up, then publishes a fresh nonce N as SERVICE#knock#tag(P);
//   acceptor: looks SERVICE#knock#tag(P) up, unpublishes SERVICE, publishes P as SERVICE#ack#N,
//             and accepts;
//   connector: looks SERVICE#ack#N up, and connects.
// A side that gives up unpublishes its name first, so the other side's later lookup fails
// instead of leading it into a call that would never return. Past the agreement only a peer
// that dies can leave a rank inside MPI; that rank then waits the grace, fails with timed_out,
// and leaves MPI unfinalized.
// The name server keeps names after the job that published them is gone (ompi-server 4.1
// does, even after a kill -9, and another job cannot unpublish them). So the knock and the ack
// name this attempt's port and nonce: those a crashed attempt left never match a later one. A
// SERVICE a crashed acceptor left is published over by the next acceptor, and a connector that
// knocked at the port it named moves to the new one.
MPI_Comm join_jobs(Communicator& local, JoinSide side, const std::string& service, std::chrono::milliseconds timeout) {
  const bool accepting = side == JoinSide::accept;
  const char* const operation = accepting ? "accept" : "connect";
  const CommState& state = *local.state();
  auto failure = [&](errc kind, const std::string& detail) {
    return CollectiveError(kind, {.operation = operation, .group = state.name, .rank = state.rank, .size = state.size},
                           detail);
  };
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + timeout;
  const bool root = local.rank() == 0;
  std::string knock;  // SERVICE#knock#tag(P), once P is known
  std::string ack;    // SERVICE#ack#N, once N is known
  std::string nonce;  // the connector's N

  RootStatus mine;
  char port[MPI_MAX_PORT_NAME] = {};
  if (root) {
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);  // MPI-4 reports port errors there
    auto say = [&](bool timed_out, const std::string& text) {
      mine.timed_out = timed_out ? 1 : 0;
      std::strncpy(mine.message, text.c_str(), sizeof mine.message - 1);
    };
    char value[MPI_MAX_PORT_NAME] = {};
    if (accepting) {
      if (int rc = MPI_Open_port(MPI_INFO_NULL, port); rc != MPI_SUCCESS) {
        say(false, fmt::format("MPI_Open_port failed: {}", mpi_error_text(rc)));
      } else if (rc = MPI_Publish_name(service.c_str(), MPI_INFO_NULL, port); rc != MPI_SUCCESS) {
        say(false, fmt::format("offering the service '{}' failed (MPI_Publish_name: {}); {}", service,
                               mpi_error_text(rc), name_server_hint));
        MPI_Close_port(port);
      } else {
        knock = fmt::format("{}#knock#{}", service, tag_of(port));
        rc = lookup_until(knock, value, deadline);
        // Found or not, the service is no longer offered: one connector at a time.
        MPI_Unpublish_name(service.c_str(), MPI_INFO_NULL, port);
        if (rc != MPI_SUCCESS) rc = MPI_Lookup_name(knock.c_str(), MPI_INFO_NULL, value);  // came as it gave up
        if (rc == MPI_SUCCESS) {
          ack = fmt::format("{}#ack#{}", service, std::string_view(value).substr(0, 16));
          rc = MPI_Publish_name(ack.c_str(), MPI_INFO_NULL, port);
        }
        if (rc == MPI_SUCCESS) {
          mine.ok = 1;
        } else {
          say(true, fmt::format("no job connected to the service '{}' within {} ms", service, timeout.count()));
          MPI_Close_port(port);
        }
      }
    } else {
      // Knock at the port SERVICE names and wait for the answer to this attempt's nonce, which
      // names the port to connect to. When SERVICE comes to name another port (a new acceptor
      // over the offer a crashed one left), knock there instead.
      nonce = fresh_nonce();
      ack = fmt::format("{}#ack#{}", service, nonce);
      bool offered = false, knocked = false;
      std::string at;  // the port knocked at, or to knock at
      for (;;) {
        if (knocked && MPI_Lookup_name(ack.c_str(), MPI_INFO_NULL, port) == MPI_SUCCESS) {
          mine.ok = 1;
          break;
        }
        if (MPI_Lookup_name(service.c_str(), MPI_INFO_NULL, value) == MPI_SUCCESS && at != value) {
          if (knocked) MPI_Unpublish_name(knock.c_str(), MPI_INFO_NULL, nonce.c_str());
          knocked = false;
          offered = true;
          at = value;
          knock = fmt::format("{}#knock#{}", service, tag_of(at));
        }
        // Another connector's knock may be there: try again until it goes.
        if (offered && !knocked) knocked = MPI_Publish_name(knock.c_str(), MPI_INFO_NULL, nonce.c_str()) == MPI_SUCCESS;
        if (Clock::now() >= deadline) break;
        std::this_thread::sleep_for(poll_interval);
      }
      if (!mine.ok) {
        if (knocked) MPI_Unpublish_name(knock.c_str(), MPI_INFO_NULL, nonce.c_str());
        if (!offered)
          say(true, fmt::format("no job offered the service '{}' within {} ms; {}", service, timeout.count(),
                                name_server_hint));
        else if (!knocked)
          say(true, fmt::format("another job is joining the service '{}'; it was not free within {} ms", service,
                                timeout.count()));
        else
          say(true,
              fmt::format("the job offering the service '{}' did not answer within {} ms", service, timeout.count()));
      }
    }
  }
  // The others wait for the first rank's verdict as long as it may look names up.
  std::vector<std::byte> contribution(sizeof(RootStatus));
  std::memcpy(contribution.data(), &mine, sizeof mine);
  auto [gathered, exchanged] = local.all_gather_bytes(std::move(contribution), timeout + join_grace, true);
  exchanged.get();  // CollectiveError when a rank of this group is gone
  RootStatus status;
  std::memcpy(&status, gathered->data(), sizeof status);  // rank 0's
  status.message[sizeof status.message - 1] = '\0';
  if (!status.ok) throw failure(status.timed_out ? errc::timed_out : errc::collective_error, status.message);

  const MPI_Comm comm = local.native();
  const std::string port_name = port;
  std::shared_ptr<Step> step = start_detached([=](Step& s) { join_step(s, accepting, comm, port_name); });
  const bool finished = step->wait_until(std::max(deadline, Clock::now()) + join_grace);
  if (root && finished) {
    if (accepting) {
      MPI_Unpublish_name(ack.c_str(), MPI_INFO_NULL, port);
      MPI_Close_port(port);
    } else {
      MPI_Unpublish_name(knock.c_str(), MPI_INFO_NULL, nonce.c_str());
    }
  }
  if (!finished) {
    // A step MPI still holds: finalizing would wait for it too (see Environment).
    state.progress->leave_to_mpi();
    throw failure(errc::timed_out,
                  fmt::format("{} for the service '{}' did not complete within {} ms; the other job is gone, and MPI "
                              "is left unfinalized",
                              accepting ? "MPI_Comm_accept" : "MPI_Comm_connect", service,
                              std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count()));
  }
  std::lock_guard lock(step->mutex);
  if (step->rc != MPI_SUCCESS)
    throw failure(errc::collective_error, fmt::format("{} for the service '{}' failed: {}", step->failed_call, service,
                                                      mpi_error_text(step->rc)));
  return step->merged;
}

}  // namespace eredu::mpi::detail
