#pragma once
/// \file
/// eredu::cuda::Stream: an owned CUDA stream (RAII).

#include <cuda_runtime_api.h>

namespace eredu::cuda {

/// A non-blocking CUDA stream on one device, destroyed with the object. Move-only.
/// Non-blocking: it never serialises with the legacy default stream, so work of other
/// libraries on stream 0 does not stall a load.
class Stream {
 public:
  /// No stream (get() is nullptr, which CUDA would take as the default stream: never used).
  Stream() noexcept = default;
  /// Creates a stream on `device`. Throws BackendError naming cudaStreamCreateWithFlags.
  explicit Stream(int device);
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  /// Destroys the stream; work already queued still completes (CUDA's rule). Errors are
  /// swallowed: a destructor cannot report them.
  ~Stream();

  /// The native handle.
  cudaStream_t get() const noexcept { return stream_; }
  /// The device the stream belongs to.
  int device() const noexcept { return device_; }
  /// True when the object owns a stream.
  explicit operator bool() const noexcept { return stream_ != nullptr; }

 private:
  cudaStream_t stream_ = nullptr;
  int device_ = -1;
};

}  // namespace eredu::cuda
