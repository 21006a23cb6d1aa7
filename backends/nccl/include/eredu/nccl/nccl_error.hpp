#pragma once
/// \file
/// NCCL's results in eredu's words: the text of a failed NCCL call for the CollectiveError that
/// reports it ("ncclAllReduce failed: ncclInvalidUsage (invalid usage), NCCL error 5: <NCCL's
/// last message>"). Needs no device and no communicator.

#include <nccl.h>

#include <string>

namespace eredu::nccl {

/// The name of `result` ("ncclInvalidUsage"), or "ncclResult <n>" for a value NCCL does not define.
const char* result_name(ncclResult_t result) noexcept;

/// "<call> failed: <name> (<NCCL's text>), NCCL error <n>", followed by NCCL's last message
/// for `comm` (ncclGetLastError) when it has one; `comm` may be null.
std::string nccl_error_text(ncclResult_t result, const char* call, ncclComm_t comm = nullptr);

}  // namespace eredu::nccl
