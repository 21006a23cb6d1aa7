#pragma once
/// \file
/// CUDA stream work as an eredu::Completion.
///
/// How a completion finishes, and why this way: a stream callback (cudaStreamAddCallback)
/// is queued behind the work; when CUDA runs it, the callback only hands its CompletionSource
/// to the *relay*, a backend thread, and returns. The relay completes the source. Three
/// reasons:
///  * CUDA forbids CUDA calls inside stream callbacks, yet whatever a completion runs inline
///    (Completion::on_complete: releasing retained leases, dropping the last handle of device
///    memory, which frees it with cudaFreeAsync) may call CUDA. On the relay it may.
///  * Callbacks of every stream share one CUDA thread and block their stream while they run;
///    the relay keeps them to a queue push.
///  * A coroutine never resumes on either thread: Completion::async_wait posts the handler to
///    its own executor (the Asio loop).
/// cudaStreamAddCallback rather than cudaLaunchHostFunc: its callback receives the stream's
/// error status, so a device fault fails the completion (BackendError) instead of leaving it
/// pending forever. No thread ever blocks in cudaStreamSynchronize for this, and nothing polls.

#include <cuda_runtime_api.h>

#include <string>

#include "eredu/core/completion.hpp"

namespace eredu::cuda {

/// A completion for everything queued on `stream` so far. It fails with a BackendError naming
/// `what` (a tensor, an operation) when the stream reports an error. If the callback cannot
/// be queued, the returned completion has already failed with that error.
Completion stream_completion(cudaStream_t stream, const std::string& what = {});

namespace detail {

/// What a stream callback does: hands `source` and the stream's `status` to the relay
/// thread, which completes it (fails it with cuda_error(status, "stream work", what) when
/// status is not cudaSuccess). Makes no CUDA call. Exposed so that host-only tests can
/// exercise the relay without a device.
void relay_completion(CompletionSource source, cudaError_t status, std::string what) noexcept;

}  // namespace detail
}  // namespace eredu::cuda
