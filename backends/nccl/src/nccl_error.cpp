#include "eredu/nccl/nccl_error.hpp"

#include <fmt/format.h>

namespace eredu::nccl {

const char* result_name(ncclResult_t result) noexcept {
  switch (result) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "ncclResult (unknown)";
  }
}

std::string nccl_error_text(ncclResult_t result, const char* call, ncclComm_t comm) {
  // ncclGetErrorString needs no device and no communicator; ncclGetLastError with a null
  // communicator would report another communicator's (or the thread's) last error, so it is
  // asked only for the communicator concerned.
  const char* text = ncclGetErrorString(result);
  std::string message = fmt::format("{} failed: {} ({}), NCCL error {}", call, result_name(result), text ? text : "?",
                                    static_cast<int>(result));
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') message += fmt::format(": {}", last);
  }
  return message;
}

}  // namespace eredu::nccl
