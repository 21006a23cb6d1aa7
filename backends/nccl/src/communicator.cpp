#include "eredu/nccl/communicator.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "comm_state.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"
#include "eredu/cuda/device.hpp"
#include "eredu/nccl/nccl_error.hpp"

namespace eredu::nccl {
namespace detail {

CommState::~CommState() {
  if (comm == nullptr) return;  // aborted
  try {
    cuda::DeviceGuard guard(device);
    // Non-blocking: finalize flushes the collectives still queued, then the communicator is
    // destroyed. A peer that is gone can keep finalize from ever finishing: after the timeout
    // the communicator is aborted instead.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms.load());
    ncclResult_t rc = ncclCommFinalize(comm);
    if (rc == ncclSuccess || rc == ncclInProgress) rc = wait_ready(comm, deadline);
    if (rc == ncclSuccess) rc = ncclCommDestroy(comm);
    if (rc != ncclSuccess) {
      log::warn("NCCL communicator '{}' (rank {} of {}): {}; aborting it", name, rank, size,
                rc == ncclInProgress ? std::string("finalize did not finish within the timeout")
                                     : nccl_error_text(rc, "ncclCommFinalize/Destroy", comm));
      (void)ncclCommAbort(comm);
    }
  } catch (...) {
    // The device could not be selected (it vanished): nothing left to free it with.
  }
  comm = nullptr;
}

void abort_locked(CommState& state, const std::string& reason) noexcept {
  if (!state.broken) {
    state.broken = true;
    try {
      state.broken_reason = reason;
    } catch (...) {
      // bad_alloc: the group is unusable all the same, without the reason.
    }
  }
  if (state.comm == nullptr) return;
  try {
    cuda::DeviceGuard guard(state.device);
    (void)ncclCommAbort(state.comm);
  } catch (...) {
    (void)ncclCommAbort(state.comm);  // on whatever device is current: better than leaving it running
  }
  state.comm = nullptr;
}

ncclResult_t wait_ready(ncclComm_t comm, std::chrono::steady_clock::time_point deadline) noexcept {
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
    if (rc != ncclSuccess) return rc;
    if (state != ncclInProgress) return state;
    if (std::chrono::steady_clock::now() >= deadline) return ncclInProgress;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

CollectiveError collective_failure(const std::string& group, int rank, int size, const std::string& operation,
                                   const std::string& detail, std::vector<int> ranks) {
  return CollectiveError(
      errc::collective_error,
      {.operation = operation, .group = group, .rank = rank, .size = size, .ranks = std::move(ranks)}, detail);
}

std::vector<int> other_ranks(int rank, int size) {
  std::vector<int> out;
  for (int r = 0; r < size; ++r)
    if (r != rank) out.push_back(r);
  return out;
}

}  // namespace detail

namespace {

/// What each rank contributes to the creation's exchange: rank 0's unique id (zeros elsewhere)
/// and whether it could make one, and the PCI bus id of the rank's device.
struct Record {
  std::array<char, NCCL_UNIQUE_ID_BYTES> id{};
  std::int32_t id_status = ncclSuccess;  ///< rank 0's ncclGetUniqueId result
  std::int32_t bus_status = 0;           ///< cudaDeviceGetPCIBusId's result
  std::array<char, 32> bus{};            ///< "0000:17:00.0"
};

std::vector<std::byte> to_bytes(const Record& r) {
  std::vector<std::byte> out(sizeof(Record));
  std::memcpy(out.data(), &r, sizeof(Record));
  return out;
}

const std::string empty_name;

}  // namespace

Communicator::Communicator() noexcept = default;
Communicator::Communicator(Communicator&& other) noexcept = default;
Communicator& Communicator::operator=(Communicator&& other) noexcept = default;
Communicator::~Communicator() = default;

Communicator Communicator::create(mpi::Communicator& bootstrap, int device, std::string name,
                                  CommunicatorOptions options) {
  if (!bootstrap.valid())
    throw Error(errc::invalid_argument, {}, "creating an NCCL communicator over an empty MPI communicator");
  if (name.empty()) name = bootstrap.name();
  const int rank = bootstrap.rank();
  const int size = bootstrap.size();
  auto fail = [&](const std::string& why, std::vector<int> ranks = {}) {
    return detail::collective_failure(name, rank, size, "create", why, std::move(ranks));
  };
  cuda::DeviceGuard guard(device);  // BackendError when the device cannot be selected

  // Every rank takes part in the exchange even when its own part failed, so that the others
  // learn of it at once instead of after the timeout.
  Record mine;
  if (rank == 0) {
    ncclUniqueId id;
    mine.id_status = ncclGetUniqueId(&id);
    if (mine.id_status == ncclSuccess) std::memcpy(mine.id.data(), id.internal, NCCL_UNIQUE_ID_BYTES);
  }
  mine.bus_status = cudaDeviceGetPCIBusId(mine.bus.data(), static_cast<int>(mine.bus.size()) - 1, device);
  if (mine.bus_status != cudaSuccess) (void)cudaGetLastError();
  auto [gathered, done] = bootstrap.all_gather_bytes(to_bytes(mine), options.timeout);
  done.get();  // CollectiveError naming the MPI group when a rank never joins
  std::vector<Record> records(static_cast<std::size_t>(size));
  std::memcpy(records.data(), gathered->data(), records.size() * sizeof(Record));

  if (records[0].id_status != ncclSuccess)
    throw fail(fmt::format("rank 0 could not make NCCL's unique id: {}",
                           nccl_error_text(static_cast<ncclResult_t>(records[0].id_status), "ncclGetUniqueId")),
               {0});
  const std::vector<mpi::Peer>& peers = bootstrap.peers();
  for (int a = 0; a < size; ++a) {
    const Record& ra = records[static_cast<std::size_t>(a)];
    if (ra.bus_status != cudaSuccess)
      throw fail(fmt::format("rank {} could not read its device's PCI bus id: {}", a,
                             cudaGetErrorName(static_cast<cudaError_t>(ra.bus_status))),
                 {a});
    for (int b = a + 1; b < size; ++b) {
      const Record& rb = records[static_cast<std::size_t>(b)];
      if (peers[static_cast<std::size_t>(a)].host == peers[static_cast<std::size_t>(b)].host &&
          std::strncmp(ra.bus.data(), rb.bus.data(), ra.bus.size()) == 0)
        throw fail(fmt::format("ranks {} and {} are on the same CUDA device (PCI {}) of one host: NCCL needs a "
                               "device of its own for every rank of a communicator",
                               a, b, ra.bus.data()),
                   {a, b});
    }
  }

  ncclUniqueId id;
  std::memcpy(id.internal, records[0].id.data(), NCCL_UNIQUE_ID_BYTES);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // returns at once; progress is polled, so the wait has a bound
  ncclComm_t comm = nullptr;
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if ((rc == ncclSuccess || rc == ncclInProgress) && comm != nullptr) rc = detail::wait_ready(comm, deadline);
  if (rc != ncclSuccess) {
    const std::string message =
        rc == ncclInProgress
            ? fmt::format("ncclCommInitRankConfig on device {} did not complete within {} ms: a rank never joined",
                          device, options.timeout.count())
            : fmt::format("{} (device {})", nccl_error_text(rc, "ncclCommInitRankConfig", comm), device);
    if (comm != nullptr) (void)ncclCommAbort(comm);
    throw fail(message, rc == ncclInProgress ? detail::other_ranks(rank, size) : std::vector<int>{});
  }

  auto state = std::make_shared<detail::CommState>();
  state->comm = comm;
  state->name = std::move(name);
  state->rank = rank;
  state->size = size;
  state->device = device;
  state->timeout_ms.store(options.timeout.count());
  return Communicator(std::move(state));
}

int Communicator::rank() const noexcept { return state_ ? state_->rank : -1; }
int Communicator::size() const noexcept { return state_ ? state_->size : 0; }
int Communicator::device() const noexcept { return state_ ? state_->device : -1; }
const std::string& Communicator::name() const noexcept { return state_ ? state_->name : empty_name; }

std::chrono::milliseconds Communicator::timeout() const noexcept {
  return std::chrono::milliseconds(state_ ? state_->timeout_ms.load() : 0);
}

void Communicator::set_timeout(std::chrono::milliseconds timeout) noexcept {
  if (state_) state_->timeout_ms.store(timeout.count());
}

bool Communicator::usable() const noexcept {
  if (!state_) return false;
  std::lock_guard lock(state_->mutex);
  return !state_->broken;
}

std::string Communicator::broken_reason() const {
  if (!state_) return "an empty communicator";
  std::lock_guard lock(state_->mutex);
  return state_->broken_reason;
}

void Communicator::abort(const std::string& reason) noexcept {
  if (!state_) return;
  std::lock_guard lock(state_->mutex);
  detail::abort_locked(*state_, reason);
}

ncclComm_t Communicator::native() const noexcept {
  if (!state_) return nullptr;
  std::lock_guard lock(state_->mutex);
  return state_->comm;
}

}  // namespace eredu::nccl
