#include "live/channel.hpp"

#include <algorithm>
#include <climits>
#include <utility>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"

namespace eredu::mpi::detail {
namespace {

/// Runs `job` on the progress thread as a blocking job and waits for it; rethrows its failure.
void run_blocking(const std::shared_ptr<CommState>& comm, std::string operation, std::string what,
                  UniqueFunction<int(MPI_Comm)> job, bool cleanup = false) {
  OperationSpec spec;
  spec.operation = std::move(operation);
  spec.what = std::move(what);
  spec.cleanup = cleanup;
  spec.start = [job = std::move(job)](MPI_Comm c, std::vector<MPI_Request>&) mutable { return job(c); };
  comm->progress->submit(comm, std::move(spec)).get();
}

/// A barrier within the communicator's timeout (so a blocking collective after it cannot hang
/// on a rank that never comes). Throws CollectiveError.
void barrier(const std::shared_ptr<CommState>& comm, const char* operation) {
  OperationSpec spec;
  spec.operation = operation;
  spec.what = "the barrier before the window's creation or release";
  spec.patient = true;
  spec.watch_all = true;
  spec.start = [](MPI_Comm c, std::vector<MPI_Request>& requests) {
    MPI_Request r = MPI_REQUEST_NULL;
    const int rc = MPI_Ibarrier(c, &r);
    if (rc == MPI_SUCCESS) requests.push_back(r);
    return rc;
  };
  comm->progress->submit(comm, std::move(spec)).get();
}

/// MPI_Isend of `bytes`, which `keep` holds until MPI is done with them.
Completion send_bytes(const std::shared_ptr<CommState>& comm, int dest, int tag, std::span<const std::byte> bytes,
                      std::shared_ptr<void> keep, std::string what, std::chrono::milliseconds timeout,
                      bool watch_dest = false) {
  OperationSpec spec;
  spec.operation = "live message";
  spec.what = std::move(what);
  spec.timeout = timeout;
  spec.watch_peer = watch_dest ? dest : -1;
  spec.start = [dest, tag, bytes](MPI_Comm c, std::vector<MPI_Request>& requests) {
    if (bytes.size() > static_cast<std::size_t>(INT_MAX)) return static_cast<int>(MPI_ERR_COUNT);
    MPI_Request r = MPI_REQUEST_NULL;
    const int rc = MPI_Isend(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, dest, tag, c, &r);
    if (rc == MPI_SUCCESS) requests.push_back(r);
    return rc;
  };
  spec.keep = std::move(keep);
  return comm->progress->submit(comm, std::move(spec));
}

}  // namespace

LiveWindow::LiveWindow(std::shared_ptr<CommState> comm, bool lock_all) : comm_(std::move(comm)) {
  barrier(comm_, "live window");
  run_blocking(comm_, "live window", "MPI_Win_create_dynamic", [this, lock_all](MPI_Comm c) {
    int rc = MPI_Win_create_dynamic(MPI_INFO_NULL, c, &win_);
    if (rc != MPI_SUCCESS) return rc;
    MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN);
    if (lock_all) {
      rc = MPI_Win_lock_all(MPI_MODE_NOCHECK, win_);
      locked_ = rc == MPI_SUCCESS;
    }
    return rc;
  });
}

LiveWindow::~LiveWindow() {
  if (win_ == MPI_WIN_NULL) return;
  try {
    if (comm_->progress->is_broken(*comm_) || !exited_peers(*comm_).empty()) {
      // Unlocking or freeing would wait for (or, in osc/rdma, retry reads of) a rank that is gone.
      log::warn("live updates: the group '{}' is unusable or has lost a rank; its window is left to MPI", comm_->name);
      comm_->progress->leave_to_mpi();
      return;
    }
    if (locked_)
      run_blocking(
          comm_, "live window", "MPI_Win_unlock_all", [this](MPI_Comm) { return MPI_Win_unlock_all(win_); }, true);
    barrier(comm_, "live window");
    run_blocking(
        comm_, "live window", "MPI_Win_free", [this](MPI_Comm) { return MPI_Win_free(&win_); }, true);
  } catch (const std::exception& e) {
    log::warn("live updates: the window of group '{}' is left to MPI: {}", comm_->name, e.what());
    comm_->progress->leave_to_mpi();
  }
}

MPI_Aint LiveWindow::attach(std::span<const std::byte> memory) {
  MPI_Aint address = 0;
  if (memory.empty()) return address;
  run_blocking(comm_, "live publish", fmt::format("MPI_Win_attach of {} bytes", memory.size()),
               [this, memory, &address](MPI_Comm) {
                 void* base = const_cast<std::byte*>(memory.data());  // MPI's signature; the window is read-only
                 const int rc = MPI_Win_attach(win_, base, static_cast<MPI_Aint>(memory.size()));
                 if (rc != MPI_SUCCESS) return rc;
                 return MPI_Get_address(base, &address);
               });
  return address;
}

void LiveWindow::detach(std::span<const std::byte> memory) noexcept {
  if (memory.empty()) return;
  try {
    run_blocking(
        comm_, "live withdraw", "MPI_Win_detach",
        [this, memory](MPI_Comm) { return MPI_Win_detach(win_, const_cast<std::byte*>(memory.data())); }, true);
  } catch (const std::exception& e) {
    log::warn("live updates: detaching {} bytes failed: {}", memory.size(), e.what());
  }
}

Completion LiveWindow::read(int target, MPI_Aint base, std::vector<ByteRun> runs, std::span<std::byte> destination,
                            std::string what, std::chrono::milliseconds timeout) {
  OperationSpec spec;
  spec.operation = "live read";
  spec.what = std::move(what);
  spec.timeout = timeout;
  spec.start = [this, target, base, runs = std::move(runs), destination](MPI_Comm, std::vector<MPI_Request>& requests) {
    // OpenMPI 4.1's osc/rdma retries a failed single-copy read (process_vm_readv of a process
    // that has exited) inside MPI_Rget, forever, holding this thread: never start a read from a
    // publisher known to be gone. (A death during the read itself is not caught; see
    // docs/live_updates.md.)
    const std::vector<int> gone = exited_peers(*comm_);
    if (std::find(gone.begin(), gone.end(), target) != gone.end())
      throw collective_failure(*comm_, "live read",
                               fmt::format("the publisher (rank {}, pid {}) has exited", target,
                                           comm_->peers[static_cast<std::size_t>(target)].pid),
                               {target});
    std::uint64_t total = 0;
    bool packed = true;  // the runs fill the destination in order (else: a delta's blocks)
    std::vector<int> lengths;
    std::vector<MPI_Aint> displacements, destinations;
    lengths.reserve(runs.size());
    displacements.reserve(runs.size());
    destinations.reserve(runs.size());
    for (const ByteRun& r : runs) {
      if (r.length > static_cast<std::uint64_t>(INT_MAX) || r.dest_offset > destination.size() ||
          r.length > destination.size() - r.dest_offset)
        return static_cast<int>(MPI_ERR_COUNT);
      packed = packed && r.dest_offset == total;
      lengths.push_back(static_cast<int>(r.length));
      displacements.push_back(static_cast<MPI_Aint>(r.source_offset));
      destinations.push_back(static_cast<MPI_Aint>(r.dest_offset));
      total += r.length;
    }
    if ((packed && total != destination.size()) || total > static_cast<std::uint64_t>(INT_MAX))
      return static_cast<int>(MPI_ERR_COUNT);
    MPI_Datatype type = MPI_DATATYPE_NULL, into = MPI_DATATYPE_NULL;
    int rc =
        MPI_Type_create_hindexed(static_cast<int>(runs.size()), lengths.data(), displacements.data(), MPI_BYTE, &type);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&type);
    if (rc == MPI_SUCCESS && !packed) {
      rc =
          MPI_Type_create_hindexed(static_cast<int>(runs.size()), lengths.data(), destinations.data(), MPI_BYTE, &into);
      if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&into);
    }
    if (rc == MPI_SUCCESS) {
      MPI_Request r = MPI_REQUEST_NULL;
      rc = packed ? MPI_Rget(destination.data(), static_cast<int>(total), MPI_BYTE, target, base, 1, type, win_, &r)
                  : MPI_Rget(destination.data(), 1, into, target, base, 1, type, win_, &r);
      if (rc == MPI_SUCCESS) requests.push_back(r);
    }
    // Pending operations keep what they need.
    if (type != MPI_DATATYPE_NULL) MPI_Type_free(&type);
    if (into != MPI_DATATYPE_NULL) MPI_Type_free(&into);
    return rc;
  };
  return comm_->progress->submit(comm_, std::move(spec));
}

Completion send_message(const std::shared_ptr<CommState>& comm, int dest, int tag,
                        std::shared_ptr<const std::vector<std::byte>> bytes, std::string what,
                        std::chrono::milliseconds timeout, bool watch_dest) {
  const std::span<const std::byte> view(*bytes);
  return send_bytes(comm, dest, tag, view, std::const_pointer_cast<std::vector<std::byte>>(std::move(bytes)),
                    std::move(what), timeout, watch_dest);
}

Completion send_message(const std::shared_ptr<CommState>& comm, int dest, int tag,
                        std::shared_ptr<const MessageBuffer> message, std::string what,
                        std::chrono::milliseconds timeout) {
  const std::span<const std::byte> view = message->bytes();
  return send_bytes(comm, dest, tag, view, std::const_pointer_cast<MessageBuffer>(std::move(message)), std::move(what),
                    timeout);
}

Completion send_memory(const std::shared_ptr<CommState>& comm, int dest, int tag, std::span<const std::byte> memory,
                       std::string what, std::chrono::milliseconds timeout) {
  return send_bytes(comm, dest, tag, memory, nullptr, std::move(what), timeout);
}

std::pair<std::shared_ptr<PostedReceive>, Completion> receive_message(const std::shared_ptr<CommState>& comm,
                                                                      int source, int tag, std::size_t capacity,
                                                                      std::string what,
                                                                      std::chrono::milliseconds timeout, bool patient) {
  return receive_message(comm, source, tag, MessageBuffer(capacity), std::move(what), timeout, patient);
}

std::pair<std::shared_ptr<PostedReceive>, Completion> receive_message(const std::shared_ptr<CommState>& comm,
                                                                      int source, int tag, MessageBuffer buffer,
                                                                      std::string what,
                                                                      std::chrono::milliseconds timeout, bool patient) {
  auto receive = std::make_shared<PostedReceive>();
  receive->buffer = std::move(buffer);
  receive->buffer.set_size(0);  // until the message comes
  OperationSpec spec;
  spec.operation = "live message";
  spec.what = std::move(what);
  spec.timeout = timeout;
  spec.patient = patient;
  spec.watch_peer = source >= 0 ? source : -1;  // a receive from any rank waits for no one rank
  spec.keep = receive;
  spec.start = [source, tag, rx = receive.get()](MPI_Comm c, std::vector<MPI_Request>& requests) {
    if (rx->cancel_requested) return static_cast<int>(MPI_SUCCESS);  // cancelled before it started
    const int rc =
        MPI_Irecv(rx->buffer.data(), static_cast<int>(rx->buffer.capacity()), MPI_BYTE, source, tag, c, &rx->request);
    if (rc == MPI_SUCCESS) requests.push_back(rx->request);
    return rc;
  };
  spec.on_status = [rx = receive.get()](const MPI_Status& status) {
    int count = 0;
    if (MPI_Get_count(&status, MPI_BYTE, &count) == MPI_SUCCESS && count >= 0)
      rx->buffer.set_size(static_cast<std::size_t>(count));
  };
  Completion done = comm->progress->submit(comm, std::move(spec));
  // Runs on the progress thread (or inline when it already failed): the handle is spent.
  done.on_complete([keep = std::weak_ptr<PostedReceive>(receive)](std::exception_ptr) {
    if (auto alive = keep.lock()) alive->request = MPI_REQUEST_NULL;
  });
  return {receive, done};
}

void cancel_receive(const std::shared_ptr<CommState>& comm, const std::shared_ptr<PostedReceive>& receive) {
  OperationSpec spec;
  spec.operation = "live message";
  spec.what = "cancelling a receive";
  spec.cleanup = true;
  spec.keep = receive;
  spec.start = [rx = receive.get()](MPI_Comm, std::vector<MPI_Request>&) {
    rx->cancel_requested = true;
    if (rx->request != MPI_REQUEST_NULL) MPI_Cancel(&rx->request);
    return static_cast<int>(MPI_SUCCESS);
  };
  comm->progress->submit(comm, std::move(spec));
}

}  // namespace eredu::mpi::detail
