#include "eredu/mpi/backend.hpp"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "datatypes.hpp"
#include "eredu/core/error.hpp"
#include "eredu/engine/detail/gather_output.hpp"
#include "progress.hpp"

namespace eredu::mpi {
namespace {

constexpr std::uint64_t max_elements_per_request = std::uint64_t{1} << 30;

/// An MPI type of `unit` bytes and a count of them for `bytes` bytes, so that counts fit an int.
struct ByteBlocks {
  std::uint64_t unit = 1;
  int count = 0;
};

ByteBlocks byte_blocks(std::uint64_t bytes, const std::string& what) {
  std::uint64_t unit = 1;
  while (bytes / unit > static_cast<std::uint64_t>(INT_MAX) && unit < (std::uint64_t{1} << 20) &&
         bytes % (unit * 2) == 0)
    unit *= 2;
  if (bytes / unit > static_cast<std::uint64_t>(INT_MAX))
    throw Error(errc::invalid_argument, {},
                fmt::format("{}: {} bytes per rank cannot be counted in MPI ints (not a multiple of a power of two "
                            "that brings the count under 2^31)",
                            what, bytes));
  return {unit, static_cast<int>(bytes / unit)};
}

/// Starts a collective over `blocks` with `start(type, count)`; the type is freed at once
/// (MPI keeps it until the operations that use it complete).
template <class Start>
int with_block_type(const ByteBlocks& blocks, Start start) {
  if (blocks.unit == 1) return start(MPI_BYTE, blocks.count);
  MPI_Datatype type = MPI_DATATYPE_NULL;
  int rc = MPI_Type_contiguous(static_cast<int>(blocks.unit), MPI_BYTE, &type);
  if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&type);
  if (rc == MPI_SUCCESS) rc = start(type, blocks.count);
  if (type != MPI_DATATYPE_NULL) MPI_Type_free(&type);
  return rc;
}

void require_group(const Communicator& group, const char* operation) {
  if (!group.valid()) throw Error(errc::invalid_argument, {}, fmt::format("{} on an empty communicator", operation));
}

std::string describe(const cpu::Tensor& t) {
  return fmt::format("{} {}", dtype_name(t.dtype()), format_shape(t.shape()));
}

/// Submits `spec` on `group`, ordered after `executor`'s work, and orders the executor's later
/// work after it.
Completion submit_ordered(cpu::Executor& executor, Communicator& group, detail::OperationSpec spec) {
  spec.after = executor.fence();
  spec.watch_all = true;  // every one is a collective: a rank that exits dooms it
  Completion done = group.state()->progress->submit(group.state(), std::move(spec));
  executor.order_after(done);
  return done;
}

}  // namespace

std::pair<cpu::Tensor, Completion> Backend::all_reduce(Executor& executor, Group& group, Tensor tensor,
                                                       engine::ReduceOp op) {
  require_group(group, "all_reduce");
  const std::string what = fmt::format("{} ({})", describe(tensor), engine::reduce_op_name(op));
  const detail::ReduceType type = detail::reduce_type(tensor.dtype(), op, what);
  if (tensor.nbytes() == 0) return {std::move(tensor), Completion::ready_now()};
  const std::uint64_t count = tensor.nbytes() / type.element_bytes;
  detail::OperationSpec spec;
  spec.operation = "all_reduce";
  spec.what = what;
  spec.keep = std::make_shared<cpu::Tensor>(tensor);
  spec.start = [data = tensor.mutable_bytes().data(), count, type](MPI_Comm comm, std::vector<MPI_Request>& requests) {
    for (std::uint64_t at = 0; at < count; at += max_elements_per_request) {
      const auto n = static_cast<int>(std::min(max_elements_per_request, count - at));
      MPI_Request request = MPI_REQUEST_NULL;
      const int rc =
          MPI_Iallreduce(MPI_IN_PLACE, data + at * type.element_bytes, n, type.type, type.op, comm, &request);
      if (rc != MPI_SUCCESS) return rc;
      requests.push_back(request);
    }
    return MPI_SUCCESS;
  };
  Completion done = submit_ordered(executor, group, std::move(spec));
  return {std::move(tensor), std::move(done)};
}

namespace {

/// Gathers and exchanges: the same non-blocking call shape (equal blocks in and out), so one
/// spec builder; `start` is MPI_Iallgather or MPI_Ialltoall. `in_place`: the input is this
/// rank's block of `out` already, so MPI gets MPI_IN_PLACE (its send arguments are then ignored).
using ExchangeStart = int (*)(const void*, int, MPI_Datatype, void*, int, MPI_Datatype, MPI_Comm, MPI_Request*);
Completion submit_exchange(cpu::Executor& executor, Communicator& group, const char* operation, const std::string& what,
                           const cpu::Tensor& in_tensor, const cpu::Tensor& out, const ByteBlocks& blocks,
                           ExchangeStart start, bool in_place = false) {
  detail::OperationSpec spec;
  spec.operation = operation;
  spec.what = what;
  spec.keep = std::make_shared<std::pair<cpu::Tensor, cpu::Tensor>>(in_tensor, out);
  const void* in = in_place ? MPI_IN_PLACE : static_cast<const void*>(in_tensor.bytes().data());
  spec.start = [in, result = out.mutable_bytes().data(), blocks, start](MPI_Comm comm,
                                                                        std::vector<MPI_Request>& requests) {
    return with_block_type(blocks, [&](MPI_Datatype type, int count) {
      MPI_Request request = MPI_REQUEST_NULL;
      const int rc = start(in, count, type, result, count, type, comm, &request);
      if (rc == MPI_SUCCESS) requests.push_back(request);
      return rc;
    });
  };
  return submit_ordered(executor, group, std::move(spec));
}

/// The gather of `tensor` into `out` once both are checked: all_gather's and all_gather_into's
/// one path (an all_gather is a fresh output and this).
Completion gather_into(cpu::Executor& executor, Communicator& group, const char* operation, const cpu::Tensor& tensor,
                       const cpu::Tensor& out, const std::string& what, const ByteBlocks& blocks, bool in_place) {
  if (tensor.nbytes() == 0) return Completion::ready_now();
  return submit_exchange(executor, group, operation, what, tensor, out, blocks, MPI_Iallgather, in_place);
}

}  // namespace

std::pair<cpu::Tensor, Completion> Backend::all_gather(Executor& executor, Group& group, Tensor tensor) {
  require_group(group, "all_gather");
  const std::string what = describe(tensor);
  const ByteBlocks blocks = byte_blocks(tensor.nbytes(), what);
  Tensor out =
      Tensor::allocate(default_storage(), tensor.dtype(), engine::detail::gathered_shape(tensor.shape(), group.size()));
  Completion done = gather_into(executor, group, "all_gather", tensor, out, what, blocks, false);
  return {std::move(out), std::move(done)};
}

Completion Backend::all_gather_into(Executor& executor, Group& group, Tensor tensor, Tensor output) {
  require_group(group, "all_gather_into");
  const std::string what = describe(tensor);
  const ByteBlocks blocks = byte_blocks(tensor.nbytes(), what);
  const bool in_place = engine::detail::check_gather_output(
      "all_gather_into", {tensor.dtype(), tensor.shape(), tensor.bytes().data(), tensor.nbytes()},
      {output.dtype(), output.shape(), output.bytes().data(), output.nbytes()}, group.rank(), group.size());
  return gather_into(executor, group, "all_gather_into", tensor, output, what, blocks, in_place);
}

std::pair<cpu::Tensor, Completion> Backend::all_to_all(Executor& executor, Group& group, Tensor tensor) {
  require_group(group, "all_to_all");
  const std::string what = describe(tensor);
  const auto size = static_cast<std::uint64_t>(group.size());
  const std::uint64_t rows = tensor.shape().empty() ? 1 : tensor.shape()[0];
  if (rows % size != 0)
    throw Error(
        errc::invalid_argument, {},
        fmt::format("all_to_all of {}: dim 0 ({}) is not a multiple of the group's {} ranks", what, rows, size));
  const ByteBlocks blocks = byte_blocks(tensor.nbytes() / size, what);
  Tensor out = Tensor::allocate(default_storage(), tensor.dtype(), tensor.shape());
  if (tensor.nbytes() == 0) return {std::move(out), Completion::ready_now()};
  return {out, submit_exchange(executor, group, "all_to_all", what, tensor, out, blocks, MPI_Ialltoall)};
}

}  // namespace eredu::mpi
