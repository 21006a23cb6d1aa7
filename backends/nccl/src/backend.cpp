#include "eredu/nccl/backend.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm_state.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/unique_function.hpp"
#include "eredu/cuda/device.hpp"
#include "eredu/engine/detail/gather_output.hpp"
#include "eredu/nccl/data_type.hpp"
#include "eredu/nccl/nccl_error.hpp"
#include "watchdog.hpp"

namespace eredu::nccl {
namespace {

using Clock = std::chrono::steady_clock;

/// The completion handed to the caller, settled once: by the stream work or by the watchdog,
/// whichever comes first.
struct Pending {
  std::mutex mutex;
  bool settled = false;
  CompletionSource out;
  std::optional<detail::Watchdog::Id> watch;
};

/// Claims `p` for the caller that settles it; false when it was settled already.
bool claim(Pending& p) {
  std::lock_guard lock(p.mutex);
  if (p.settled) return false;
  p.settled = true;
  return true;
}

std::string describe(const cuda::Tensor& t) {
  return fmt::format("{} {}", dtype_name(t.dtype()), format_shape(t.shape()));
}

/// Refuses what no collective can take: an empty group, a tensor or executor on another device.
void require_same_device(const Communicator& group, const cuda::Executor& executor, const cuda::Tensor& tensor,
                         const char* operation, const std::string& what) {
  if (!group.valid())
    throw Error(errc::invalid_argument, {}, fmt::format("{} of {} on an empty communicator", operation, what));
  if (executor.device() != group.device())
    throw Error(errc::invalid_argument, {},
                fmt::format("{} of {} on group '{}': the executor is on device {}, the group on device {}", operation,
                            what, group.name(), executor.device(), group.device()));
  if (tensor && tensor.device() != group.device())
    throw Error(errc::invalid_argument, {},
                fmt::format("{} of {} on group '{}': the tensor is on device {}, the group on device {}", operation,
                            what, group.name(), tensor.device(), group.device()));
}

/// Queues NCCL's calls on the stream: returns the result of the last call and sets `call` to
/// its name (for messages).
using Issue = UniqueFunction<ncclResult_t(ncclComm_t, cudaStream_t, const char*& call)>;

/// What the watchdog does when a collective outlives its timeout: fails the caller's
/// completion, naming what NCCL knows, and aborts the communicator (its kernels end).
void expire(const std::shared_ptr<detail::CommState>& state, const std::shared_ptr<Pending>& pending,
            const std::string& operation, const std::string& what, std::chrono::milliseconds timeout) {
  if (!claim(*pending)) return;
  std::string message = fmt::format("{} did not complete within {} ms", what, timeout.count());
  {
    std::lock_guard lock(state->mutex);
    if (state->comm != nullptr) {
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(state->comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
        message += fmt::format(" ({})", nccl_error_text(async, "the communicator", state->comm));
    }
    detail::abort_locked(*state, fmt::format("{} of {} timed out after {} ms", operation, what, timeout.count()));
  }
  message += ": a peer never joined or stalled; the communicator was aborted and the group is unusable from now on";
  std::exception_ptr error;
  try {
    error = std::make_exception_ptr(detail::collective_failure(state->name, state->rank, state->size, operation,
                                                               message, detail::other_ranks(state->rank, state->size)));
  } catch (...) {
    error = std::current_exception();
  }
  pending->out.fail(std::move(error));
}

/// Enqueues `issue` on `executor` after its earlier work, watched by the watchdog from the
/// moment it is queued; `keep` (the buffers) is held until the stream work itself is done,
/// even when the watchdog failed the completion earlier.
Completion run_collective(cuda::Executor& executor, Communicator& group, std::string operation, std::string what,
                          std::shared_ptr<const void> keep, Issue issue) {
  std::shared_ptr<detail::CommState> state = group.state();
  auto pending = std::make_shared<Pending>();
  Completion result = pending->out.completion();
  Completion work = executor.enqueue(
      [state, pending, operation, what, issue = std::move(issue)](cudaStream_t stream) mutable {
        std::lock_guard lock(state->mutex);
        if (state->broken)
          throw detail::collective_failure(state->name, state->rank, state->size, operation,
                                           fmt::format("{}: the group is unusable: {}", what, state->broken_reason));
        cuda::DeviceGuard guard(state->device);
        const auto timeout = std::chrono::milliseconds(state->timeout_ms.load());
        const auto deadline = Clock::now() + timeout;
        const char* call = "NCCL";
        ncclResult_t rc = issue(state->comm, stream, call);
        // Non-blocking communicators may still be queueing the work: wait for that, bounded.
        if (rc == ncclInProgress) rc = detail::wait_ready(state->comm, deadline);
        if (rc != ncclSuccess) {
          const std::string message =
              rc == ncclInProgress ? fmt::format("{}: {} was not queued within {} ms", what, call, timeout.count())
                                   : fmt::format("{}: {}", what, nccl_error_text(rc, call, state->comm));
          detail::abort_locked(*state, fmt::format("{} failed: {}", operation, message));
          // Not queued in time: NCCL was still connecting to peers that never came (NCCL
          // connects lazily, at a communicator's first collective), so every other rank is named.
          throw detail::collective_failure(
              state->name, state->rank, state->size, operation,
              message + "; the communicator was aborted and the group is unusable",
              rc == ncclInProgress ? detail::other_ranks(state->rank, state->size) : std::vector<int>{});
        }
        const detail::Watchdog::Id id = detail::watchdog().arm(
            deadline, [state, pending, operation, what, timeout] { expire(state, pending, operation, what, timeout); });
        std::lock_guard watch(pending->mutex);
        pending->watch = id;
      },
      what);
  work.on_complete([pending, state, keep = std::move(keep)](std::exception_ptr error) mutable {
    std::optional<detail::Watchdog::Id> watch;
    {
      std::lock_guard lock(pending->mutex);
      watch = pending->watch;
    }
    if (watch) detail::watchdog().cancel(*watch);
    if (claim(*pending)) pending->out.finish(std::move(error));
    keep.reset();  // here, on the relay thread: it may free device memory
  });
  return result;
}

/// The gather of `tensor` into `out` once both are checked: all_gather's and all_gather_into's
/// one path (an all_gather is a fresh output and this). NCCL itself takes the in-place form
/// (`tensor` as this rank's block of `out`) from the addresses.
Completion gather_into(cuda::Executor& executor, Communicator& group, const char* operation, const cuda::Tensor& tensor,
                       const cuda::Tensor& out, const std::string& what) {
  if (tensor.nbytes() == 0) return Completion::ready_now();
  auto keep = std::make_shared<std::pair<cuda::Tensor, cuda::Tensor>>(tensor, out);
  return run_collective(executor, group, operation, what, std::move(keep),
                        [in = tensor.data(), result = out.data(), n = tensor.nbytes()](
                            ncclComm_t comm, cudaStream_t stream, const char*& call) {
                          call = "ncclAllGather";
                          return ncclAllGather(in, result, n, ncclUint8, comm, stream);
                        });
}

}  // namespace

std::pair<cuda::Tensor, Completion> Backend::all_reduce(Executor& executor, Group& group, Tensor tensor,
                                                        engine::ReduceOp op) {
  const std::string what = fmt::format("{} ({})", describe(tensor), engine::reduce_op_name(op));
  const ncclDataType_t type = require_reducible(tensor.dtype(), op);
  require_same_device(group, executor, tensor, "all_reduce", what);
  if (tensor.nbytes() == 0) return {std::move(tensor), Completion::ready_now()};
  const std::size_t count = static_cast<std::size_t>(tensor.elements());
  Completion done = run_collective(executor, group, "all_reduce", what, tensor.storage(),
                                   [data = tensor.data(), count, type, nccl_op = reduce_op(op)](
                                       ncclComm_t comm, cudaStream_t stream, const char*& call) {
                                     call = "ncclAllReduce";
                                     return ncclAllReduce(data, data, count, type, nccl_op, comm, stream);  // in place
                                   });
  return {std::move(tensor), std::move(done)};
}

std::pair<cuda::Tensor, Completion> Backend::all_gather(Executor& executor, Group& group, Tensor tensor) {
  const std::string what = describe(tensor);
  require_same_device(group, executor, tensor, "all_gather", what);
  Tensor out = Tensor::allocate(default_memory(executor.device()), tensor.dtype(),
                                engine::detail::gathered_shape(tensor.shape(), group.size()), executor.shared_stream(),
                                "all_gather");
  Completion done = gather_into(executor, group, "all_gather", tensor, out, what);
  return {std::move(out), std::move(done)};
}

Completion Backend::all_gather_into(Executor& executor, Group& group, Tensor tensor, Tensor output) {
  const std::string what = describe(tensor);
  require_same_device(group, executor, tensor, "all_gather_into", what);
  if (output && output.device() != group.device())
    throw Error(errc::invalid_argument, {},
                fmt::format("all_gather_into of {} on group '{}': the output is on device {}, the group on device {}",
                            what, group.name(), output.device(), group.device()));
  engine::detail::check_gather_output(
      "all_gather_into", {tensor.dtype(), tensor.shape(), tensor.data(), tensor.nbytes()},
      {output.dtype(), output.shape(), output.data(), output.nbytes()}, group.rank(), group.size());
  return gather_into(executor, group, "all_gather_into", tensor, output, what);
}

std::pair<cuda::Tensor, Completion> Backend::all_to_all(Executor& executor, Group& group, Tensor tensor) {
  const std::string what = describe(tensor);
  require_same_device(group, executor, tensor, "all_to_all", what);
  const auto size = static_cast<std::uint64_t>(group.size());
  const std::uint64_t rows = tensor.shape().empty() ? 1 : tensor.shape()[0];
  if (rows % size != 0)
    throw Error(
        errc::invalid_argument, {},
        fmt::format("all_to_all of {}: dim 0 ({}) is not a multiple of the group's {} ranks", what, rows, size));
  Tensor out = Tensor::allocate(default_memory(executor.device()), tensor.dtype(), tensor.shape(),
                                executor.shared_stream(), "all_to_all");
  if (tensor.nbytes() == 0) return {std::move(out), Completion::ready_now()};
  auto keep = std::make_shared<std::pair<cuda::Tensor, cuda::Tensor>>(tensor, out);
  Completion done = run_collective(executor, group, "all_to_all", what, std::move(keep),
                                   [in = tensor.data(), result = out.data(), block = tensor.nbytes() / size,
                                    peers = group.size()](ncclComm_t comm, cudaStream_t stream, const char*& call) {
                                     // One send and one receive per peer (itself included), as one group: NCCL
                                     // schedules them together, so no pair of ranks waits on the other's order.
                                     call = "ncclGroupStart";
                                     ncclResult_t rc = ncclGroupStart();
                                     if (rc != ncclSuccess) return rc;
                                     for (int peer = 0; peer < peers; ++peer) {
                                       const std::size_t at = static_cast<std::size_t>(peer) * block;
                                       rc = ncclSend(in + at, block, ncclUint8, peer, comm, stream);
                                       if (rc != ncclSuccess && rc != ncclInProgress) {
                                         call = "ncclSend";
                                         (void)ncclGroupEnd();
                                         return rc;
                                       }
                                       rc = ncclRecv(result + at, block, ncclUint8, peer, comm, stream);
                                       if (rc != ncclSuccess && rc != ncclInProgress) {
                                         call = "ncclRecv";
                                         (void)ncclGroupEnd();
                                         return rc;
                                       }
                                     }
                                     call = "ncclGroupEnd";
                                     return ncclGroupEnd();
                                   });
  return {std::move(out), std::move(done)};
}

}  // namespace eredu::nccl
