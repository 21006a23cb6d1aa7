#pragma once
/// \file
/// eredu::python::read_into: a checkpoint's tensors read straight into memory the caller
/// already owns (a torch model's parameters), with no tensor of eredu's own in between — the
/// "no second copy" load of eredu.torch.load_model.
///
/// Each destination is the address and size of a tensor's whole, contiguous memory in its
/// stored dtype; the bytes go from the file (or the page cache) into it through the
/// checkpoint's reader (io::CheckpointSource::async_read_into), so a load peaks at the
/// model's own bytes: no staging lease, no fresh tensor. A bounded number of tensors are in
/// flight at once; a cancellation (Ctrl-C, task.cancel()) starts no more and fails once
/// those in flight have landed, so no read writes into the caller's memory after the
/// operation ends.

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint.hpp"
#include "operation.hpp"

namespace eredu::python {

/// One tensor's destination: `bytes` bytes of writable memory at `address`.
struct ReadIntoDestination {
  std::string key;           ///< the checkpoint's tensor name
  std::uintptr_t address{};  ///< first byte of the destination
  std::uint64_t bytes = 0;   ///< must be the tensor's stored size
};

/// Starts reading every destination's tensor whole into its memory (see file comment); the
/// operation's result is None. Errors (eredu::Error naming file, tensor and offset):
/// tensor_not_found, invalid_argument (a size that is not the tensor's, a closed
/// checkpoint), the reader's (io_error, unexpected_eof, file_changed), cancelled. The memory
/// must stay valid until the operation has finished.
std::shared_ptr<Operation> read_into(const std::shared_ptr<Checkpoint>& checkpoint,
                                     std::vector<ReadIntoDestination> destinations);

/// Registers eredu._native.read_into.
void bind_read_into(pybind11::module_& m);

}  // namespace eredu::python
