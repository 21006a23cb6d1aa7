#include "progress.hpp"

#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <unistd.h>

#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"

namespace eredu::mpi::detail {

struct Progress::Operation {
  std::shared_ptr<CommState> comm;
  OperationSpec spec;
  CompletionSource done;
  std::atomic<bool> ready{false};
  std::exception_ptr input_error;  // written before `ready` is released
  std::vector<MPI_Request> requests;
  std::size_t remaining = 0;
  std::chrono::milliseconds timeout{0};
  std::chrono::steady_clock::time_point deadline;
  bool timed_out = false;  // failed by the timeout, still inside MPI: kept until MPI lets go
  int failure_rc = MPI_SUCCESS;
};

namespace {

using Clock = std::chrono::steady_clock;

/// True when process `pid` of this host no longer runs: no /proc entry, or a zombie.
bool process_exited(std::int64_t pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  const std::size_t close = line.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  const char state = line[close + 2];
  return state == 'Z' || state == 'X';
}

/// "rank 1 (pid 4711) of the group has exited", for the exited `ranks` of `c`.
std::string exited_text(const CommState& c, const std::vector<int>& ranks) {
  std::vector<std::string> who;
  for (int r : ranks) who.push_back(fmt::format("rank {} (pid {})", r, c.peers[static_cast<std::size_t>(r)].pid));
  return fmt::format("{} of the group {} exited", fmt::join(who, ", "), ranks.size() == 1 ? "has" : "have");
}

}  // namespace

Progress::~Progress() { stop(); }

void Progress::start() {
  std::lock_guard lock(mutex_);
  if (started_) return;
  started_ = true;
  thread_ = std::thread([this] { run(); });
}

void Progress::stop() {
  {
    std::lock_guard lock(mutex_);
    if (!started_ || stopping_) {
      stopping_ = true;
    } else {
      stopping_ = true;
      ++generation_;
    }
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

bool Progress::has_stuck_operations() const { return stuck_.load(std::memory_order_acquire) > 0; }

bool Progress::is_broken(const CommState& comm) const {
  std::lock_guard lock(mutex_);
  return comm.broken;
}

void Progress::note_world(std::vector<Peer> peers) {
  std::lock_guard lock(mutex_);
  world_ = std::move(peers);
}

std::vector<Peer> Progress::world() const {
  std::lock_guard lock(mutex_);
  return world_;
}

void Progress::wake() {
  {
    std::lock_guard lock(mutex_);
    ++generation_;
  }
  cv_.notify_all();
}

Completion Progress::submit(const std::shared_ptr<CommState>& comm, OperationSpec spec) {
  auto op = std::make_shared<Operation>();
  op->comm = comm;
  op->spec = std::move(spec);
  Completion result = op->done.completion();
  const Completion after = op->spec.after;
  {
    std::unique_lock lock(mutex_);
    if (!started_ || stopping_) {
      lock.unlock();
      op->done.fail(std::make_exception_ptr(
          collective_failure(*comm, op->spec.operation, "the MPI environment has shut down; nothing was started")));
      return result;
    }
    queue_.push_back(op);
  }
  if (after.valid()) {
    // Weak references: neither the operation nor the engine is kept alive by a completion
    // that may fire long after both are gone (a stopped engine drops what it never started).
    after.on_complete([weak_self = weak_from_this(), weak_op = std::weak_ptr<Operation>(op)](std::exception_ptr e) {
      std::shared_ptr<Operation> o = weak_op.lock();
      if (!o) return;
      o->input_error = std::move(e);
      o->ready.store(true, std::memory_order_release);
      if (std::shared_ptr<Progress> self = weak_self.lock()) self->wake();
    });
  } else {
    op->ready.store(true, std::memory_order_release);
    wake();
  }
  return result;
}

void Progress::take_startable(std::vector<std::shared_ptr<Operation>>& out) {
  // Per communicator, strictly in submission order: an operation that is not ready holds back
  // every later one of its communicator (MPI matches collectives by their order), never those
  // of other communicators.
  std::vector<const CommState*> blocked;
  for (auto it = queue_.begin(); it != queue_.end();) {
    const CommState* c = (*it)->comm.get();
    if (std::find(blocked.begin(), blocked.end(), c) != blocked.end()) {
      ++it;
    } else if ((*it)->ready.load(std::memory_order_acquire)) {
      out.push_back(std::move(*it));
      it = queue_.erase(it);
    } else {
      blocked.push_back(c);
      ++it;
    }
  }
}

std::exception_ptr Progress::broken_error(const Operation& op, const CommState& comm) const {
  return std::make_exception_ptr(collective_failure(
      comm, op.spec.operation,
      fmt::format("the group is unusable since an earlier failure ({}); nothing was started", comm.broken_reason)));
}

std::exception_ptr Progress::timeout_error(const Operation& op) const {
  const CommState& c = *op.comm;
  std::vector<int> gone = exited_peers(c);
  std::string detail;
  if (!gone.empty()) {
    detail =
        fmt::format("{} did not complete within {} ms: {}", op.spec.what, op.timeout.count(), exited_text(c, gone));
  } else {
    for (int r = 0; r < c.size; ++r)
      if (r != c.rank) gone.push_back(r);
    detail = fmt::format(
        "{} did not complete within {} ms while waiting for ranks {}; none is known to have exited (a rank is slow, "
        "stuck, or on another host)",
        op.spec.what, op.timeout.count(), rank_list(gone));
  }
  return std::make_exception_ptr(
      collective_failure(c, op.spec.operation, detail + "; the group is unusable from now on", gone));
}

void Progress::finish(const std::shared_ptr<Operation>& op, std::exception_ptr error) {
  if (!error && op->input_error) error = op->input_error;
  op->done.finish(std::move(error));
}

void Progress::start_operation(const std::shared_ptr<Operation>& op, std::vector<std::shared_ptr<Operation>>& active) {
  CommState& c = *op->comm;
  op->spec.after = Completion();  // its callbacks have run; drop the reference
  {
    std::unique_lock lock(mutex_);
    if (c.broken) {
      lock.unlock();
      // Freeing a communicator a stuck collective may still use is not safe: leave it.
      finish(op, op->spec.cleanup ? nullptr : broken_error(*op, c));
      return;
    }
  }
  if (c.freed) {  // by Communicator::release, while another handle kept its state
    finish(op, op->spec.cleanup ? nullptr
                                : std::make_exception_ptr(collective_failure(
                                      c, op->spec.operation,
                                      fmt::format("{}: the communicator was freed before it", op->spec.what))));
    return;
  }
  op->timeout = op->spec.timeout.count() > 0 ? op->spec.timeout
                                             : std::chrono::milliseconds(c.timeout_ms.load(std::memory_order_relaxed));
  int rc = MPI_SUCCESS;
  try {
    rc = op->spec.start(c.comm, op->requests);
  } catch (...) {
    if (op->requests.empty()) {
      finish(op, std::current_exception());
      return;
    }
    rc = MPI_ERR_OTHER;
  }
  op->remaining = op->requests.size();
  if (rc != MPI_SUCCESS) {
    const std::string text = fmt::format("{} could not be started: {}", op->spec.what, mpi_error_text(rc));
    {
      std::lock_guard lock(mutex_);
      c.broken = true;
      c.broken_reason = fmt::format("{} failed: {}", op->spec.operation, mpi_error_text(rc));
    }
    if (op->remaining > 0) {  // part of it is running: keep its buffers until MPI lets go
      op->timed_out = true;
      stuck_.fetch_add(1, std::memory_order_acq_rel);
      active.push_back(op);
    }
    finish(op, std::make_exception_ptr(collective_failure(c, op->spec.operation, text)));
    return;
  }
  op->deadline = Clock::now() + op->timeout;
  if (op->remaining == 0) {  // a blocking job, done inside start
    std::exception_ptr error;
    if (op->spec.on_success) try {
        op->spec.on_success();
      } catch (...) {
        error = std::current_exception();
      }
    finish(op, error);
    return;
  }
  active.push_back(op);
}

bool Progress::poll(std::vector<std::shared_ptr<Operation>>& active) {
  std::vector<MPI_Request> requests;
  std::vector<std::pair<std::size_t, std::size_t>> owner;  // (active index, request index)
  for (std::size_t i = 0; i < active.size(); ++i)
    for (std::size_t j = 0; j < active[i]->requests.size(); ++j)
      if (active[i]->requests[j] != MPI_REQUEST_NULL) {
        requests.push_back(active[i]->requests[j]);
        owner.emplace_back(i, j);
      }
  if (requests.empty()) return false;
  std::vector<int> indices(requests.size());
  std::vector<MPI_Status> statuses(requests.size());
  int count = 0;
  const int rc =
      MPI_Testsome(static_cast<int>(requests.size()), requests.data(), &count, indices.data(), statuses.data());
  if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
    // Which request failed is unknown: fail everything in flight and make the groups unusable.
    for (const std::shared_ptr<Operation>& op : active) {
      if (op->timed_out) continue;
      op->timed_out = true;
      stuck_.fetch_add(1, std::memory_order_acq_rel);
      {
        std::lock_guard lock(mutex_);
        op->comm->broken = true;
        op->comm->broken_reason = fmt::format("MPI_Testsome failed: {}", mpi_error_text(rc));
      }
      finish(op, std::make_exception_ptr(collective_failure(
                     *op->comm, op->spec.operation,
                     fmt::format("{}: testing for completion failed: {}", op->spec.what, mpi_error_text(rc)))));
    }
    return true;
  }
  if (count == MPI_UNDEFINED || count == 0) return false;
  for (int k = 0; k < count; ++k) {
    const auto [i, j] = owner[static_cast<std::size_t>(indices[static_cast<std::size_t>(k)])];
    Operation& op = *active[i];
    op.requests[j] = MPI_REQUEST_NULL;
    --op.remaining;
    if (op.spec.on_status && !op.timed_out) op.spec.on_status(statuses[static_cast<std::size_t>(k)]);
    if (rc == MPI_ERR_IN_STATUS && statuses[static_cast<std::size_t>(k)].MPI_ERROR != MPI_SUCCESS &&
        op.failure_rc == MPI_SUCCESS)
      op.failure_rc = statuses[static_cast<std::size_t>(k)].MPI_ERROR;
  }
  // Finish what completed, in submission order within `active`.
  std::vector<std::shared_ptr<Operation>> still;
  still.reserve(active.size());
  for (std::shared_ptr<Operation>& op : active) {
    if (op->remaining > 0) {
      still.push_back(std::move(op));
      continue;
    }
    if (op->timed_out) {
      stuck_.fetch_sub(1, std::memory_order_acq_rel);  // MPI let go at last: its buffers go now
      continue;
    }
    std::exception_ptr error;
    if (op->failure_rc != MPI_SUCCESS) {
      {
        std::lock_guard lock(mutex_);
        op->comm->broken = true;
        op->comm->broken_reason = fmt::format("{} failed: {}", op->spec.operation, mpi_error_text(op->failure_rc));
      }
      // A peer that died is the likeliest cause: name the ones known to have exited, in the
      // ranks and in the text (MPI may see the death before the exit check does).
      std::vector<int> gone = exited_peers(*op->comm);
      std::string detail = fmt::format("{} failed: {}", op->spec.what, mpi_error_text(op->failure_rc));
      if (!gone.empty()) detail += fmt::format("; {}", exited_text(*op->comm, gone));
      error = std::make_exception_ptr(collective_failure(*op->comm, op->spec.operation, detail, std::move(gone)));
    } else if (op->spec.on_success) {
      try {
        op->spec.on_success();
      } catch (...) {
        error = std::current_exception();
      }
    }
    finish(op, error);
  }
  active = std::move(still);
  return true;
}

void Progress::abandon(const std::shared_ptr<Operation>& op, std::string reason, std::exception_ptr error) {
  op->timed_out = true;
  stuck_.fetch_add(1, std::memory_order_acq_rel);
  {
    std::lock_guard lock(mutex_);
    op->comm->broken = true;
    op->comm->broken_reason = std::move(reason);
  }
  finish(op, std::move(error));
}

void Progress::expire(std::vector<std::shared_ptr<Operation>>& active) {
  const Clock::time_point now = Clock::now();
  for (const std::shared_ptr<Operation>& op : active) {
    if (op->timed_out || now < op->deadline) continue;
    abandon(op, fmt::format("{} timed out after {} ms", op->spec.operation, op->timeout.count()), timeout_error(*op));
  }
}

void Progress::fail_exited(std::vector<std::shared_ptr<Operation>>& active) {
  std::map<const CommState*, std::vector<int>> gone;  // one look at /proc per communicator
  for (const std::shared_ptr<Operation>& op : active) {
    if (op->timed_out || (!op->spec.watch_all && op->spec.watch_peer < 0)) continue;
    auto [it, fresh] = gone.try_emplace(op->comm.get());
    if (fresh) it->second = exited_peers(*op->comm);
    std::vector<int> doomed;
    for (int r : it->second)
      if (op->spec.watch_all || r == op->spec.watch_peer) doomed.push_back(r);
    if (doomed.empty()) continue;
    // As at a timeout: the requests stay with MPI, and the group is unusable.
    const std::string exited = exited_text(*op->comm, doomed);
    std::exception_ptr error = std::make_exception_ptr(collective_failure(
        *op->comm, op->spec.operation,
        fmt::format("{} cannot complete: {}; the group is unusable from now on", op->spec.what, exited),
        std::move(doomed)));
    abandon(op, fmt::format("{} during {}", exited, op->spec.operation), std::move(error));
  }
}

void Progress::run() {
  std::vector<std::shared_ptr<Operation>> active;
  Clock::time_point next_exit_check{};  // watched operations look for exited peers this often
  std::chrono::microseconds sleep{1};
  std::chrono::steady_clock::time_point spin_until{};  // patient waits poll without sleeping until then
  std::chrono::steady_clock::time_point idle_until{};  // with nothing to do, poll for new work until then
  for (;;) {
    std::vector<std::shared_ptr<Operation>> startable;
    std::deque<std::shared_ptr<Operation>> abandoned;
    std::uint64_t seen = 0;
    bool stopping = false;
    {
      std::unique_lock lock(mutex_);
      take_startable(startable);
      stopping = stopping_;
      if (stopping && startable.empty()) abandoned.swap(queue_);
      seen = generation_;
      if (startable.empty() && active.empty() && !stopping) {
        if (Clock::now() < idle_until) {
          lock.unlock();
          std::this_thread::yield();
          continue;
        }
        cv_.wait(lock, [&] { return generation_ != seen; });
        continue;
      }
    }
    for (const std::shared_ptr<Operation>& op : abandoned)
      op->done.fail(std::make_exception_ptr(
          Error(errc::cancelled, {},
                fmt::format("{} on group '{}' was never started: the MPI environment shut down first",
                            op->spec.operation, op->comm->name))));
    bool progressed = !startable.empty();
    for (const std::shared_ptr<Operation>& op : startable) start_operation(op, active);
    if (!active.empty()) {
      progressed |= poll(active);
      expire(active);
      if (const Clock::time_point now = Clock::now(); now >= next_exit_check) {
        fail_exited(active);
        next_exit_check = now + std::chrono::milliseconds(100);
      }
    }
    const bool urgent =
        std::any_of(active.begin(), active.end(), [](const auto& op) { return !op->timed_out && !op->spec.patient; });
    const bool waiting = std::any_of(active.begin(), active.end(), [](const auto& op) { return !op->timed_out; });
    if (stopping && !waiting) {
      std::lock_guard lock(mutex_);
      if (queue_.empty()) break;  // timed-out operations are left to MPI (finalize is skipped)
    }
    if (progressed) {
      sleep = std::chrono::microseconds(1);
      const Clock::time_point now = Clock::now();
      spin_until = now + options_.patient_spin;
      idle_until = now + options_.idle_spin;
      continue;
    }
    if (urgent || (waiting && std::chrono::steady_clock::now() < spin_until)) {
      // What MPI_Wait does under mpi_yield_when_idle: poll, giving the core away in between.
      std::this_thread::yield();
      continue;
    }
    // Only patient operations (or stuck ones) in flight: sleep between polls, waking early
    // for new work.
    {
      std::unique_lock lock(mutex_);
      cv_.wait_for(lock, sleep, [&] { return generation_ != seen; });
    }
    const std::chrono::microseconds cap = waiting ? options_.max_patient_sleep : std::chrono::microseconds(10'000);
    sleep = std::min(sleep * 2, cap);
  }
}

std::string mpi_error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) return fmt::format("MPI error {}", rc);
  int error_class = 0;
  MPI_Error_class(rc, &error_class);
  return fmt::format("{} (MPI error {}, class {})", std::string(text, static_cast<std::size_t>(length)), rc,
                     error_class);
}

CollectiveError collective_failure(const CommState& comm, const std::string& operation, const std::string& detail,
                                   std::vector<int> ranks) {
  return CollectiveError(
      errc::collective_error,
      {.operation = operation, .group = comm.name, .rank = comm.rank, .size = comm.size, .ranks = std::move(ranks)},
      detail);
}

bool Progress::peer_exited() const {
  std::vector<Peer> world;
  {
    std::lock_guard lock(mutex_);
    world = world_;
  }
  const auto self = static_cast<std::int64_t>(::getpid());
  const auto me = std::find_if(world.begin(), world.end(), [&](const Peer& p) { return p.pid == self; });
  if (me == world.end()) return false;
  return std::any_of(world.begin(), world.end(), [&](const Peer& p) {
    return p.pid != self && p.host == me->host && p.pid_namespace == me->pid_namespace && p.pid > 0 &&
           process_exited(p.pid);
  });
}

std::vector<int> exited_peers(const CommState& comm) {
  std::vector<int> out;
  if (comm.peers.size() != static_cast<std::size_t>(comm.size) || comm.rank < 0 || comm.rank >= comm.size) return out;
  const Peer& me = comm.peers[static_cast<std::size_t>(comm.rank)];
  for (int r = 0; r < comm.size; ++r) {
    const Peer& p = comm.peers[static_cast<std::size_t>(r)];
    // A pid from another PID namespace (a container beside ours) names no process here.
    if (r != comm.rank && p.host == me.host && p.pid_namespace == me.pid_namespace && p.pid > 0 &&
        process_exited(p.pid))
      out.push_back(r);
  }
  return out;
}

}  // namespace eredu::mpi::detail
