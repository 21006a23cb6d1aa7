#pragma once
/// \file
/// eredu::retain_until_complete: keep a value alive exactly as long as the asynchronous work
/// that reads it (the seed's `retain_until_complete`), written once for every backend.
///
/// A lease retained by the copy that reads it is released when the copy's Completion fires,
/// never earlier (the pool cannot hand its bytes to another read under a running copy) and
/// never much later (the pool's memory comes back at once). Backends expose it as
/// `B::retain_until_complete(executor, completion, value)` (SubmissionBackend).

#include <exception>
#include <memory>
#include <utility>

#include "eredu/core/completion.hpp"

namespace eredu {

/// Keeps `value` alive until `completion` has finished (successfully or not), then destroys
/// it on the thread that completed it (see Completion::on_complete): a TBB worker, the CUDA
/// backend's relay thread — never a CUDA callback thread, so `value` may free CUDA memory.
/// If `completion` has already finished, `value` is destroyed before this returns.
template <class T>
void retain_until_complete(const Completion& completion, T value) {
  // Held through a pointer so that the handler stays small and movable whatever T is.
  auto held = std::make_unique<T>(std::move(value));
  completion.on_complete([held = std::move(held)](std::exception_ptr) mutable { held.reset(); });
}

}  // namespace eredu
