#pragma once
/// \file
/// eredu::cuda::Event: an owned CUDA event (RAII), for ordering one stream after another on
/// the device (cudaStreamWaitEvent) without the host in between.

#include <cuda_runtime_api.h>

namespace eredu::cuda {

/// A timing-disabled CUDA event on one device, destroyed with the object. Move-only.
class Event {
 public:
  /// No event.
  Event() noexcept = default;
  /// Creates an event on `device` (cudaEventDisableTiming: cheaper to record and wait on).
  /// Throws BackendError naming cudaEventCreateWithFlags.
  explicit Event(int device);
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  /// Destroys the event (safe while a recorded wait is pending: CUDA defers the release).
  ~Event();

  /// Captures the work queued on `stream` so far. Throws BackendError.
  void record(cudaStream_t stream);
  /// Makes later work on `stream` wait for the captured work. Throws BackendError.
  void make_wait(cudaStream_t stream) const;
  /// True once the captured work has completed (cudaEventQuery); throws on a device error.
  bool query() const;
  /// The native handle.
  cudaEvent_t get() const noexcept { return event_; }
  /// True when the object owns an event.
  explicit operator bool() const noexcept { return event_ != nullptr; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace eredu::cuda
